"""Criterions under fairseq's data-parallel training (docs/distributed.md): the one module
for the plugin's collectives (``all_reduce_sum_``, ``pooled_mean``) and for running a
criterion's own decoding under fairseq's DDP wrappers.

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
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` in place over the data-parallel workers when ``torch.distributed`` is
    initialized with more than one (a collective: every worker must call it); returns
    ``t``. A CPU tensor under the NCCL backend is reduced through a CUDA copy."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return t
    if dist.get_backend() == "nccl" and t.device.type != "cuda":
        on_gpu = t.cuda()
        dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
        return t.copy_(on_gpu)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def pooled_mean(costs: torch.Tensor) -> torch.Tensor:
    """Mean of ``costs`` pooled over all data-parallel workers.

    Each worker contributes (sum, count) of its elements (``all_reduce_sum_``); the
    result is sum / count, or 0 when no worker has any element. Every worker must
    call it.

    Args:
        costs: any shape, typically (B,); all elements are pooled. May be empty.

    Returns:
        0-dim tensor (detached, dtype and device of ``costs``).
    """
    return pooled_means(costs.reshape(1, -1))[0]


def pooled_means(costs: torch.Tensor) -> torch.Tensor:
    """``pooled_mean`` of every row of (G, N) ``costs`` in one all-reduce: (G,) detached."""
    costs = costs.detach()
    count = torch.full((1,), float(costs.size(1)), dtype=torch.float64, device=costs.device)
    pooled = all_reduce_sum_(torch.cat([costs.sum(dim=1, dtype=torch.float64), count]))
    total, count = pooled[:-1], float(pooled[-1])
    means = total / count if count > 0 else torch.zeros_like(total)
    return means.to(costs.dtype if costs.dtype.is_floating_point else torch.float32)


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
