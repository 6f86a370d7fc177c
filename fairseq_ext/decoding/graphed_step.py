"""Candidate decoding's step replayed from a CUDA graph.

On a GPU a small model's decoder step is launch-bound: a few hundred kernels of a few
microseconds each, and the CPU that launches them is the bottleneck. ``GraphedStep``
records one step of a capturable static-cache step (``decoder_step(...,
capturable=True)``: the same kernels on the same memory at every position) in a CUDA
graph and replays it for every later token: one launch per token instead of the
step's chain.

The recording follows PyTorch's documented protocol: the first step of a decode runs
eagerly on a side stream (it warms cuBLAS and the allocator up and is a real step), the
next one is recorded on that same stream (so no library handle is created while
recording; nothing runs while recording) and replayed, and every later one is
replayed with its tokens copied into the graph's input. A ``reorder`` (rows leaving the
caches) replaces the state tensors the graph reads, so the next step records again.
Under autocast (``--amp``) the recording runs with autocast's weight cache off, as
PyTorch requires for graphs. The recording prohibits unsafe CUDA calls in its own
thread only (``capture_error_mode="thread_local"``): fairseq's data loader pins batches
in a thread of its own meanwhile.

Automatic fallback, each said once in the log: where recording fails (an operator that
cannot be captured, a driver without graphs), or where the first replay in a process
differs from the eager step on the same state (compared once per process and kind of
step: class, dtype, parameter sets, autocast; logits and every state tensor, to float32
/ half tolerances), decoding goes on eagerly, for that kind of step from then on; nothing
is lost, the step that was being recorded is kept from its eager run. ``cuda_graphs="off"``
(the criteria's ``--mrt-cuda-graphs off`` and the like) never records.
"""
import contextlib
import inspect
import logging
from typing import Callable, Iterator, List, Optional

import torch
from torch import Tensor

logger = logging.getLogger(__name__)
_LOGGED = set()


def _say_once(key: str, message: str) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.info(message)


class CudaGraphRecorder:
    """Records a step in a CUDA graph on ``device`` (``record``) after an eager warm-up
    step (``warm``), both on one side stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def _on_side_stream(self) -> Iterator[None]:
        """Work on the side stream, ordered after the current stream's and before its next."""
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            current.wait_stream(self.stream)

    def warm(self, fn: Callable[[], Tensor]) -> Tensor:
        with self._on_side_stream():
            return fn()

    def record(self, fn: Callable[[Tensor], Tensor], example: Tensor, state: List[Tensor]) -> Callable[[Tensor], Tensor]:
        """A function of tokens that replays ``fn`` on them: ``fn``'s kernels on ``state``
        as they are, nothing run now. The result is a copy (the graph's own output is
        overwritten by the next replay)."""
        tokens = example.clone()
        graph = torch.cuda.CUDAGraph()
        # other threads (fairseq's pin-memory thread) may call CUDA meanwhile (torch >= 2.1 can allow it)
        mode = ({"capture_error_mode": "thread_local"}
                if "capture_error_mode" in inspect.signature(graph.capture_begin).parameters else {})
        # capture_begin / capture_end, not torch.cuda.graph: that context empties the allocator's
        # cache before every capture, which a training step would then refill from the driver
        with _autocast_without_cache(), self._on_side_stream():
            graph.capture_begin(**mode)
            try:
                out = fn(tokens)
            except BaseException:
                with contextlib.suppress(Exception):  # the step's own error is the one to report
                    graph.capture_end()
                raise
            graph.capture_end()

        def replay(new_tokens: Tensor) -> Tensor:
            tokens.copy_(new_tokens)
            graph.replay()
            return out.clone()
        return replay


def _autocast_without_cache():
    """Under autocast, autocast again with its cast-weight cache off (a cached cast made
    while recording would be freed under the graph); otherwise nothing."""
    if not torch.is_autocast_enabled():
        return contextlib.nullcontext()
    get_dtype = getattr(torch, "get_autocast_dtype", None)
    dtype = get_dtype("cuda") if get_dtype is not None else torch.get_autocast_gpu_dtype()
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)


def recorder_for(device: torch.device):
    """The recorder for steps on ``device``: CUDA graphs on a CUDA device, else None
    (nothing to record: CPU operators have no launch cost to save)."""
    return CudaGraphRecorder(device) if device.type == "cuda" else None


