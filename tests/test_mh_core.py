"""Metropolis-Hastings kernels of fairseq_ext/core/mcmc.py on an enumerable toy:
a bidirectional 'masked LM' over V = 3 symbols and length 4 (81 sequences), whose
masked conditionals are inconsistent (they correspond to no joint distribution),
so the exact target p(y) ~ exp(-E(y) / T) differs from what degenerate Gibbs
sampling with the conditionals converges to."""
import itertools

import pytest
import torch

from fairseq_ext.core import mcmc

V, L, MASK = 3, 4, 3


class ToyMLM:
    """logit_t(w | y) = b[t, w] + sum_{s != t} A[t, s, y_s, w]; the mask symbol
    (index V) has its own rows of A, so a masked neighbour is informative too."""

    def __init__(self, seed=0, scale=0.7):
        g = torch.Generator().manual_seed(seed)
        self.b = torch.randn(L, V, generator=g) * scale
        self.A = torch.randn(L, L, V + 1, V, generator=g) * scale
        self.A[torch.arange(L), torch.arange(L)] = 0.0
        self.calls = 0
        self.rows = 0

    def __call__(self, tokens, owner, positions):
        self.calls += 1
        self.rows += tokens.size(0)
        n, p = positions.shape
        t = positions  # (N, P)
        s = torch.arange(L)
        # A[t, s, y_s, :] summed over s: (N, P, L, V)
        contrib = self.A[t[..., None], s[None, None, :], tokens[:, None, :]]
        return self.b[t] + contrib.sum(2)


def all_sequences():
    return torch.tensor(list(itertools.product(range(V), repeat=L)))


def exact_energies(model, energy):
    seqs = all_sequences()
    free = torch.ones_like(seqs, dtype=torch.bool)
    e_raw, e_local = mcmc.energies(model, seqs, free, torch.zeros(len(seqs), dtype=torch.long), MASK)
    return seqs, (e_raw if energy == "raw" else e_local)


def state_index(tokens):
    return (tokens * (V ** torch.arange(L - 1, -1, -1))).sum(1)


def tv(tokens, p):
    counts = torch.bincount(state_index(tokens), minlength=len(p)).double()
    return 0.5 * (counts / counts.sum() - p).abs().sum().item()


