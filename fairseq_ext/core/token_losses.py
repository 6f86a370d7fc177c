"""Token-level training losses. Pure PyTorch."""
from typing import Optional, Tuple

import torch
from torch import Tensor


def label_smoothed_nll(
    lprobs: Tensor, target: Tensor, epsilon: float = 0.0, ignore_index: Optional[int] = None
) -> Tuple[Tensor, Tensor]:
    """Summed label-smoothed NLL and summed NLL of ``target`` (N,) under ``lprobs``
    (N, V) log-probabilities.

    fairseq's ``label_smoothed_nll_loss`` formula, (1 - eps - eps_i) nll + eps_i
    sum_y (-log p(y)) with eps_i = eps / (V' - 1), except that V' and the sum run over
    the *allowed* outputs only (finite log-probability): a decoder that forbids
    outputs with -inf scores (the forced-length tagger) gets a finite loss that
    spreads the smoothing mass over what it can output. With every output allowed
    it equals fairseq's value. Positions whose target is ``ignore_index`` count 0.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {epsilon}")
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    keep = torch.ones_like(nll, dtype=torch.bool) if ignore_index is None else target.ne(ignore_index)
    nll = nll.masked_fill(~keep, 0.0)
    if epsilon == 0.0:
        total = nll.sum()
        return total, total
    allowed = torch.isfinite(lprobs)
    smooth = -lprobs.masked_fill(~allowed, 0.0).sum(-1)
    eps_i = epsilon / (allowed.sum(-1).to(lprobs.dtype) - 1.0).clamp_min(1.0)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return loss.masked_fill(~keep, 0.0).sum(), nll.sum()
