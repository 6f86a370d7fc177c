"""Criterions under fairseq's data-parallel wrappers (docs/distributed.md).

fairseq hands a criterion the wrapped model: ``ModuleProxyWrapper`` around torch's
``DistributedDataParallel`` (``--ddp-backend c10d`` / ``pytorch_ddp``, the default)
or around fairseq's ``LegacyDistributedDataParallel`` (``legacy_ddp`` / ``no_c10d``).
The legacy wrapper all-reduces the gradients after the backward pass, whatever
produced them. torch's DDP only reduces gradients whose backward pass follows a
call of the wrapper's ``forward`` (which arms its autograd hooks); a criterion
that decodes step by step through the decoder's incremental state (scheduled
sampling, soft beam search, candidate scoring) never calls it, so under ``c10d``
its gradients would stay local and the workers' parameters would drift apart.

``forward_in_wrapper(model, fn, *args)`` runs ``fn(module, *args)`` (``module``:
the fairseq model inside the wrappers) as the DDP wrapper's forward, so that the
gradient of whatever ``fn`` returns is averaged like that of an ordinary forward,
honouring ``no_sync`` under ``--update-freq``. Inside ``fn`` the module's own
calls are plain forwards. Without DDP, in evaluation mode or without gradients it
is just ``fn(module, *args)``.
"""
import torch
from torch.nn.parallel import DistributedDataParallel


def unwrap(model):
    """The fairseq model inside a data-parallel wrapper (parameters are shared)."""
    while hasattr(model, "module") and isinstance(getattr(model, "module"), torch.nn.Module):
        model = model.module
    return model


def torch_ddp(model):
    """torch's DistributedDataParallel among ``model``'s wrappers, or None."""
    while isinstance(model, torch.nn.Module):
        if isinstance(model, DistributedDataParallel):
            return model
        model = model.__dict__.get("_modules", {}).get("module")
    return None


def forward_in_wrapper(model, fn, *args):
    """``fn(module, *args)``, run as the forward of ``model``'s torch DDP wrapper if it has one."""
    module = unwrap(model)
    ddp = torch_ddp(model)
    if ddp is None or not module.training or not torch.is_grad_enabled():
        return fn(module, *args)

    def forward_once():
        del module.forward  # calls of module(...) inside fn are the model's own forward again
        return fn(module, *args)

    module.forward = forward_once
    try:
        return ddp()
    finally:
        module.__dict__.pop("forward", None)