def iid_tv(p, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(p.float(), n, replacement=True, generator=g)
    return 0.5 * (torch.bincount(draws, minlength=len(p)).double() / n - p).abs().sum().item()


def run(model, cfg, chains=4000, seed=0, start=None, keep_history=True):
    tokens = torch.zeros(chains, L, dtype=torch.long) if start is None else start.expand(chains, L).clone()
    free = torch.ones(chains, L, dtype=torch.bool)
    owner = torch.zeros(chains, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    return mcmc.run_chains(model, tokens, free, owner, MASK, cfg, generator=g, keep_history=keep_history)


def test_energies_are_the_hand_computed_sums():
    model = ToyMLM()
    y = torch.tensor([[2, 0, 1, 1]])
    e_raw, e_local = mcmc.energies(model, y, torch.ones_like(y, dtype=torch.bool), torch.zeros(1, dtype=torch.long), MASK)
    raw = local = 0.0
    for t in range(L):
        masked = y.clone()
        masked[0, t] = MASK
        logit = model.b[t].clone()
        for s in range(L):
            logit += model.A[t, s, masked[0, s]]
        raw -= logit[y[0, t]].item()
        local -= torch.log_softmax(logit, -1)[y[0, t]].item()
    assert e_raw.item() == pytest.approx(raw, abs=1e-5)
    assert e_local.item() == pytest.approx(local, abs=1e-5)


def test_energies_use_one_batched_forward_and_skip_fixed_positions():
    model = ToyMLM()
    y = all_sequences()[:10]
    free = torch.ones_like(y, dtype=torch.bool)
    free[:, 0] = False  # e.g. BOS: not part of the energy
    e_raw, _ = mcmc.energies(model, y, free, torch.zeros(10, dtype=torch.long), MASK)
    assert model.calls == 1 and model.rows == 10 * (L - 1)
    e_all, _ = mcmc.energies(model, y, torch.ones_like(free), torch.zeros(10, dtype=torch.long), MASK)
    first = torch.stack([model.b[0][y[i, 0]] + sum(model.A[0, s, y[i, s], y[i, 0]] for s in range(1, L))
                         for i in range(10)])
    assert torch.allclose(e_all, e_raw - first, atol=1e-5)
    # chunking changes nothing
    e_chunked, _ = mcmc.energies(model, y, free, torch.zeros(10, dtype=torch.long), MASK, max_rows=7)
    assert torch.allclose(e_chunked, e_raw)


def test_proposal_log_q_and_acceptance_match_a_hand_computation():
    model = ToyMLM()
    y = torch.tensor([[2, 0, 1, 1]])
    block = torch.tensor([[False, True, False, True]])
    g = torch.Generator().manual_seed(3)
    prop = mcmc.propose(model, y, block, torch.zeros(1, dtype=torch.long), MASK, temperature=0.7, generator=g)
    assert (prop.tokens[~block] == y[~block]).all()
    masked = torch.tensor([[2, MASK, 1, MASK]])
    fwd = bwd = 0.0
    for t in (1, 3):
        logit = model.b[t] + sum(model.A[t, s, masked[0, s]] for s in range(L))
        log_q = torch.log_softmax(logit / 0.7, -1)
        fwd += log_q[prop.tokens[0, t]].item()
        bwd += log_q[y[0, t]].item()
    assert prop.log_q_fwd.item() == pytest.approx(fwd, abs=1e-5)
    assert prop.log_q_bwd.item() == pytest.approx(bwd, abs=1e-5)
    free = torch.ones_like(y, dtype=torch.bool)
    e_old, _ = mcmc.energies(model, y, free, torch.zeros(1, dtype=torch.long), MASK)
    e_new, _ = mcmc.energies(model, prop.tokens, free, torch.zeros(1, dtype=torch.long), MASK)
    log_a = mcmc.log_acceptance(e_old, e_new, prop.log_q_fwd, prop.log_q_bwd, target_temperature=0.8)
    hand = min(0.0, (e_old.item() - e_new.item()) / 0.8 + bwd - fwd)
    assert log_a.item() == pytest.approx(hand, abs=1e-5)


def test_acceptance_limits():
    z = torch.zeros(3)
    # downhill with a symmetric proposal: always accepted
    assert mcmc.log_acceptance(torch.tensor([5.0, 5.0, 5.0]), torch.tensor([1.0, 5.0, 9.0]), z, z).tolist() == \
        pytest.approx([0.0, 0.0, -4.0])
    # an impossible reverse move (outside the nucleus) is never accepted, without NaN
    out = mcmc.log_acceptance(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([-1.0]), torch.tensor([float("-inf")]))
    assert out.item() == float("-inf")
    with pytest.raises(ValueError, match="target temperature"):
        mcmc.log_acceptance(z, z, z, z, target_temperature=0.0)


def test_nucleus_and_forbidden_symbols_are_never_proposed():
    logits = torch.tensor([[[3.0, 2.0, 0.0, -1.0, 5.0]]])
    forbidden = torch.tensor([False, False, False, False, True])
    log_q = mcmc.proposal_log_probs(logits, temperature=1.0, top_p=0.7, forbidden=forbidden)
    assert torch.isinf(log_q[0, 0, 4]) and torch.isinf(log_q[0, 0, 2]) and torch.isinf(log_q[0, 0, 3])
    assert torch.logsumexp(log_q, -1).item() == pytest.approx(0.0, abs=1e-6)
    draws = mcmc.gumbel_draw(log_q.expand(5000, 1, 5), torch.Generator().manual_seed(0))
    assert set(draws.flatten().tolist()) == {0, 1}


def test_sweep_visits_every_free_position_once_per_epoch():
    g = torch.Generator().manual_seed(0)
    free = torch.tensor([[False, True, True, True, True, False], [False, True, True, False, False, False]])
    n_free = free.sum(1)
    for order in mcmc.ORDERS:
        o = mcmc.sweep_order(free, order, g)
        seen = torch.zeros_like(free, dtype=torch.long)
        for step in range(2):
            block = mcmc.block_at(o, n_free, step, 2)
            assert (block.sum(1) <= 2).all()
            seen += block.long()
        assert torch.equal(seen.bool(), free) and seen.max() == 1
    lr = mcmc.sweep_order(free, "left-to-right")
    assert lr[0, :4].tolist() == [1, 2, 3, 4]


def test_schedules():
    sizes = [mcmc.annealed_block_size(4, e, 7, True) for e in range(7)]
    assert sizes[0] == 4 and sizes[-1] == 1 and sizes == sorted(sizes, reverse=True)
    assert mcmc.annealed_block_size(4, 3, 7, False) == 4
    assert mcmc.annealed_target_temperature(1.0, 0.04, 10, 0.05) == pytest.approx(0.6)
    assert mcmc.annealed_target_temperature(1.0, 0.04, 100, 0.05) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="energy must be one of"):
        mcmc.MHConfig(energy="norm").check()
    with pytest.raises(ValueError, match="^block_size must be >= 1, got 0$"):
        mcmc.MHConfig(block_size=0).check()
    with pytest.raises(ValueError, match=r"^top_p must be in \(0, 1\], got 1.5$"):
        mcmc.MHConfig(top_p=1.5).check()


def test_rejected_proposals_keep_the_state_and_its_energy():
    """Start every chain at the global minimum of E_raw with a target temperature so
    low that any change is rejected: states and energies must never move, and no
    transition counts as novel."""
    model = ToyMLM()
    seqs, e = exact_energies(model, "raw")
    best = seqs[e.argmin()][None]
    cfg = mcmc.MHConfig(energy="raw", burn_in=0, epochs=3, target_temperature=1e-6, min_target_temperature=1e-6)
    out = run(model, cfg, chains=200, start=best)
    assert torch.equal(out.tokens, best.expand(200, L))
    assert torch.allclose(out.e_raw, e.min().expand(200))
    assert sum(n.sum().item() for n in out.stats.novel) == 0
    assert sum(a.sum().item() for a in out.stats.accepted) < sum(p.sum().item() for p in out.stats.proposals)


def test_near_zero_target_temperature_only_moves_downhill():
    model = ToyMLM(seed=1)
    cfg = mcmc.MHConfig(energy="local", burn_in=0, epochs=4, target_temperature=1e-6, min_target_temperature=1e-6)
    out = run(model, cfg, chains=300)
    energies = torch.stack(out.stats.e_local)
    assert (energies[1:] <= energies[:-1] + 1e-5).all()


def masked_conditional(model, y, t, temperature=1.0):
    """q_t(. | y without t) of the toy, computed from its parameters, (V,)."""
    masked = list(y)
    masked[t] = MASK
    logit = model.b[t] + sum(model.A[t, s, masked[s]] for s in range(L))
    return torch.softmax(logit.double() / temperature, -1)


def test_degenerate_gibbs_follows_its_exact_chain_law():
    """Degenerate Gibbs, left to right, one position at a time: an epoch is the
    product of the single-site kernels K_t(y -> y') = q_t(y'_t | y without t) (81 x 81
    matrices built here from the toy's parameters). After 1, 2 and 3 epochs from one
    state, 4000 chains are as close to that law as 4000 iid draws from it are, and
    the law is not p (the chains are not sampling the energy)."""
    model = ToyMLM()
    seqs = all_sequences()
    index = {tuple(y): i for i, y in enumerate(seqs.tolist())}
    epoch = torch.eye(len(seqs), dtype=torch.double)
    for t in range(L):
        K = torch.zeros(len(seqs), len(seqs), dtype=torch.double)
        for i, y in enumerate(seqs.tolist()):
            q = masked_conditional(model, y, t)
            for w in range(V):
                z = list(y)
                z[t] = w
                K[i, index[tuple(z)]] += q[w]
        epoch = epoch @ K
    law = torch.zeros(len(seqs), dtype=torch.double)
    law[0] = 1.0  # run() starts every chain at (0, 0, 0, 0)
    out = run(model, mcmc.MHConfig(kernel="gibbs", order="left-to-right", burn_in=0, epochs=3))
    _, e = exact_energies(model, "raw")
    p = torch.softmax(-e.double(), 0)
    for n, states in enumerate(out.history):
        law = law @ epoch
        bound = 1.5 * iid_tv(law, 4000, seed=n) + 0.02
        assert tv(states, law) < bound, (n, tv(states, law), bound)
    assert 0.5 * (law - p).abs().sum() > 0.1


EXACTNESS_CASES = [
    # energy, block size, anneal block, proposal temperature, target temperature
    ("raw", 1, False, 1.0, 1.0),
    ("local", 1, False, 1.0, 1.0),
    ("raw", 2, False, 1.0, 1.0),
    ("local", 4, True, 1.0, 1.0),
    ("raw", 1, False, 1.7, 1.0),
    ("local", 2, False, 0.6, 0.5),
]


@pytest.mark.parametrize("energy,block,anneal,q_temp,target_temp", EXACTNESS_CASES)
def test_mh_converges_to_the_exact_distribution(energy, block, anneal, q_temp, target_temp):
    """4000 chains from one state; after 30 epochs the empirical distribution of the
    states is as close to p ~ exp(-E/T) (enumerated) as 4000 iid exact draws are,
    up to a margin: the threshold is 1.5 x the TV of 4000 iid exact draws + 0.02 (that
    iid TV is 0.015-0.04 here; the initial TV is about 1 and the first epoch's 0.2-0.4).
    The TV must also shrink along the chain."""
    model = ToyMLM()
    _, e = exact_energies(model, energy)
    p = torch.softmax(-e.double() / target_temp, 0)
    cfg = mcmc.MHConfig(energy=energy, burn_in=0, epochs=30, block_size=block, anneal_block=anneal,
                        proposal_temperature=q_temp, target_temperature=target_temp)
    out = run(model, cfg)
    tvs = [tv(h, p) for h in out.history]
    bound = 1.5 * iid_tv(p, 4000) + 0.02
    assert tvs[-1] < bound, (tvs, bound)
    assert tvs[0] > tvs[-1] + 0.1, tvs


@pytest.mark.parametrize("energy,block,anneal,q_temp,target_temp", EXACTNESS_CASES)
def test_exact_distribution_is_stationary(energy, block, anneal, q_temp, target_temp):
    """Chains started from 4000 exact draws of p stay exact: after each of 6 epochs the
    TV stays within 1.5 x iid TV + 0.02 (a kernel that does not leave p invariant,
    e.g. degenerate Gibbs, drifts to TV 0.2-0.5 on this toy)."""
    model = ToyMLM()
    seqs, e = exact_energies(model, energy)
    p = torch.softmax(-e.double() / target_temp, 0)
    g = torch.Generator().manual_seed(11)
    start = seqs[torch.multinomial(p.float(), 4000, replacement=True, generator=g)]
    cfg = mcmc.MHConfig(energy=energy, burn_in=0, epochs=6, block_size=block, anneal_block=anneal,
                        proposal_temperature=q_temp, target_temperature=target_temp)
    out = mcmc.run_chains(model, start, torch.ones_like(start, dtype=torch.bool),
                          torch.zeros(4000, dtype=torch.long), MASK, cfg, generator=g, keep_history=True)
    bound = 1.5 * iid_tv(p, 4000) + 0.02
    assert max(tv(h, p) for h in out.history) < bound


def test_degenerate_gibbs_is_far_from_the_exact_distribution():
    """The same budget with every proposal accepted (Wang and Cho's Gibbs sampler with
    the masked conditionals) stays far from exp(-E_raw) and from exp(-E_local):
    the conditionals are inconsistent, so its stationary law is another one."""
    model = ToyMLM()
    out = run(model, mcmc.MHConfig(kernel="gibbs", burn_in=0, epochs=30), keep_history=False)
    for energy in mcmc.ENERGIES:
        _, e = exact_energies(model, energy)
        p = torch.softmax(-e.double(), 0)
        mh = run(model, mcmc.MHConfig(energy=energy, burn_in=0, epochs=30), keep_history=False)
        assert tv(out.tokens, p) > 3 * tv(mh.tokens, p), (energy, tv(out.tokens, p), tv(mh.tokens, p))


def test_chains_are_reproducible_from_the_generator():
    model = ToyMLM()
    cfg = mcmc.MHConfig(burn_in=1, epochs=2, block_size=2)
    a, b = run(model, cfg, chains=50, seed=5), run(model, cfg, chains=50, seed=5)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, run(model, cfg, chains=50, seed=6).tokens)


