"""Risk estimators for the MGS baselines (MGS paper, section 3): minimum risk
training (eq. 6-7, Shen et al. 2016) and policy gradient / REINFORCE (eq. 5, 8).
Pure PyTorch; shapes (B, S): B inputs, S candidates each."""
from typing import Optional

import torch
from torch import Tensor


def mrt_risk(log_p: Tensor, costs: Tensor, alpha: float, mask: Optional[Tensor] = None) -> Tensor:
    """Expected cost under q(y) = p(y)^alpha / sum_{y' in S} p(y')^alpha (eq. 6).

    log_p: (B, S) log p_theta(y | x), differentiable; costs: (B, S), constants;
    mask: (B, S) bool, False for missing candidates. Returns (B,) risks. Its
    gradient is eq. 7: alpha (E_q[c grad log p] - E_q[c] E_q[grad log p]).
    """
    scores = alpha * log_p
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    q = torch.softmax(scores, dim=1)
    return (q * costs.to(q.dtype)).sum(dim=1)


def normalize_costs(costs: Tensor) -> Tensor:
    """Min-max normalise each row of (B, S) costs to [0, 1] (rows of equal costs -> 0)."""
    lo = costs.min(dim=1, keepdim=True).values
    hi = costs.max(dim=1, keepdim=True).values
    return (costs - lo) / (hi - lo).clamp(min=1e-6)


def reinforce_loss(log_p: Tensor, costs: Tensor, baseline: Tensor) -> Tensor:
    """Surrogate whose gradient is the REINFORCE estimator of grad E[c] (eq. 5, 8).

    log_p: (B, S) log p(y^(k) | x) of samples, differentiable; costs: (B, S);
    baseline: (B, 1) or scalar, independent of the samples. Returns (B,):
    mean_k (c_k - b) log p(y^(k)); minimising it lowers the expected cost.
    """
    advantage = (costs - baseline).detach().to(log_p.dtype)
    return (advantage * log_p).mean(dim=1)


class MovingAverageBaseline:
    """Lagged exponential moving average of the pooled cost: ``value`` is read before
    ``update`` adds the current batch, so the baseline never uses the current samples."""

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"baseline decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.value: Optional[float] = None

    def get(self) -> float:
        return 0.0 if self.value is None else self.value

    def update(self, mean_cost: float) -> None:
        self.value = mean_cost if self.value is None else self.decay * self.value + (1 - self.decay) * mean_cost
