"""core/parameter_search.py: hand-computed weights and direction, limit cases in alpha, the exact
mixture density against torch.distributions, bitwise restoration, seeding."""
import math

import pytest
import torch
from torch.distributions import Normal

from fairseq_ext.core.constraints import ParameterError
from fairseq_ext.core.parameter_search import (
    ParameterSearch,
    ProposalConfig,
    clip_grad_,
    mgs_weights,
    mix_seed,
    noise_scales,
    weight_stats,
)


def _toy(seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(3, 2, generator=g), torch.randn(4, generator=g)]
    grads = [0.1 * torch.randn(3, 2, generator=g), 0.01 * torch.randn(4, generator=g)]
    return params, grads


def _flat(grads):
    """(one flat gradient, the tensors' sizes)."""
    return torch.cat([g.reshape(-1) for g in grads]), [g.numel() for g in grads]


def test_weights_and_direction_hand_computed():
    """2 parameters, 2 candidates (alternation: k=0 MLE, k=1 zero-mean), absolute sigma 0.1."""
    theta = [torch.tensor([1.0, 2.0])]
    g = [torch.tensor([0.5, -1.0])]
    cfg = ProposalConfig(num_candidates=2, alternate=True, noise=0.1, noise_scale="absolute", importance="none")
    search = ParameterSearch(theta, g, cfg, seed=42)
    assert search.is_mle == [True, False]
    eps = [torch.randn(2, generator=torch.Generator().manual_seed(mix_seed(42, k, 0))) for k in range(2)]
    delta0 = torch.tensor([-0.5, 1.0]) + 0.1 * eps[0]
    delta1 = 0.1 * eps[1]
    assert torch.allclose(search.piece(0, 0), delta0) and torch.allclose(search.piece(1, 0), delta1)
    # C(theta) = 1.0, C(theta + Delta) = [0.8, 0.9], alpha = 2: w0 = 1 / (1 + e^{-0.2})
    w = mgs_weights(1.0, torch.tensor([0.8, 0.9], dtype=torch.float64), torch.zeros(2), alpha=2.0)
    w0 = 1.0 / (1.0 + math.exp(-0.2))
    assert w[0].item() == pytest.approx(w0, abs=1e-12) and w[1].item() == pytest.approx(1 - w0, abs=1e-12)
    (direction,) = search.split(search.direction(w))
    assert torch.allclose(direction, w0 * delta0 + (1 - w0) * delta1, atol=1e-6)


def test_weights_include_minus_log_q():
    w = mgs_weights(0.0, torch.tensor([0.0, 0.0]), torch.tensor([0.0, math.log(3.0)]), alpha=1.0)
    assert w.tolist() == pytest.approx([0.75, 0.25])


def test_alpha_limits():
    costs = torch.tensor([0.7, 0.2, 0.5, 0.9])
    uniform = mgs_weights(1.0, costs, torch.zeros(4), alpha=1e-12)
    assert torch.allclose(uniform, torch.full((4,), 0.25, dtype=torch.float64))
    peaked = mgs_weights(1.0, costs, torch.zeros(4), alpha=1e6)  # log space: no overflow
    assert peaked.tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("pi", [0.5, 0.2])
def test_exact_log_q_equals_gaussian_mixture(pi):
    params, grads = _toy()
    cfg = ProposalConfig(num_candidates=3, mixture=pi, noise=0.5, importance="exact")
    search = ParameterSearch(params, grads, cfg, seed=7)
    sig = noise_scales(*_flat(grads), 0.5, "per_tensor")
    for k in range(3):
        delta = [search.piece(k, i) for i in range(2)]
        zero = sum(Normal(torch.zeros_like(d), s).log_prob(d).sum() for d, s in zip(delta, sig))
        mle = sum(Normal(-g, s).log_prob(d).sum() for d, g, s in zip(delta, grads, sig))
        expected = torch.logsumexp(torch.stack([math.log(pi) + zero, math.log(1 - pi) + mle]), 0)
        with search.perturbed(k) as info:
            pass
        assert info["log_q"] == pytest.approx(float(expected), abs=1e-4)
        assert info["norm"] == pytest.approx(float(torch.cat([d.view(-1) for d in delta]).norm()), rel=1e-6)