def nucleus_classes(model, top_p):
    """The closed classes of the single-site pure-nucleus chain over the 81 states,
    found by enumeration: y -> y' (differing at t) is possible iff y_t and y'_t are
    both in the nucleus of q_t(. | y without t), the context the two share (the
    smallest most-probable set whose mass reaches top_p). Moves are symmetric, so
    the classes are the connected components. Returns (81,) class ids."""
    seqs = all_sequences().tolist()
    index = {tuple(y): i for i, y in enumerate(seqs)}
    neighbours = [set() for _ in seqs]
    for i, y in enumerate(seqs):
        for t in range(L):
            q = masked_conditional(model, y, t).tolist()
            nucleus, mass = set(), 0.0
            for w in sorted(range(V), key=lambda w: -q[w]):
                if mass >= top_p:
                    break
                nucleus.add(w)
                mass += q[w]
            if y[t] in nucleus:
                for w in nucleus:
                    neighbours[i].add(index[tuple(y[:t] + [w] + y[t + 1:])])
    ids = [-1] * len(seqs)
    for i in range(len(seqs)):
        if ids[i] < 0:
            ids[i], stack = i, [i]
            while stack:
                for k in neighbours[stack.pop()]:
                    if ids[k] < 0:
                        ids[k] = i
                        stack.append(k)
    return torch.tensor(ids)


