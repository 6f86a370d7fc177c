"""Residual energy-based language models (Deng et al., 2020): the conditional NCE
loss, log-partition estimators and importance resampling. Pure PyTorch.

The joint model (eq. 2) is P(x_{p+1..T} | x_{1..p}) = P_LM(.) exp(-E(x_{1..T})) / Z(x_{1..p}),
with Z = E_{x ~ P_LM}[exp(-E(x))]. Shapes: B prefixes, n (or m) continuations each.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_ext.core.constraints import OneOf, check_arguments, declare

NEG_WEIGHTINGS = ("mean", "sum")


@declare(neg_weighting=OneOf(NEG_WEIGHTINGS))
def nce_loss(energy_pos: Tensor, energy_neg: Tensor, neg_weighting: str = "mean") -> Tensor:
    """Conditional NCE loss of eq. 3 (negated, to minimise), one value per prefix.

    energy_pos: (B,) E(x_+) of the human continuation of each prefix.
    energy_neg: (B, m) E(x_-) of m base-LM continuations of the same prefix.
    neg_weighting: ``mean`` gives the m negatives a total weight of 1, equal to
        the positive's: -log sigma(-E_+) - (1/m) sum_j log sigma(E_-j). This is
        eq. 3 with each expectation estimated by its sample mean, and its optimum
        is Theorem 1's E = log P_LM - log P_data. ``sum`` weights every negative
        like the positive (a classifier with prior odds m : 1): its optimum is
        shifted to E = log P_LM - log P_data + log m and the negatives dominate
        the gradient as m grows.
    Returns (B,) losses; log sigma(-E) = -softplus(E).
    """
    check_arguments(nce_loss, neg_weighting=neg_weighting)
    if energy_neg.dim() != 2 or energy_neg.size(0) != energy_pos.size(0):
        raise ValueError(f"energy_neg must be (B, m) with B = {energy_pos.size(0)}, got {tuple(energy_neg.shape)}")
    neg = F.softplus(-energy_neg)
    neg = neg.mean(dim=1) if neg_weighting == "mean" else neg.sum(dim=1)
    return F.softplus(energy_pos) + neg


def nce_accuracy(energy_pos: Tensor, energy_neg: Tensor) -> Tuple[Tensor, Tensor]:
    """Classifier decisions of eq. 3: a sequence is called real when E < 0.

    Returns (B,) bool (positive correct: E_+ < 0) and (B, m) bool (negative
    correct: E_- > 0)."""
    return energy_pos < 0, energy_neg > 0


def log_mean_exp(x: Tensor, dim: int = -1) -> Tensor:
    """log (1/n) sum_i exp(x_i) along ``dim``, stably."""
    return torch.logsumexp(x, dim=dim) - math.log(x.size(dim))


def leave_one_out_log_mean_exp(x: Tensor) -> Tensor:
    """For every i, log (1/(n-1)) sum_{j != i} exp(x_j), along the last dim.

    x: (..., n) with n >= 2. Returns (..., n). Computed from forward and backward
    cumulative logsumexps (no subtraction of exponentials, so exact even when
    one term dominates), O(n).
    """
    n = x.size(-1)
    if n < 2:
        raise ValueError("leave-one-out needs n >= 2 samples")
    ninf = x.new_full(x.shape[:-1] + (1,), float("-inf"))
    fwd = torch.logcumsumexp(x, dim=-1)  # log sum_{j <= i}
    bwd = torch.logcumsumexp(x.flip(-1), dim=-1).flip(-1)  # log sum_{j >= i}
    before = torch.cat([ninf, fwd[..., :-1]], dim=-1)  # log sum_{j < i}
    after = torch.cat([bwd[..., 1:], ninf], dim=-1)  # log sum_{j > i}
    return torch.logaddexp(before, after) - math.log(n - 1)


def log_z_estimates(energy: Tensor) -> Tuple[Tensor, Tensor]:
    """Lower and upper estimates of log Z = log E_{P_LM}[exp(-E)] (Theorem 2, eq. 4).

    energy: (..., n), n >= 2 energies of continuations sampled from the
    (untruncated) base LM for the same prefix.
    lower: T_n = log (1/n) sum_i exp(-E_i); E[T_n] = log Z - Var(w)/(2 n E[w]^2) + o(1/n)
        with w = exp(-E) (Nowozin 2018), below log Z for large n.
    upper: (2n-1) T_n - 2(n-1) T_{n-1}, with T_{n-1} the mean of the n
        leave-one-out estimates (lower variance than one subset, same
        expectation); its expectation is log Z + Var(w)/(2 n E[w]^2) + o(1/n).
    Returns (lower, upper), each of shape (...).
    """
    n = energy.size(-1)
    t_n = log_mean_exp(-energy)
    t_n1 = leave_one_out_log_mean_exp(-energy).mean(dim=-1)
    return t_n, (2 * n - 1) * t_n - 2 * (n - 1) * t_n1


def joint_log_prob(lm_log_prob: Tensor, energy: Tensor, log_z: Tensor) -> Tensor:
    """log P(x_{p+1..T} | x_{1..p}) of the joint model (eq. 2): log P_LM - E - log Z."""
    return lm_log_prob - energy - log_z


def resampling_weights(energy: Tensor) -> Tensor:
    """Self-normalised importance weights exp(-s_i) / sum_j exp(-s_j) (Algorithm 1).
    energy: (..., n); returns (..., n)."""
    return torch.softmax(-energy, dim=-1)


def resample(energy: Tensor, num_outputs: int = 1, generator: Optional[torch.Generator] = None) -> Tensor:
    """Algorithm 1's resampling step: pick ``num_outputs`` of the n base-LM samples
    of each prefix with probability proportional to exp(-E), independently (with
    replacement, so every output is one exact run of Algorithm 1 on a shared set
    of n samples).

    energy: (B, n). Returns (B, num_outputs) LongTensor of indices into n.
    """
    if num_outputs < 1:
        raise ValueError(f"num_outputs must be >= 1, got {num_outputs}")
    probs = resampling_weights(energy.float())
    return torch.multinomial(probs, num_outputs, replacement=True, generator=generator)


def perplexity(log_prob_sum: float, num_tokens: int) -> float:
    """exp(-sum log p / M) from the summed natural-log probability of M tokens
    (the same number as the paper's 2^(-sum log2 p / M))."""
    return math.exp(-log_prob_sum / num_tokens)