def test_unit_log_q_ignores_sigma():
    params, grads = _toy()
    cfg = ProposalConfig(num_candidates=1, mixture=0.5, noise=0.5, importance="unit")
    search = ParameterSearch(params, grads, cfg, seed=3)
    delta = [search.piece(0, i) for i in range(2)]
    d = sum(x.numel() for x in delta)
    sq0 = sum(float(x.pow(2).sum()) for x in delta)
    sq1 = sum(float((x + g).pow(2).sum()) for x, g in zip(delta, grads))
    c = -0.5 * d * math.log(2 * math.pi)
    expected = math.log(0.5 * math.exp(c - 0.5 * sq0) + 0.5 * math.exp(c - 0.5 * sq1))
    with search.perturbed(0) as info:
        pass
    assert info["log_q"] == pytest.approx(expected, abs=1e-6)


def test_perturbation_is_exact_and_restored_bitwise():
    params, grads = _toy()
    # values where (a + d) - d != a in floating point
    params[1] = torch.tensor([0.1, 1e8, -3.3333333, 7.0e-8])
    before = [p.clone() for p in params]
    cfg = ProposalConfig(num_candidates=4, noise=0.3)
    search = ParameterSearch(params, grads, cfg, seed=11)
    for k in range(4):
        with search.perturbed(k):
            for i, p in enumerate(params):
                assert torch.equal(p, before[i] + search.piece(k, i))
        for p, b in zip(params, before):
            assert torch.equal(p, b), "parameters must be restored bitwise"
    with pytest.raises(RuntimeError):
        with search.perturbed(0):
            raise RuntimeError("decoding failed")
    for p, b in zip(params, before):
        assert torch.equal(p, b), "restored even when the block raises"


def test_same_seed_same_update_and_components():
    params, grads = _toy()
    cfg = ProposalConfig(num_candidates=4)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    a = ParameterSearch(params, grads, cfg, seed=5).direction(w)
    b = ParameterSearch(params, grads, cfg, seed=5).direction(w)
    c = ParameterSearch(params, grads, cfg, seed=6).direction(w)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_component_sampling_rate_and_proposals():
    params, grads = _toy()
    draws = [c for s in range(500) for c in ParameterSearch(params, grads, ProposalConfig(num_candidates=4, mixture=0.3), s).is_mle]
    assert abs(sum(draws) / len(draws) - 0.7) < 0.04  # P(MLE component) = 1 - pi
    assert ParameterSearch(params, grads, ProposalConfig(num_candidates=4, proposal="zero"), 0).is_mle == [False] * 4
    assert ParameterSearch(params, grads, ProposalConfig(num_candidates=4, proposal="mle"), 0).is_mle == [True] * 4
    # zero-mean candidates have mean 0, MLE candidates mean -g (sigma tiny)
    s = ParameterSearch(params, grads, ProposalConfig(num_candidates=2, alternate=True, noise=1e-6), 0)
    assert torch.allclose(s.piece(0, 0), -grads[0], atol=1e-5) and s.piece(1, 0).abs().max() < 1e-5


@pytest.mark.parametrize("k,expected", [(4, [True, False, True, False]), (3, [True, False, True])])
def test_alternation_follows_the_published_code(k, expected):
    """The published perturb() (seq_level/gpt2/guided/utils.py) adds the gradient to
    candidate i when i % 2 == 0: the MLE component has the even candidates, so for
    odd K it has one more than the zero-mean component."""
    params, grads = _toy()
    assert ParameterSearch(params, grads, ProposalConfig(num_candidates=k, alternate=True), 0).is_mle == expected


def test_noise_scales_and_clip():
    grads = [torch.tensor([1.0, -3.0]), torch.tensor([0.5])]
    assert noise_scales(*_flat(grads), 2.0, "per_tensor") == pytest.approx([4.0, 1.0])
    assert noise_scales(*_flat(grads), 2.0, "global") == pytest.approx([2.0 * 4.5 / 3] * 2)
    assert noise_scales(*_flat(grads), 0.3, "absolute") == [0.3, 0.3]
    norm = clip_grad_(grads, 1.0)
    assert norm == pytest.approx(math.sqrt(10.25))
    assert math.sqrt(sum(float(g.pow(2).sum()) for g in grads)) == pytest.approx(1.0, abs=1e-5)