def test_pure_nucleus_is_reducible_and_the_mixture_reaches_p_from_any_start():
    """Toy seed 1 at top-p 0.8 splits into closed classes (the largest holds about 42%
    of p's mass; some states can never be left). Pure nucleus proposals (mix 0) then
    sample p restricted to the start's class: from a state of the largest class the
    TV to p stays above 1 - its mass, from an isolated state it stays 1. With the
    mixture (1 - eps) nucleus + eps full, eps = 0.5, both starts reach the TV of iid
    draws within 80 epochs (eps = 0.1 gets there too, more slowly: TV 0.14 and 0.04
    after 60 epochs)."""
    model = ToyMLM(seed=1)
    seqs, e = exact_energies(model, "raw")
    p = torch.softmax(-e.double(), 0)
    ids = nucleus_classes(model, 0.8)
    mass = torch.zeros(len(seqs), dtype=torch.double).index_add_(0, ids, p)
    largest, isolated = int(mass.argmax()), int((ids == torch.arange(len(seqs))).nonzero()[-1])
    assert 0.3 < mass[largest] < 0.6 and (ids == isolated).sum() == 1  # the regime the test is about
    bound = 1.5 * iid_tv(p, 4000) + 0.03
    for cls in (largest, isolated):
        start = seqs[(ids == cls).nonzero()[0, 0]][None]
        pure = run(model, mcmc.MHConfig(burn_in=0, epochs=30, top_p=0.8, nucleus_mix=0.0), start=start,
                   keep_history=False)
        reached = state_index(pure.tokens)
        assert (ids[reached] == cls).all()  # never left the class
        assert tv(pure.tokens, p) > 1 - mass[cls].item() - 0.01
        mixed = run(model, mcmc.MHConfig(burn_in=0, epochs=80, top_p=0.8, nucleus_mix=0.5), start=start,
                    keep_history=False)
        assert tv(mixed.tokens, p) < bound, (cls, tv(mixed.tokens, p), bound)


