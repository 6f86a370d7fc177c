"""core/residual_ebm.py on an enumerable toy: a base LM over a 3-word vocabulary with
continuations of 2 tokens (9 sequences, so log Z and the joint distribution are
exact), written directly in torch; the NCE loss by hand and Theorem 1; the log-Z
estimators' exact expectations against Theorem 2; the joint sampler (Algorithm 1)
against P_LM exp(-E) / Z in total variation; the share of unique n-grams (Figure 2
right) by hand."""
import itertools
import math

import pytest
import torch

from fairseq_ext.core.residual_ebm import (
    joint_log_prob,
    leave_one_out_log_mean_exp,
    log_z_estimates,
    nce_accuracy,
    nce_loss,
    perplexity,
    resample,
    resampling_weights,
)
from fairseq_ext.core.token_costs import unique_ngram_share

V, L = 3, 2
SEQS = list(itertools.product(range(V), repeat=L))  # the 9 continuations, in a fixed order


class ToyLM(torch.nn.Module):
    """P_LM(x1, x2 | prefix) = softmax(a)[x1] softmax(B[x1])[x2] (a bigram model)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = 0.5 * torch.randn(V, generator=g, dtype=torch.float64)
        self.b = 0.5 * torch.randn(V, V, generator=g, dtype=torch.float64)

    def log_prob(self, seqs: torch.Tensor) -> torch.Tensor:
        """seqs: (N, 2) -> (N,) log P_LM."""
        first = torch.log_softmax(self.a, 0)[seqs[:, 0]]
        second = torch.log_softmax(self.b, 1)[seqs[:, 0], seqs[:, 1]]
        return first + second

    def sample(self, n: int, g: torch.Generator) -> torch.Tensor:
        """n ancestral samples, (n, 2)."""
        x1 = torch.multinomial(torch.softmax(self.a, 0), n, replacement=True, generator=g)
        x2 = torch.multinomial(torch.softmax(self.b, 1)[x1], 1, generator=g).squeeze(1)
        return torch.stack([x1, x2], 1)


def toy_energy(seqs: torch.Tensor) -> torch.Tensor:
    """A fixed energy table E(x1, x2), (N, 2) -> (N,): spread of ~3 nats, so the
    joint model differs clearly from P_LM."""
    table = torch.tensor([[0.0, 1.5, -1.0], [2.0, -0.5, 0.5], [-1.5, 1.0, 0.0]], dtype=torch.float64)
    return table[seqs[:, 0], seqs[:, 1]]


@pytest.fixture(scope="module")
def toy():
    lm = ToyLM()
    seqs = torch.tensor(SEQS)
    log_p = lm.log_prob(seqs)
    energy = toy_energy(seqs)
    log_z = torch.logsumexp(log_p - energy, 0)
    return lm, seqs, log_p, energy, log_z


def multisets(k: int, n: int, log_p: torch.Tensor):
    """Every multiset of n draws from k outcomes, as (M, n) indices, with its
    multinomial log-probability (M,) under log_p: exact expectations over n i.i.d. samples."""
    idx = torch.tensor(list(itertools.combinations_with_replacement(range(k), n)))
    counts = torch.zeros(idx.size(0), k, dtype=torch.float64).scatter_add_(1, idx, torch.ones(idx.shape, dtype=torch.float64))
    log_coef = math.lgamma(n + 1) - torch.lgamma(counts + 1).sum(1)
    return idx, log_coef + (counts * log_p).sum(1)


# ---------------------------------------------------------------- NCE loss (eq. 3)


def test_nce_loss_hand_values():
    e_pos = torch.tensor([-1.0, 0.5], dtype=torch.float64)
    e_neg = torch.tensor([[2.0, 0.0], [1.0, -1.0]], dtype=torch.float64)

    def sp(x):  # softplus = -log sigma(-x)
        return math.log1p(math.exp(x))

    mean = [sp(-1.0) + (sp(-2.0) + sp(0.0)) / 2, sp(0.5) + (sp(-1.0) + sp(1.0)) / 2]
    total = [sp(-1.0) + sp(-2.0) + sp(0.0), sp(0.5) + sp(-1.0) + sp(1.0)]
    assert nce_loss(e_pos, e_neg).tolist() == pytest.approx(mean)
    assert nce_loss(e_pos, e_neg, "sum").tolist() == pytest.approx(total)
    # first value by hand: log(1 + e^-1) + (log(1 + e^-2) + log 2) / 2
    assert nce_loss(e_pos, e_neg)[0].item() == pytest.approx(0.31326 + (0.12693 + 0.69315) / 2, abs=1e-4)
    pos_ok, neg_ok = nce_accuracy(e_pos, e_neg)
    assert pos_ok.tolist() == [True, False]
    assert neg_ok.tolist() == [[True, False], [True, False]]


def test_nce_loss_rejects_bad_input():
    with pytest.raises(ValueError, match="neg_weighting"):
        nce_loss(torch.zeros(2), torch.zeros(2, 3), "max")
    with pytest.raises(ValueError, match="energy_neg"):
        nce_loss(torch.zeros(2), torch.zeros(3, 3))


@pytest.mark.parametrize("weighting,shift", [("mean", 0.0), ("sum", math.log(4))])
def test_nce_training_reaches_theorem_1(toy, weighting, shift):
    """A free energy table trained with sampled NCE (m = 4 negatives from P_LM per
    positive from P_data) converges to E = log P_LM - log P_data (Theorem 1), and
    with ``sum`` weighting to that plus log m. Tolerance 0.08 nats on every
    sequence: in the last 200 steps Adam moves each E by at most ~0.003 a step, so
    the stationary SGD noise is a few hundredths (measured: max deviation 0.017
    for both weightings), while a wrong weighting is off by log 4 = 1.39; every
    sequence has P_data, P_LM > 0.02, so it is seen ~40 times a batch of 2048."""
    lm, seqs, log_p, _, _ = toy
    g = torch.Generator().manual_seed(1)
    log_data = torch.log_softmax(torch.randn(len(SEQS), generator=g, dtype=torch.float64), 0)
    assert log_data.exp().min() > 0.02 and log_p.exp().min() > 0.02
    energy = torch.zeros(len(SEQS), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([energy], lr=0.1)
    m, batch = 4, 2048
    for step in range(600):
        if step == 400:
            opt.param_groups[0]["lr"] = 0.003
        pos = torch.multinomial(log_data.exp(), batch, replacement=True, generator=g)
        neg = torch.multinomial(log_p.exp(), batch * m, replacement=True, generator=g).view(batch, m)
        loss = nce_loss(energy[pos], energy[neg], weighting).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    target = log_p - log_data + shift
    assert (energy.detach() - target).abs().max().item() < 0.08
    if weighting == "mean":  # at the optimum the joint model is self-normalised
        assert torch.logsumexp(log_p - energy.detach(), 0).item() == pytest.approx(0.0, abs=0.05)


# ------------------------------------------------- log Z estimators (Theorem 2, eq. 4)


def test_leave_one_out_matches_direct_computation():
    x = torch.tensor([[0.3, -2.0, 50.0, 1.0], [-1e3, 0.0, 0.5, -0.5]], dtype=torch.float64)
    got = leave_one_out_log_mean_exp(x)
    for r in range(2):
        for i in range(4):
            rest = torch.cat([x[r, :i], x[r, i + 1:]])
            assert got[r, i].item() == pytest.approx((torch.logsumexp(rest, 0) - math.log(3)).item(), rel=1e-12)
    with pytest.raises(ValueError):
        leave_one_out_log_mean_exp(torch.zeros(3, 1))


def test_log_z_estimates_hand_values():
    e = torch.tensor([0.0, math.log(2.0), math.log(4.0)], dtype=torch.float64)  # w = 1, 1/2, 1/4
    lower, upper = log_z_estimates(e)
    t3 = math.log(1.75 / 3)
    t2 = (math.log(0.75 / 2) + math.log(1.25 / 2) + math.log(1.5 / 2)) / 3
    assert lower.item() == pytest.approx(t3)
    assert upper.item() == pytest.approx(5 * t3 - 4 * t2)
    # stable in log space: energies of -1000 would overflow exp
    lower, upper = log_z_estimates(e - 1000.0)
    assert lower.item() == pytest.approx(t3 + 1000.0) and upper.item() == pytest.approx(5 * t3 - 4 * t2 + 1000.0)


def exact_estimator_means(n, log_p, energy):
    """E[lower], E[upper] over n i.i.d. samples from P_LM, by enumerating every multiset."""
    idx, log_w = multisets(len(SEQS), n, log_p)
    lower, upper = log_z_estimates(energy[idx])
    w = log_w.exp()
    assert w.sum().item() == pytest.approx(1.0)
    return (w * lower).sum().item(), (w * upper).sum().item()


def test_theorem_2_exact_expectations_bracket_and_converge(toy):
    """Exact expectations (no Monte Carlo): E[T_n] < log Z < E[upper] for moderate
    n, both gaps shrink monotonically, and n * gap tends to Var(w) / (2 E[w]^2)
    (the 1/n term of Nowozin's expansion, Appendix A.2 eq. 9-10)."""
    _, _, log_p, energy, log_z = toy
    log_z = log_z.item()
    w = torch.exp(-energy)
    mean_w = (log_p.exp() * w).sum()
    c = ((log_p.exp() * (w - mean_w) ** 2).sum() / (2 * mean_w ** 2)).item()
    gaps = []
    for n in (2, 4, 6, 8, 10):
        lo, up = exact_estimator_means(n, log_p, energy)
        assert lo < log_z < up, (n, lo, log_z, up)
        gaps.append((n, log_z - lo, up - log_z))
    for (_, lo_a, up_a), (_, lo_b, up_b) in zip(gaps, gaps[1:]):
        assert lo_b < lo_a and up_b < up_a
    n, lo_gap, up_gap = gaps[-1]
    assert n * lo_gap == pytest.approx(c, rel=0.1)
    assert n * up_gap == pytest.approx(c, rel=0.1)
    assert lo_gap < 0.1 and up_gap < 0.1


def test_log_z_estimates_from_sampled_lm_converge(toy):
    """With the toy LM's own ancestral samples, both estimates, averaged over 400
    prefixes' worth of sample sets, approach the exact log Z as n grows."""
    lm, _, _, _, log_z = toy
    g = torch.Generator().manual_seed(3)
    errors = []
    for n in (4, 256):
        samples = lm.sample(400 * n, g).view(400, n, 2)
        energy = toy_energy(samples.view(-1, 2)).view(400, n)
        lower, upper = log_z_estimates(energy)
        errors.append(max(abs(lower.mean().item() - log_z.item()), abs(upper.mean().item() - log_z.item())))
    assert errors[1] < 0.02 < errors[0]


def test_joint_log_prob_and_perplexity_hand_values():
    # P_LM = 0.5, E = 1, Z = 0.8: log(0.5 e^-1 / 0.8)
    got = joint_log_prob(torch.tensor([math.log(0.5)]), torch.tensor([1.0]), torch.tensor([math.log(0.8)]))
    assert got.item() == pytest.approx(math.log(0.5 * math.exp(-1.0) / 0.8))
    assert perplexity(3 * math.log(0.25), 3) == pytest.approx(4.0)


# ------------------------------------------------------ joint sampler (Algorithm 1)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p - q).abs().sum().item()


def test_resampling_distribution_exact_tv_shrinks(toy):
    """The exact distribution of Algorithm 1's output (no top-k), by enumerating
    the n-sample sets: P(x) = E[sum_i [x_i = x] w_i / sum_j w_j]. Its total
    variation to P_LM exp(-E) / Z decreases with n, from TV(P_LM, joint) at n = 1."""
    _, _, log_p, energy, log_z = toy
    joint = torch.exp(log_p - energy - log_z)
    tvs = []
    for n in (1, 2, 4, 8):
        idx, log_w = multisets(len(SEQS), n, log_p)
        weights = resampling_weights(energy[idx])  # (M, n)
        dist = torch.zeros(idx.size(0), len(SEQS), dtype=torch.float64).scatter_add_(1, idx, weights)
        tvs.append(total_variation((log_w.exp()[:, None] * dist).sum(0), joint))
    assert tvs[0] == pytest.approx(total_variation(log_p.exp(), joint))
    assert tvs[0] > 0.2
    assert all(b < a for a, b in zip(tvs, tvs[1:])), tvs
    assert tvs[-1] < tvs[0] / 4


def test_joint_sampler_empirical_tv(toy):
    """Algorithm 1 run end to end on the toy LM (ancestral sampling, then resample):
    the empirical distribution of 20000 outputs approaches the joint model as n
    grows. The multinomial noise of a 9-bin histogram of 20000 draws has an
    expected TV of ~0.01, far below TV(P_LM, joint) (> 0.2)."""
    lm, seqs, log_p, energy, log_z = toy
    joint = torch.exp(log_p - energy - log_z)
    g = torch.Generator().manual_seed(5)
    runs = 20000
    tvs = {}
    for n in (1, 4, 64):
        samples = lm.sample(runs * n, g).view(runs, n, 2)
        e = toy_energy(samples.view(-1, 2)).view(runs, n)
        pick = resample(e, 1, generator=g).squeeze(1)
        chosen = samples[torch.arange(runs), pick]
        hist = torch.bincount(chosen[:, 0] * V + chosen[:, 1], minlength=len(SEQS)).double() / runs
        tvs[n] = total_variation(hist, joint)
    assert tvs[1] > 0.2
    assert tvs[64] < tvs[4] < tvs[1]
    assert tvs[64] < 0.04


def test_resample_outputs_and_validation():
    g = torch.Generator().manual_seed(0)
    e = torch.tensor([[0.0, 100.0, 100.0], [100.0, 100.0, 0.0]])
    assert resample(e, 5, generator=g).tolist() == [[0] * 5, [2] * 5]
    with pytest.raises(ValueError):
        resample(e, 0)


def test_unique_ngram_share_hand_values():
    """Figure 2 right's statistic, counted by hand on [1 2 1 2] and [1 2 3]:
    bigrams (1,2) (2,1) (1,2) | (1,2) (2,3): pooled 3 distinct of 5, within each
    2/3 and 2/2 (mean 5/6); trigrams (1,2,1) (2,1,2) | (1,2,3): 3 of 3; the only
    4-gram is in the first sequence (the second, too short, is left out)."""
    seqs = [[1, 2, 1, 2], [1, 2, 3]]
    assert unique_ngram_share(seqs, 2) == pytest.approx(3 / 5)
    assert unique_ngram_share(seqs, 2, pooled=False) == pytest.approx(5 / 6)
    assert unique_ngram_share(seqs, 3) == unique_ngram_share(seqs, 3, pooled=False) == 1.0
    assert unique_ngram_share(seqs, 4) == unique_ngram_share(seqs, 4, pooled=False) == 1.0
    # an n-gram shared by two sequences counts once when pooled, not within each
    same = [[5, 6, 7], [5, 6, 7]]
    assert unique_ngram_share(same, 3) == 0.5 and unique_ngram_share(same, 3, pooled=False) == 1.0
    assert unique_ngram_share([[4, 4, 4, 4]], 1) == 0.25
    assert unique_ngram_share([[1]], 2) == 1.0  # no n-grams: nothing repeats
    with pytest.raises(ValueError, match="n must be"):
        unique_ngram_share(seqs, 0)


def test_plotting_names_the_extra_when_matplotlib_is_missing(monkeypatch):
    import sys

    from fairseq_ext.evaluation.plotting import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'fairseq-ext\[plot\]'"):
        pyplot()