def test_bad_config():
    """The core names its parameters, not the command line's options."""
    with pytest.raises(ParameterError, match="^num_candidates must be >= 1, got 0$"):
        ProposalConfig(num_candidates=0)
    with pytest.raises(ParameterError, match=r"^mixture must be in \[0, 1\], got 1.5$"):
        ProposalConfig(mixture=1.5)
    with pytest.raises(ParameterError, match="^noise must be > 0, got 0.0$"):
        ProposalConfig(noise=0.0)
    with pytest.raises(ParameterError, match="^proposal must be one of"):
        ProposalConfig(proposal="nosuch")


def test_weight_stats():
    st = weight_stats(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), [True, False, True])
    assert st["weight_entropy"] == pytest.approx(math.log(2))
    assert st["mle_weight"] == pytest.approx(0.5)
    assert st["top_is_mle"] == 1.0


@pytest.mark.parametrize("cfg", [
    dict(),
    dict(importance="exact", noise=0.3),
    dict(importance="none", proposal="zero"),
    dict(proposal="mle", noise_scale="global"),
    dict(alternate=True, noise=0.2, noise_scale="absolute", importance="exact"),
], ids=["defaults", "exact", "none_zero", "mle_global", "alternate_absolute_exact"])
def test_stacked_candidates_equal_the_sequential_perturbations(cfg):
    """All K candidates at once (``stacked``, ``direction(lean=False)``; flat draws,
    segmented float64 sums) against one at a time (``perturbed``, ``direction(lean=True)``;
    per-tensor dot products): the same parameter values bitwise, log q and the norms to
    1e-6, the direction to 1e-6; the parameters untouched. A tensor without gradient (sigma 0
    under per-tensor scales) included."""
    g = torch.Generator().manual_seed(1)
    shapes = [(3, 2), (4,), (50, 40), (1,), (7, 3)]
    params = [torch.randn(s, generator=g) for s in shapes]
    grads = [0.05 * torch.randn(s, generator=g) for s in shapes]
    grads[3].zero_()
    before = [p.clone() for p in params]
    proposal = ProposalConfig(num_candidates=5, **cfg)
    search = ParameterSearch(params, grads, proposal, seed=9)
    stacked, infos = search.stacked()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert torch.equal(stacked[0], torch.cat([p.view(-1) for p in params]))
    for k, info in enumerate(infos):
        with search.perturbed(k) as want:
            assert torch.equal(stacked[k + 1], torch.cat([p.view(-1) for p in params]))
        assert info["log_q"] == pytest.approx(want["log_q"], rel=1e-6, abs=1e-6)
        assert info["norm"] == pytest.approx(want["norm"], rel=1e-6)
    w = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)
    flat = search.direction(w)
    assert torch.allclose(flat, search.direction(w, lean=True), rtol=1e-6, atol=1e-7)
    assert flat.abs().max().item() > 1e-3


def test_segment_sums_against_float64_sums():
    """Segments starting and ending inside rows, spanning rows, empty, shorter than a row,
    in the tail after the last full row: each sum within 5e-8 of its float64 sum, relative
    to the sum of magnitudes (float32 dot products of 500k squares: about 1e-6)."""
    from fairseq_ext.core.parameter_search import segment_sums

    g = torch.Generator().manual_seed(0)
    for sizes in ([5], [256], [300, 1, 0, 700, 256, 3], [200_000, 7, 4_000], [0, 10, 0]):
        x = torch.randn(sum(sizes), generator=g)
        for v in (x, x * x):
            want = torch.stack([t.double().sum() for t in v.split(sizes)])
            scale = torch.stack([t.double().abs().sum() for t in v.split(sizes)]).clamp(min=1e-30)
            got = segment_sums(v, sizes)
            assert got.dtype == torch.float64 and got.shape == (len(sizes),)
            assert ((got - want).abs() / scale).max().item() < 5e-8, sizes