@pytest.mark.parametrize("mix", [0.1, 0.5])
def test_the_nucleus_mixture_leaves_p_invariant(mix):
    """Chains started from 4000 exact draws of p stay exact under the mixture proposal:
    the reverse probability must be computed under the same mixture (computing it
    under the nucleus or the full conditional alone drifts away from p)."""
    model = ToyMLM(seed=1)
    seqs, e = exact_energies(model, "local")
    p = torch.softmax(-e.double(), 0)
    g = torch.Generator().manual_seed(5)
    start = seqs[torch.multinomial(p.float(), 4000, replacement=True, generator=g)]
    cfg = mcmc.MHConfig(energy="local", burn_in=0, epochs=6, top_p=0.8, nucleus_mix=mix, block_size=2)
    out = mcmc.run_chains(model, start, torch.ones_like(start, dtype=torch.bool),
                          torch.zeros(4000, dtype=torch.long), MASK, cfg, generator=g, keep_history=True)
    bound = 1.5 * iid_tv(p, 4000) + 0.02
    assert max(tv(h, p) for h in out.history) < bound


def test_mixture_proposal_probabilities_by_hand():
    logits = torch.tensor([3.0, 2.0, 0.0, -1.0])
    q_full = torch.softmax(logits, -1)
    # nucleus 0.7: {0, 1} (mass before token 2 is 0.94 > 0.7)
    q_nucleus = torch.tensor([q_full[0], q_full[1], 0.0, 0.0]) / (q_full[0] + q_full[1])
    log_q = mcmc.proposal_log_probs(logits, top_p=0.7, nucleus_mix=0.2)
    assert torch.allclose(log_q.exp(), 0.8 * q_nucleus + 0.2 * q_full, atol=1e-6)
    # no nucleus: the mixture is the full conditional
    assert torch.allclose(mcmc.proposal_log_probs(logits, nucleus_mix=0.2).exp(), q_full, atol=1e-6)
    with pytest.raises(ValueError, match=r"^nucleus_mix must be in \[0, 1\)"):
        mcmc.MHConfig(nucleus_mix=1.0).check()


