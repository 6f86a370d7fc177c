"""Risk estimators for the MGS baselines (MGS paper, section 3): minimum risk
training (eq. 6-7, Shen et al. 2016) and policy gradient / REINFORCE (eq. 5, 8).
Pure PyTorch; shapes (B, S): B inputs, S candidates each."""
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from fairseq_ext.core.constraints import between, check_arguments, declare


def mrt_risk(log_p: Tensor, costs: Tensor, alpha: float, mask: Optional[Tensor] = None) -> Tensor:
    """Expected cost under q(y) = p(y)^alpha / sum_{y' in S} p(y')^alpha (eq. 6).

    log_p: (B, S) log p_theta(y | x), differentiable; costs: (B, S), constants;
    mask: (B, S) bool, False for candidates outside the set S (missing, or a
    repeat of an earlier candidate: see ``distinct_mask``). Returns (B,) risks. Its
    gradient is eq. 7: alpha (E_q[c grad log p] - E_q[c] E_q[grad log p]).
    """
    q = mrt_distribution(log_p, alpha, mask)
    return (q * costs.to(q.dtype)).sum(dim=1)


def scale_gradient(x: Tensor, factor: float) -> Tensor:
    """``x`` in the forward pass, ``factor`` times its gradient in the backward pass.

    MRT divides its risk's gradient by alpha with it, so that alpha only shapes q:
    eq. 7 carries a factor alpha, which at Shen et al.'s alpha = 0.005 makes the risk
    gradient about 200 times smaller than at alpha = 1, and an MLE term of any
    familiar weight would drown it (docs/mgs.md, "Defaults and why")."""
    return x.detach() + factor * (x - x.detach())


def mrt_distribution(log_p: Tensor, alpha: float, mask: Optional[Tensor] = None) -> Tensor:
    """q = softmax(alpha log p) over each row's candidates where ``mask`` is True (eq. 6); (B, S)."""
    scores = alpha * log_p
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=1)


def distinct_mask(hyps: Sequence[Tensor], num_per_input: int) -> Tensor:
    """(B, S) bool: True for the first occurrence of each sequence among its input's
    S = ``num_per_input`` consecutive hypotheses, False for a repeat. With it the
    candidate set S of eq. 6 is a set, as in Shen et al. (2016) and Nematus: a
    sequence sampled twice counts once, with its own p(y)^alpha."""
    if num_per_input < 1 or len(hyps) % num_per_input:
        raise ValueError(f"{len(hyps)} hypotheses do not split into groups of {num_per_input}")
    keep = []
    for start in range(0, len(hyps), num_per_input):
        seen = set()
        for h in hyps[start:start + num_per_input]:
            key = tuple(h.tolist())
            keep.append(key not in seen)
            seen.add(key)
    return torch.tensor(keep, dtype=torch.bool).view(-1, num_per_input)


def normalize_costs(costs: Tensor) -> Tensor:
    """Min-max normalise each row of (B, S) costs to [0, 1] (rows of equal costs -> 0)."""
    lo = costs.min(dim=1, keepdim=True).values
    hi = costs.max(dim=1, keepdim=True).values
    return (costs - lo) / (hi - lo).clamp(min=1e-6)


def reinforce_loss(log_p: Tensor, costs: Tensor, baseline: Tensor) -> Tensor:
    """Surrogate whose gradient is the REINFORCE estimator of grad E[c] (eq. 5, 8).

    log_p: (B, S) log p(y^(k) | x) of samples, differentiable; costs: (B, S);
    baseline: (B, S), (B, 1) or scalar; b_k must not depend on sample k. Returns
    (B,): mean_k (c_k - b_k) log p(y^(k)); minimising it lowers the expected cost.
    """
    advantage = (costs - baseline).detach().to(log_p.dtype)
    return (advantage * log_p).mean(dim=1)


def leave_one_out_baseline(costs: Tensor) -> Tensor:
    """b_k = mean of the other S - 1 samples' costs of the same input (Kool et al.,
    2019, "Buy 4 REINFORCE samples, get a baseline for free!"): independent of
    sample k, so the estimator stays unbiased, and it needs no state. costs: (B, S),
    S >= 2. Returns (B, S)."""
    s = costs.size(1)
    if s < 2:
        raise ValueError(f"a leave-one-out baseline needs at least 2 samples per input, got {s}")
    return (costs.sum(dim=1, keepdim=True) - costs) / (s - 1)


@declare(decay=between(0, 1, high_open=True))
class MovingAverageBaseline:
    """Lagged exponential moving average of the pooled cost: ``value`` is read before
    ``update`` adds the current batch, so the baseline never uses the current samples.
    ``state_dict`` / ``load_state_dict`` carry it through a checkpoint."""

    def __init__(self, decay: float = 0.9):
        check_arguments(MovingAverageBaseline, decay=decay)
        self.decay = decay
        self.value: Optional[float] = None

    def update(self, mean_cost: float) -> None:
        self.value = mean_cost if self.value is None else self.decay * self.value + (1 - self.decay) * mean_cost

    def state_dict(self) -> Dict[str, float]:
        return {} if self.value is None else {"value": self.value}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.value = state.get("value")
