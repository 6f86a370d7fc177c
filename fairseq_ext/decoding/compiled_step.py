"""The differentiable decoder step compiled by ``torch.compile``.

Decoding under gradients (scheduled sampling's exact left-to-right pass) runs one
differentiable step per target position, and each step is a chain of a few hundred small
operators forward and as many backward; on a GPU a small model's step is launch-bound.
``compiled_logits(step)`` returns the step's ``logits`` compiled by ``torch.compile``
(inductor, dynamic shapes): the pointwise operators between the matrix products, forward
and backward, are fused into a few kernels. The compiled function is one per process
and serves every step object, batch size and position: it is traced a few times (the
first position, whose caches are empty; the second, of size one; and the rest), each
trace a few seconds to minutes on a small CPU the first time in a process (inductor
keeps its kernels in its on-disk cache for later processes).

The compiled step is built without ``_CollectedWeight`` (whose backward state lives in
Python lists the compiler cannot trace): each position's weight gradients are their own
products in the compiled backward. Under dropout the masks come from inductor's random
number generator, so a run is reproducible from its seed but does not draw fairseq's
masks.

Automatic fallback: where compiling fails (no C++ compiler for inductor on the CPU, an
operator the compiler rejects), one log line gives the cause and the step runs eagerly,
for every step of the process from then on. A failure while compiling the backward
happens inside ``loss.backward()`` and is not caught.
"""
import logging
from typing import Callable, Optional

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

BACKEND = "inductor"  # torch.compile's backend (tests use lighter ones)
_compiled: dict = {}  # backend -> the compiled function
_failed: dict = {}  # backend -> the reason compiling failed


def _logits(step, tokens: Tensor, embeds: Optional[Tensor], replace: Optional[Tensor]) -> Tensor:
    return type(step).logits(step, tokens, embeds, replace)


def _reason(e: Exception) -> str:
    """The first line of what made the compiler fail (a backend's own error, not its wrapper)."""
    cause = getattr(e, "inner_exception", None) or e.__cause__ or e
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"


def compiled_logits(step) -> Callable[..., Tensor]:
    """``step.logits`` (a differentiable step built with ``compiled=True``) through the
    process's compiled function."""
    if step.collect:
        raise ValueError("a compiled step is built with compiled=True (its weights not collected)")

    def logits(tokens: Tensor, embeds: Optional[Tensor] = None, replace: Optional[Tensor] = None) -> Tensor:
        backend = BACKEND
        if backend not in _failed:
            fn = _compiled.get(backend)
            if fn is None:
                fn = _compiled[backend] = torch.compile(_logits, dynamic=True, backend=backend)
            try:
                return fn(step, tokens, embeds, replace)
            except torch._dynamo.exc.TorchDynamoException as e:  # compiling failed: nothing ran
                _failed[backend] = _reason(e)
                logger.warning(f"compiling the decoder step failed ({_failed[backend]}); the step runs eagerly "
                               "from now on")
        return _logits(step, tokens, embeds, replace)
    return logits