def test_annealing_to_the_floor_at_a_fraction_of_the_epochs():
    cfg = mcmc.MHConfig(burn_in=7, epochs=26, anneal_floor_at=0.5, min_target_temperature=0.05)
    temps = [cfg.target_temperature_at(e) for e in range(cfg.total_epochs)]
    # floor at epoch round(0.5 * 32) = 16: T = 1 - 0.95 * e / 16
    assert temps[0] == 1.0 and temps[8] == pytest.approx(0.525) and temps[16] == pytest.approx(0.05)
    assert temps[15] == pytest.approx(1 - 0.95 * 15 / 16) and temps[16:] == [pytest.approx(0.05)] * 17
    # the thesis's fixed decrements are unchanged
    assert mcmc.MHConfig(target_anneal=0.04).target_temperature_at(11) == pytest.approx(0.56)
    with pytest.raises(ValueError, match="^target_anneal and anneal_floor_at are two annealing schedules"):
        mcmc.MHConfig(target_anneal=0.02, anneal_floor_at=0.5).check()


def test_annealed_chains_find_the_mode_and_report_their_best_state():
    """Annealing to T = 0.05 over 70% of 30 epochs: the lowest-energy state visited
    is the enumerated global minimum of E_raw for nearly every chain, whereas at a
    constant T = 1 a chain's final state is the mode only about as often as p puts on
    it. Each reported best energy is the enumerated energy of its reported state."""
    model = ToyMLM(seed=2)
    seqs, e = exact_energies(model, "raw")
    mode = int(e.argmin())
    p_mode = torch.softmax(-e.double(), 0)[mode].item()
    annealed = run(model, mcmc.MHConfig(burn_in=0, epochs=30, anneal_floor_at=0.7), chains=500, keep_history=False)
    plain = run(model, mcmc.MHConfig(burn_in=0, epochs=30), chains=500, keep_history=False)
    hit = (state_index(annealed.best_tokens) == mode).double().mean().item()
    assert hit > 0.9 and hit > p_mode + 0.3, (hit, p_mode)
    assert (state_index(plain.tokens) == mode).double().mean().item() < p_mode + 0.1
    assert torch.allclose(annealed.best_energy, e[state_index(annealed.best_tokens)], atol=1e-5)
    assert annealed.stats.target_temperature[-1] == pytest.approx(0.05)
