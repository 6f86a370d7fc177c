"""The steps decoded under gradients, compiled by ``torch.compile``.

Decoding under gradients (scheduled sampling's exact left-to-right pass, the soft beam's
search) runs one differentiable decoder step per position, and each step is a chain of a
few hundred small operators forward and as many backward; on a GPU a small model's step is
launch-bound. ``compiled_logits(step)`` returns the step's ``logits`` compiled by
``torch.compile`` (inductor, dynamic shapes), and ``compiled(fn, what)`` any function of
tensors (the soft beam's ``soft_beam_step``): the pointwise operators between the matrix
products, forward and backward, are fused into a few kernels. Each function is compiled
once per process and serves every step object, batch size and position: it is traced a few
times (the decoder step: the first position, whose caches are empty; the second, of size
one; and the rest), each trace seconds to minutes on a small CPU the first time in a
process (inductor keeps its kernels in its on-disk cache for later processes). Views among
the arguments are passed as tensors of their own (``_plain``), so that the traces do not
depend on the strides of what they are views of.

Experimental, off by default (``--dss-compile``, ``--soft-beam-compile``; docs/decoding.md).
The compiled step is built without ``core.collected_gradients`` (Python state the compiler
cannot trace). Under dropout the masks come from inductor's generator: a run is
reproducible from its seed but does not draw fairseq's masks.

Automatic fallback: where compiling fails (no C++ compiler for inductor on the CPU, an
operator the compiler rejects), one warning gives the cause and every compiled function
runs eagerly from then on. A failure while compiling a backward pass happens inside
``loss.backward()`` and is not caught.
"""
import logging
from typing import Callable, Optional

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

BACKEND = "inductor"  # torch.compile's backend (tests use lighter ones)
_compiled: dict = {}  # (backend, function) -> the compiled function
_failed: dict = {}  # backend -> the reason compiling failed


def _logits(step, tokens: Tensor, embeds: Optional[Tensor], replace: Optional[Tensor]) -> Tensor:
    return type(step).logits(step, tokens, embeds, replace)


def _reason(e: Exception) -> str:
    """The first line of what made the compiler fail (a backend's own error, not its wrapper)."""
    cause = getattr(e, "inner_exception", None) or e.__cause__ or e
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"


def _plain(args: tuple) -> list:
    """The tensor arguments as tensors of their own: views of others (a column of the tokens
    fed so far, rows of a product, the columns of a step's costs) would make the compiler guard
    on their bases' strides and offsets, which change at every position, and trace again for
    each. Other arguments as they are."""
    return [a.clone(memory_format=torch.contiguous_format)
            if isinstance(a, Tensor) and (a._base is not None or not a.is_contiguous()) else a for a in args]


def compiled(fn: Callable, what: str) -> Callable:
    """``fn`` through the process's one compiled version of it (``torch.compile``, dynamic
    shapes, compiled at the first call); ``what`` names it in the fallback's warning. Where
    compiling fails, ``fn`` itself, as every compiled function from then on."""
    def run(*args):
        backend = BACKEND
        if backend not in _failed:
            key = (backend, fn)
            if key not in _compiled:
                _compiled[key] = torch.compile(fn, dynamic=True, backend=backend)
            try:
                return _compiled[key](*_plain(args))
            except torch._dynamo.exc.TorchDynamoException as e:  # compiling failed: nothing ran
                _failed[backend] = _reason(e)
                logger.warning(f"compiling {what} failed ({_failed[backend]}); running without torch.compile "
                               "from now on")
        return fn(*args)
    return run


def compiled_logits(step) -> Callable[..., Tensor]:
    """``step.logits`` (a differentiable step built with ``compiled=True``) through the
    process's compiled function."""
    if step.collect:
        raise ValueError("a compiled step is built with compiled=True (its weights not collected)")
    run = compiled(_logits, "the decoder step")

    def logits(tokens: Tensor, embeds: Optional[Tensor] = None, replace: Optional[Tensor] = None) -> Tensor:
        return run(step, tokens, embeds, replace)
    return logits
