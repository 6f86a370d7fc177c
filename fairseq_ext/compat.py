"""Compatibility shims between fairseq (0.12.2 / fairseq-fixed 0.12.3.1) and recent torch.

torch >= 2.6 loads files with ``weights_only=True`` by default, which rejects
fairseq checkpoints: they pickle ``argparse.Namespace`` and omegaconf configs.
fairseq reads checkpoints in two places: ``fairseq.checkpoint_utils.
load_checkpoint_to_cpu`` (``fairseq-generate --path``, ``fairseq-train`` resuming,
``--restore-file``, ``load_model_ensemble``) and, in data-parallel training, the
other ranks unpickle the state that rank 0 broadcasts
(``fairseq.distributed.utils._broadcast_object_slow``). We wrap those two
functions so that, while they run, torch loads with ``weights_only=False``,
exactly as fairseq did before torch 2.6. Nothing else in the process changes: a
``torch.load`` anywhere else keeps torch's safe default. A checkpoint is code;
load only checkpoints you trust.

Without the plugin, run fairseq with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``.
"""
import contextlib
import functools
import os
from typing import Callable, Iterator

_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextlib.contextmanager
def trusted_torch_load() -> Iterator[None]:
    """Within the block, ``torch.load`` defaults to ``weights_only=False``."""
    previous = os.environ.get(_ENV)
    os.environ[_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(_ENV, None)
        else:
            os.environ[_ENV] = previous


def _trusting(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with trusted_torch_load():
            return fn(*args, **kwargs)

    wrapper.__fairseq_ext_trusting__ = True
    return wrapper


def patch_checkpoint_loading() -> None:
    """Make fairseq's checkpoint loading work under torch >= 2.6 (idempotent)."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    for module, name in ((checkpoint_utils, "load_checkpoint_to_cpu"), (distributed_utils, "_broadcast_object_slow")):
        original = getattr(module, name, None)
        if original is not None and not getattr(original, "__fairseq_ext_trusting__", False):
            setattr(module, name, _trusting(original))
