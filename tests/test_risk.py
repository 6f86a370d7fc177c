"""core/risk.py: MRT risk and its gradient (eq. 6-7) by hand, the alpha limit, the
candidate set without repeats, the gradient scaling, and REINFORCE on an enumerable
toy: the Monte Carlo gradient matches the exact one, with a constant and with the
leave-one-out baseline."""

import pytest
import torch

from fairseq_ext.core.risk import (
    MovingAverageBaseline,
    distinct_mask,
    leave_one_out_baseline,
    mrt_risk,
    normalize_costs,
    reinforce_loss,
    scale_gradient,
)


def test_mrt_risk_hand_values():
    log_p = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64))
    costs = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    assert mrt_risk(log_p, costs, 1.0).item() == pytest.approx(0.6)
    assert mrt_risk(log_p, costs, 2.0).item() == pytest.approx((0.25 * 1 + 0.04 * 0.5) / 0.38)
    mask = torch.tensor([[True, True, False]])
    assert mrt_risk(log_p, costs, 1.0, mask).item() == pytest.approx(0.5 / 0.8)


def test_mrt_gradient_is_eq7():
    log_p = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)).requires_grad_()
    costs = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    alpha = 1.5
    mrt_risk(log_p, costs, alpha).sum().backward()
    q = torch.softmax(alpha * log_p.detach(), dim=1)
    expected = alpha * q * (costs - (q * costs).sum())  # d risk / d log p_k (eq. 7)
    assert torch.allclose(log_p.grad, expected)


def test_mrt_alpha_to_infinity_picks_the_mode():
    log_p = torch.log(torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64))
    costs = torch.tensor([[0.9, 0.1, 0.4]], dtype=torch.float64)
    assert mrt_risk(log_p, costs, 1e4).item() == pytest.approx(0.1)


def test_repeated_candidates_count_once():
    """Samples [a, b, a, c] of one input and [d, d] + [e, e] of two more: the set S of
    eq. 6 holds each sequence once, so q spreads over {a, b, c} with p(y)^alpha each;
    keeping the repeat would give a twice its share."""
    a, b, c, d, e = (torch.tensor(t) for t in ([4, 5, 2], [4, 2], [6, 2], [7, 2], [7, 7, 2]))
    mask = distinct_mask([a, b, a, c], 4)
    assert mask.tolist() == [[True, True, False, True]]
    assert distinct_mask([d, d, e, e], 2).tolist() == [[True, False], [True, False]]
    p = torch.tensor([[0.4, 0.1, 0.4, 0.2]], dtype=torch.float64)
    costs = torch.tensor([[0.5, 0.0, 0.5, 1.0]], dtype=torch.float64)
    # alpha = 0.5: q = sqrt(p) over {a, b, c} = (0.632, 0.316, 0.447) / 1.396
    qa, qb, qc = 0.4 ** 0.5, 0.1 ** 0.5, 0.2 ** 0.5
    expected = (0.5 * qa + 1.0 * qc) / (qa + qb + qc)
    assert mrt_risk(torch.log(p), costs, 0.5, mask).item() == pytest.approx(expected)
    assert mrt_risk(torch.log(p), costs, 0.5).item() != pytest.approx(expected)  # the multiset differs
    with pytest.raises(ValueError, match="groups of 3"):
        distinct_mask([a, b, a, c], 3)


def test_scale_gradient_keeps_the_value():
    x = torch.tensor([0.3, -1.2], dtype=torch.float64, requires_grad=True)
    y = scale_gradient((x ** 2).sum(), 200.0)
    assert y.item() == pytest.approx(0.09 + 1.44)
    y.backward()
    assert x.grad.tolist() == pytest.approx([200.0 * 0.6, 200.0 * -2.4])


def _exact_and_draws(n):
    """Three possible outputs, p = softmax(theta), costs c: the exact gradient of E_p[c]
    and n draws of (log p(y_k), c_k) as one input with n samples."""
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    c = torch.tensor([1.0, 0.2, 0.6], dtype=torch.float64)
    (exact,) = torch.autograd.grad((torch.softmax(theta, 0) * c).sum(), theta)
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(torch.softmax(theta.detach(), 0), n, replacement=True, generator=g)
    return theta, exact, torch.log_softmax(theta, 0)[draws].view(1, n), c[draws].view(1, n)


def test_reinforce_matches_exact_gradient_on_enumerable_toy():
    """The REINFORCE estimate of grad E_p[c] over many samples equals the exact
    gradient, with a constant baseline and with the leave-one-out baseline."""
    theta, exact, log_p, costs = _exact_and_draws(40000)
    constant = torch.tensor([[0.5]], dtype=torch.float64)  # any constant baseline keeps it unbiased
    for baseline in (constant, leave_one_out_baseline(costs)):
        (mc,) = torch.autograd.grad(reinforce_loss(log_p, costs, baseline).sum(), theta, retain_graph=True)
        assert torch.allclose(mc, exact, atol=0.01), (mc, exact)


def test_leave_one_out_baseline_is_unbiased_with_few_samples():
    """Four samples per input, 20000 inputs: the mean estimate with b_k = mean of the
    other three costs equals the exact gradient (a baseline that included c_k, e.g.
    the mean of all four, would shrink it by 3/4)."""
    theta, exact, log_p, costs = _exact_and_draws(80000)
    log_p, costs = log_p.view(-1, 4), costs.view(-1, 4)
    b = leave_one_out_baseline(costs)
    assert b[0].tolist() == pytest.approx([(costs[0].sum() - costs[0, k]).item() / 3 for k in range(4)])
    (mc,) = torch.autograd.grad(reinforce_loss(log_p, costs, b).mean(), theta, retain_graph=True)
    assert torch.allclose(mc, exact, atol=0.01), (mc, exact)
    (biased,) = torch.autograd.grad(reinforce_loss(log_p, costs, costs.mean(1, keepdim=True)).mean(), theta)
    assert torch.allclose(biased, 0.75 * exact, atol=0.01)
    with pytest.raises(ValueError, match="at least 2 samples"):
        leave_one_out_baseline(costs[:, :1])


def test_normalize_costs_and_moving_baseline():
    out = normalize_costs(torch.tensor([[2.0, 4.0, 3.0], [1.0, 1.0, 1.0]]))
    assert out.tolist() == [[0.0, 1.0, 0.5], [0.0, 0.0, 0.0]]
    b = MovingAverageBaseline(decay=0.5)
    assert b.value is None and b.state_dict() == {}  # nothing seen yet: no baseline
    b.update(1.0)
    assert b.value == 1.0
    b.update(0.0)
    assert b.value == 0.5
    resumed = MovingAverageBaseline(decay=0.5)
    resumed.load_state_dict(b.state_dict())
    resumed.update(0.25)
    assert resumed.value == 0.375
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\), got 1.0"):
        MovingAverageBaseline(decay=1.0)
