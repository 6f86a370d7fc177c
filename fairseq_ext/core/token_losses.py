"""Token-level training losses. Pure PyTorch."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from fairseq_ext.core.constraints import at_least, between, check_arguments, declare


@declare(epsilon=between(0, 1, high_open=True))
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
    check_arguments(label_smoothed_nll, epsilon=epsilon)
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


def log_normalizers(logits: Tensor) -> Tensor:
    """log Z_t = logsumexp_y s_t(y) over the last dim (forbidden outputs at -inf
    contribute nothing): (...,) from logits (..., V)."""
    return torch.logsumexp(logits.float(), dim=-1)


@declare(lam=at_least(0))
def self_normalized_nll(logits: Tensor, target: Tensor, lam: float, ignore_index: Optional[int] = None
                        ) -> Tuple[Tensor, Tensor, Tensor]:
    """Self-normalisation by L2 regularisation of the local log-normaliser (Goyal
    thesis 5.3.1; Devlin et al. 2014): sum_t -log p(y*_t) + lam (log Z_t)^2.

    logits: (N, V) raw scores; target: (N,). Returns (loss, nll, log Z (N,)); both
    sums skip ``ignore_index`` positions (their log Z is returned as 0)."""
    check_arguments(self_normalized_nll, lam=lam)
    log_z = log_normalizers(logits)
    keep = torch.ones_like(log_z, dtype=torch.bool) if ignore_index is None else target.ne(ignore_index)
    log_z = log_z.masked_fill(~keep, 0.0)
    gold = logits.float().gather(-1, target.unsqueeze(-1)).squeeze(-1).masked_fill(~keep, 0.0)
    nll = (log_z - gold).sum()
    return nll + lam * (log_z ** 2).sum(), nll, log_z
