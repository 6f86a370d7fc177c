"""Continuous relaxations of discrete decoding decisions (Goyal thesis, ch. 3).

Pure PyTorch. ``scores`` are a decoder's output scores s(y) (logits or
log-probabilities: the peaked softmax is the same for both, the log-normaliser is
constant in y); entries may be -inf (forbidden outputs).

- ``peaked_softmax``: softmax(alpha s), the relaxation of argmax; alpha -> inf
  gives the one-hot argmax (no ties).
- ``gumbel_noise``: G_y = -log(-log U_y), U ~ Uniform(0, 1): argmax_y (s_y + G_y)
  is a sample from softmax(s) (the Gumbel-max trick).
- ``decision_embedding``: the embedding of the previous step's decision in the
  four modes of scheduled sampling (section 3.3.2):

  ========== ============================================ =====================
  mode        embedding fed to the next step               thesis
  ========== ============================================ =====================
  soft-argmax sum_y e(y) softmax(alpha s)(y)                e-bar, soft argmax
  soft-sample sum_y e(y) softmax(alpha (s + G))(y)          e-tilde, concrete
  hard-argmax e(argmax_y s(y))                              Bengio et al. (2015)
  hard-sample e(argmax_y (s(y) + G_y)) = e(y ~ softmax(s))  Bengio et al. (2015)
  ========== ============================================ =====================

  The soft modes are differentiable in s (credit assignment to earlier steps);
  the hard ones are not. With the same noise G, soft-sample tends to
  hard-sample and soft-argmax to hard-argmax as alpha -> inf.
"""
from typing import Optional

import torch
from torch import Tensor

DECISION_MODES = ("soft-argmax", "soft-sample", "hard-argmax", "hard-sample")


def peaked_softmax(scores: Tensor, alpha: float, dim: int = -1) -> Tensor:
    """softmax(alpha * scores) along ``dim``, in log space (any alpha > 0 and any
    score range is safe). Entries at -inf get weight 0; a slice that is -inf
    everywhere gets all-zero weights (no decision) instead of NaN, so that it
    cannot poison gradients of the other rows. Same shape as ``scores``."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    z = scores * alpha
    top = z.amax(dim=dim, keepdim=True).detach()
    top = top.masked_fill(~torch.isfinite(top), 0.0)
    e = torch.exp(z - top)
    return e / e.sum(dim=dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)


def gumbel_noise(
    shape, generator: Optional[torch.Generator] = None, device=None, dtype=torch.float32
) -> Tensor:
    """Standard Gumbel samples -log(-log U), U ~ Uniform(0, 1) (U kept inside
    (0, 1) so the result is finite)."""
    u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    tiny = torch.finfo(dtype).tiny
    u = u.clamp(tiny, 1.0 - torch.finfo(dtype).eps)
    return -torch.log(-torch.log(u))


def check_mode(mode: str) -> str:
    if mode not in DECISION_MODES:
        raise ValueError(f"unknown decision mode {mode!r}; choose from {DECISION_MODES}")
    return mode


def is_soft(mode: str) -> bool:
    """soft-argmax / soft-sample: differentiable in the scores."""
    return check_mode(mode).startswith("soft")


def is_sample(mode: str) -> bool:
    """soft-sample / hard-sample: perturb the scores with Gumbel noise."""
    return check_mode(mode).endswith("sample")


def decision_weights(scores: Tensor, mode: str, alpha: float, noise: Optional[Tensor] = None) -> Tensor:
    """Weights over the vocabulary of the decision in ``mode``: (..., V), rows sum
    to 1 (one-hot in the hard modes). ``noise``: Gumbel noise of the shape of
    ``scores``, required in the sample modes, ignored otherwise."""
    perturbed = _perturbed(scores, mode, noise)
    if is_soft(mode):
        return peaked_softmax(perturbed, alpha)
    return torch.nn.functional.one_hot(perturbed.argmax(dim=-1), scores.size(-1)).to(scores.dtype)


def decision_embedding(
    scores: Tensor, embed_weight: Tensor, mode: str, alpha: float, noise: Optional[Tensor] = None
) -> Tensor:
    """The embedding of the decision taken on ``scores`` (..., V) with the
    embedding matrix ``embed_weight`` (V, E); returns (..., E).

    Soft modes: ``decision_weights @ embed_weight`` (differentiable in the scores
    and in E). Hard modes: a row lookup of E at the (perturbed) argmax, with no
    gradient to the scores."""
    if is_soft(mode):
        weights = decision_weights(scores, mode, alpha, noise)
        return weights.to(embed_weight.dtype) @ embed_weight
    index = _perturbed(scores, mode, noise).argmax(dim=-1)
    return embed_weight[index]


def _perturbed(scores: Tensor, mode: str, noise: Optional[Tensor]) -> Tensor:
    if not is_sample(mode):
        return scores
    if noise is None:
        raise ValueError(f"mode {mode!r} needs Gumbel noise")
    if noise.shape != scores.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} != scores shape {tuple(scores.shape)}")
    return scores + noise.to(scores.dtype)