class GraphedStep:
    """``step`` and ``reorder`` of a capturable step (``inner``) for a decode of at most
    ``max_steps`` steps, the steps after the first replayed from a recording (module
    docstring). ``recorder``: ``warm(fn)`` runs fn eagerly, ``record(fn, tokens, state)``
    returns a function of tokens that replays fn without changing ``state`` now."""

    # the kinds of step (class, dtype, parameter sets, autocast) whose first replay in this process
    # was compared with its eager step, and those that failed to record or that check: eager from then on
    verified: set = set()
    failed: set = set()

    def __init__(self, inner, recorder, max_steps: int):
        if not getattr(inner, "capturable", False):
            raise ValueError("GraphedStep needs a capturable step (decoder_step(..., capturable=True))")
        self.inner, self.recorder, self.max_steps = inner, recorder, max_steps
        self.replay: Optional[Callable[[Tensor], Tensor]] = None
        self.off = False
        self.fed = 0  # steps taken

    def step(self, tokens: Tensor) -> Tensor:
        self.fed += 1
        if self.off:
            return self.inner.step(tokens)
        if self.replay is not None:
            return self.replay(tokens)
        if self.fed >= self.max_steps:  # the decode's last step: nothing left to replay
            return self.inner.step(tokens)
        kind = self.kind = (type(self.inner).__name__, self._state()[0].dtype, self.inner.groups,
                            torch.is_autocast_enabled())
        if kind in GraphedStep.failed:
            self.off = True
            return self.inner.step(tokens)
        check = kind not in GraphedStep.verified
        before = [t.clone() for t in self._state()] if check else None
        out = self.recorder.warm(lambda: self.inner.step(tokens))
        after = [t.clone() for t in self._state()] if check else None
        if check:  # back to the state before the step: its replay is compared with it
            self._load(before)
        try:
            self.replay = self.recorder.record(self.inner.step, tokens, self._state())
        except Exception as error:  # noqa: BLE001 - any failure to record: decode eagerly
            self._fall_back(f"recording the decoder step in a CUDA graph failed ({type(error).__name__}: "
                            f"{str(error).splitlines()[0] if str(error) else ''})", after)
            return out
        if check:
            problem = _difference(self.replay(tokens), out, self._state(), after)
            if problem is not None:
                self._fall_back(f"the decoder step replayed from a CUDA graph differs from the eager step ({problem})",
                                after)
                return out
            GraphedStep.verified.add(kind)
            _say_once("verified", "candidate decoding: the decoder step replayed from a CUDA graph "
                                  "(checked once against the eager step)")
        return out

    def reorder(self, index: Tensor) -> None:
        self.inner.reorder(index)
        self.replay = None  # the caches are new tensors: record again

    def _state(self) -> List[Tensor]:
        return [t for t in self.inner.state() if t is not None]

    def _load(self, values: List[Tensor]) -> None:
        for t, v in zip(self._state(), values):
            t.copy_(v)

    def _fall_back(self, why: str, after: Optional[List[Tensor]]) -> None:
        """Decode eagerly from now on (this kind of step, in this process); the state as the
        eager step left it."""
        self.off, self.replay = True, None
        GraphedStep.failed.add(self.kind)
        if after is not None:
            self._load(after)
        _say_once(why, f"candidate decoding: {why}; decoding without CUDA graphs from now on")


def _difference(got: Tensor, want: Tensor, state: List[Tensor], want_state: List[Tensor]) -> Optional[str]:
    """None where the replay's output and state equal the eager step's to the dtype's
    tolerance, else what differs."""
    pairs = [("logits", got, want)] + [(f"state tensor {i}", s, w) for i, (s, w) in enumerate(zip(state, want_state))]
    for name, a, b in pairs:
        if a.shape != b.shape:
            return f"{name}: shape {tuple(a.shape)} against {tuple(b.shape)}"
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return f"{name} differs"
            continue
        rtol, atol = (1e-4, 1e-5) if a.dtype in (torch.float32, torch.float64) else (1e-2, 1e-3)
        finite = torch.isfinite(b)
        if not torch.equal(finite, torch.isfinite(a)) or not torch.equal(a[~finite], b[~finite]):
            return f"{name}: infinities differ"
        if not torch.allclose(a[finite].float(), b[finite].float(), rtol=rtol, atol=atol):
            return f"{name}: max difference {(a[finite].float() - b[finite].float()).abs().max().item():.3g}"
    return None
