"""Minimum Bayes risk (MBR) choice over a cost matrix, and its confidence-based pruning.
Pure PyTorch.

For one input with H candidates h_i and R pseudo-references r_j (samples from the model,
with weights w_j summing to 1; uniform when each reference is one draw), the Bayes risk
of a candidate is its expected cost under the model,

    risk(h_i) = sum_j w_j C(h_i, r_j)          (C: any plugin cost; lower is better)

and MBR decoding outputs argmin_i risk(h_i) (Kumar & Byrne, 2004; Eikema & Aziz, 2020).
This is MRT's training objective, E_{y ~ p}[C(y, .)], evaluated at decoding time with the
model's samples in place of the reference. A cost that reads no reference (a quality
estimator, ``lm``) has one column: its risk is the cost itself (QE reranking).

Confidence-based pruning (Cheng & Vlachos, 2023, Algorithm 1) evaluates the matrix column
block by column block: after the first r_t references of a schedule, it draws B bootstrap
resamples of those r_t columns and keeps a candidate only if its mean cost is <= the
current best's in more than 1 - alpha of them; the survivors meet the next references.
The current best always survives; the last step uses every reference, so when nothing is
pruned the choice is exact MBR's.
"""
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch
from torch import Tensor

from fairseq_ext.core.constraints import at_least, between, check_arguments, declare


def bayes_risk(costs: Tensor, weights: Optional[Tensor] = None) -> Tensor:
    """risk (H,) of the (H, R) cost matrix: the mean over references, weighted by
    ``weights`` (R,) (normalised here; None: uniform)."""
    if costs.dim() != 2 or costs.size(1) == 0:
        raise ValueError(f"costs must be (H, R) with R >= 1, got shape {tuple(costs.shape)}")
    if weights is None:
        return costs.double().mean(dim=1)
    w = weights.double().to(costs.device)
    return costs.double() @ (w / w.sum())


def ranking(risk: Tensor) -> Tensor:
    """Candidate indices by increasing risk; equal risks keep their order (the first
    candidate wins a tie)."""
    return torch.sort(risk, stable=True).indices


@dataclass
class Pruned:
    """survivors: the candidate indices left after the last step, by increasing risk;
    risk: their risk over the references used (every reference, unless one candidate was
    left before the last step); evaluations: cost-matrix entries computed; steps: the
    references used at each step that ran."""

    survivors: Tensor
    risk: Tensor
    evaluations: int
    steps: List[int]


def schedule_of(schedule: Sequence[int], num_refs: int) -> List[int]:
    """The reference counts of the pruning steps: the schedule's values below ``num_refs``,
    increasing, then ``num_refs`` (the last step always uses every reference)."""
    steps = sorted({int(r) for r in schedule if 0 < int(r) < num_refs})
    return steps + [num_refs]


@declare(alpha=between(0, 1), bootstrap=at_least(1))
def prune(columns: Callable[[Tensor, int, int], Tensor], num_hyps: int, num_refs: int, schedule: Sequence[int],
          alpha: float = 0.99, bootstrap: int = 500, generator: Optional[torch.Generator] = None) -> Pruned:
    """Cheng & Vlachos's pruned MBR over H = ``num_hyps`` candidates and R = ``num_refs``
    references drawn i.i.d. from the model (equal weights).

    columns(rows, start, stop): the (len(rows), stop - start) costs of candidates ``rows``
    against references start..stop-1. schedule: reference counts of the steps
    (``schedule_of``). alpha: keep a candidate whose bootstrap win rate exceeds 1 - alpha
    (1: only candidates that never win go; 0: only the current best stays). Returns
    ``Pruned``.
    """
    check_arguments(prune, alpha=alpha, bootstrap=bootstrap)
    rows = torch.arange(num_hyps)
    costs = torch.zeros(num_hyps, 0, dtype=torch.float64)
    steps, evaluations, done = schedule_of(schedule, num_refs), 0, 0
    for step, r in enumerate(steps):
        block = columns(rows, done, r).double().reshape(len(rows), r - done)
        costs, done = torch.cat([costs, block], dim=1), r
        evaluations += block.numel()
        if step == len(steps) - 1:
            break
        best = int(ranking(costs.mean(dim=1))[0])
        resamples = torch.randint(r, (bootstrap, r), generator=generator)
        means = costs[:, resamples].mean(dim=2)  # (H', B)
        wins = (means <= means[best]).double().mean(dim=1)
        keep = wins > 1 - alpha
        keep[best] = True
        rows, costs = rows[keep], costs[keep]
        if len(rows) == 1:  # the choice is made
            break
    risk = costs.mean(dim=1)
    order = ranking(risk)
    return Pruned(rows[order], risk[order], evaluations, steps[:step + 1])
