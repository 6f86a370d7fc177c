"""core/risk.py: MRT risk and its gradient (eq. 6-7) by hand, the alpha limit, and
REINFORCE on an enumerable toy: the Monte Carlo gradient matches the exact one."""

import pytest
import torch

from fairseq_ext.core.risk import MovingAverageBaseline, mrt_risk, normalize_costs, reinforce_loss


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


def test_reinforce_matches_exact_gradient_on_enumerable_toy():
    """Three possible outputs, p = softmax(theta): the REINFORCE estimate of
    grad E_p[c] over many samples equals the exact gradient."""
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    c = torch.tensor([1.0, 0.2, 0.6], dtype=torch.float64)
    (exact,) = torch.autograd.grad((torch.softmax(theta, 0) * c).sum(), theta)
    g = torch.Generator().manual_seed(0)
    n = 40000
    draws = torch.multinomial(torch.softmax(theta.detach(), 0), n, replacement=True, generator=g)
    log_p = torch.log_softmax(theta, 0)[draws].view(1, n)
    baseline = torch.tensor([[0.5]], dtype=torch.float64)  # any constant baseline keeps it unbiased
    (mc,) = torch.autograd.grad(reinforce_loss(log_p, c[draws].view(1, n), baseline).sum(), theta)
    assert torch.allclose(mc, exact, atol=0.01), (mc, exact)


def test_normalize_costs_and_moving_baseline():
    out = normalize_costs(torch.tensor([[2.0, 4.0, 3.0], [1.0, 1.0, 1.0]]))
    assert out.tolist() == [[0.0, 1.0, 0.5], [0.0, 0.0, 0.0]]
    b = MovingAverageBaseline(decay=0.5)
    assert b.get() == 0.0  # nothing seen yet: no baseline
    b.update(1.0)
    assert b.get() == 1.0
    b.update(0.0)
    assert b.get() == 0.5
    with pytest.raises(ValueError, match="decay"):
        MovingAverageBaseline(decay=1.0)
