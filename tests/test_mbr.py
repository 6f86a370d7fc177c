"""Minimum Bayes risk decoding, in process: the costs' n-gram statistics against sacrebleu,
reference aggregation against values computed by hand, the MBR choice against a brute-force
loop, pruning against exact MBR, and epsilon sampling against the truncated law of a small
model, enumerated."""
import itertools
import math
import random

import pytest
import torch

from fairseq_ext.core import mbr
from fairseq_ext.core.constraints import ParameterError
from fairseq_ext.core.sampling import filter_logits
from fairseq_ext.core.task_losses import build_task_loss

WORDS = "a man in a red shirt is riding his bike . the dog runs , on grass ! two women".split()


def random_sentence(rng, longest=12):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, longest)))


# ------------------------------------------------------------------ the costs' statistics


@pytest.mark.parametrize("spec,metric", [
    ("sbleu", lambda: __import__("sacrebleu").metrics.BLEU(effective_order=True)),
    ("sbleu(smooth_method=floor,smooth_value=0.1)",
     lambda: __import__("sacrebleu").metrics.BLEU(effective_order=True, smooth_method="floor", smooth_value=0.1)),
    ("chrf", lambda: __import__("sacrebleu").metrics.CHRF()),
    ("chrf(beta=1,word_order=2)", lambda: __import__("sacrebleu").metrics.CHRF(beta=1, word_order=2)),
])
def test_counted_once_statistics_give_sacrebleus_sentence_scores(spec, metric):
    """Every pair of 60 random sentences (empty ones included), sentences repeated across pairs
    as in a cost matrix: the cost is 1 - sacrebleu's sentence_score / 100, bit for bit."""
    rng = random.Random(0)
    sentences = [random_sentence(rng) for _ in range(60)]
    cost, reference = build_task_loss(spec), metric()
    hyps, refs = zip(*itertools.product(sentences, sentences))
    ours = cost(list(hyps), list(refs))
    theirs = torch.tensor([max(0.0, min(1.0, 1 - reference.sentence_score(h, [r]).score / 100))
                           for h, r in zip(hyps, refs)])
    assert torch.equal(ours, theirs)


def test_aggregated_bleu_and_chrf_by_hand():
    """Hypothesis "a b" against the references "a b" and "a c", each weighted 1/2.
    BLEU: expected counts a 1, b 1/2, c 1/2, (a b) 1/2, (a c) 1/2 and length 2; the hypothesis
    matches 1 + 1/2 of its 2 unigrams and 1/2 of its one bigram; no 3-gram (effective order 2):
    BLEU = sqrt(0.75 * 0.5). chrF (beta 2; the spaces removed: "ab" against "ab", "ac"): order 1
    precision = recall = 1.5 / 2, order 2 precision = recall = 0.5 / 1, orders 3-6 empty; the
    mean precision and recall are 0.625, and F_2 = 5 P R / (4 P + R) = 0.625."""
    bleu, chrf = build_task_loss("sbleu"), build_task_loss("chrf")
    assert bleu.aggregated_cost(["a b"], ["a b", "a c"]).item() == pytest.approx(1 - math.sqrt(0.75 * 0.5), abs=1e-6)
    assert chrf.aggregated_cost(["a b"], ["a b", "a c"]).item() == pytest.approx(1 - 0.625, abs=1e-6)
    # weights 3:1 for "a b": expected counts b 3/4, (a b) 3/4: BLEU = sqrt(0.875 * 0.75)
    assert bleu.aggregated_cost(["a b"], ["a b", "a c"], [3, 1]).item() == pytest.approx(
        1 - math.sqrt(0.875 * 0.75), abs=1e-6)


@pytest.mark.parametrize("spec", ["sbleu", "chrf", "chrf(beta=1,word_order=2)"])
def test_aggregating_one_reference_or_copies_of_it_is_that_reference(spec):
    rng = random.Random(1)
    cost = build_task_loss(spec)
    for _ in range(30):
        hyps = [random_sentence(rng) for _ in range(5)]
        ref = random_sentence(rng)
        pairwise = cost(hyps, [ref] * len(hyps))
        assert torch.allclose(cost.aggregated_cost(hyps, [ref]), pairwise, atol=1e-6)
        assert torch.allclose(cost.aggregated_cost(hyps, [ref, ref, ref]), pairwise, atol=1e-6)


def test_aggregation_is_not_the_mean_of_the_pairwise_costs():
    """A control: the aggregate is its own estimator (a hypothesis that shares n-grams with
    different references is scored otherwise than the mean of its pairwise scores)."""
    cost = build_task_loss("sbleu")
    refs = ["a man rides a bike", "a woman rides a horse"]
    hyp = ["a man rides a horse"]
    mean = cost(hyp * 2, refs).mean().item()
    assert abs(cost.aggregated_cost(hyp, refs).item() - mean) > 0.01


def test_an_embedding_cost_aggregates_the_mean_embedding():
    from user_costs import ReferenceEmbedding

    cost = ReferenceEmbedding()
    cost.setup(torch.device("cpu"))
    refs = [torch.tensor([5, 6, 7]), torch.tensor([8, 9]), torch.tensor([5, 5])]
    hyps = [torch.tensor([5, 6]), torch.tensor([9, 10, 11])]
    weights = [0.5, 0.25, 0.25]
    mean = sum(w * cost.encode(r) for w, r in zip(weights, refs))
    expected = torch.stack([1 - torch.nn.functional.cosine_similarity(cost.encode(h), mean, dim=0) for h in hyps])
    assert torch.allclose(cost.aggregated_cost(hyps, refs, weights), expected, atol=1e-6)
    assert not build_task_loss("edit").aggregatable
    with pytest.raises(NotImplementedError, match="no aggregated form"):
        build_task_loss("edit").aggregated_cost([[1]], [[1]])


# ------------------------------------------------------------------ the choice


def brute_force_choice(costs, weights):
    """The candidate of least expected cost, by explicit sums (the first of equals)."""
    best, best_risk = None, None
    for i in range(len(costs)):
        risk = sum(w * c for w, c in zip(weights, costs[i])) / sum(weights)
        if best_risk is None or risk < best_risk - 1e-12:
            best, best_risk = i, risk
    return best


def test_the_choice_is_the_brute_force_argmin_of_expected_cost():
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        h, r = int(torch.randint(1, 7, (1,), generator=gen)), int(torch.randint(1, 7, (1,), generator=gen))
        costs = torch.randint(0, 4, (h, r), generator=gen).double() / 3  # few values: ties happen
        weights = torch.randint(1, 5, (r,), generator=gen).double()
        order = mbr.ranking(mbr.bayes_risk(costs, weights))
        assert int(order[0]) == brute_force_choice(costs.tolist(), weights.tolist()), (costs, weights)


def test_enumerated_candidates_and_references_choose_the_consensus():
    """Candidates and references: every string of 1-3 words over {a, b}, references weighted
    by a known law; the choice is the brute-force argmin of 1 - chrF over all of them."""
    cost = build_task_loss("chrf")
    strings = [" ".join(w) for n in (1, 2, 3) for w in itertools.product("ab", repeat=n)]
    law = torch.tensor([2.0 ** -len(s.split()) * (3 if s.startswith("a") else 1) for s in strings])
    costs = torch.stack([cost([h] * len(strings), strings) for h in strings]).double()
    chosen = int(mbr.ranking(mbr.bayes_risk(costs, law))[0])
    assert chosen == brute_force_choice(costs.tolist(), law.tolist())
    assert strings[chosen].startswith("a")


def test_pruning_with_nothing_pruned_is_exact_mbr():
    """One step (the schedule reaches every reference at once): nothing can be pruned and the
    ranking is exact MBR's. Several steps at alpha 1 (a candidate goes only if it never wins a
    bootstrap resample): whenever every candidate survived, the ranking and risks are exact."""
    gen = torch.Generator().manual_seed(1)
    h, r, all_survived = 6, 24, 0
    for trial in range(50):
        costs = torch.rand(h, r, generator=gen, dtype=torch.float64) * 0.2 + torch.linspace(0.4, 0.41, h)[:, None]
        asked = []

        def columns(rows, start, stop):
            asked.append(stop)
            return costs[rows][:, start:stop]

        exact, risk = mbr.ranking(mbr.bayes_risk(costs)), mbr.bayes_risk(costs)
        one = mbr.prune(columns, h, r, [r], alpha=0.99, bootstrap=200, generator=torch.Generator().manual_seed(trial))
        assert torch.equal(one.survivors, exact) and torch.allclose(one.risk, risk[exact])
        asked.clear()
        out = mbr.prune(columns, h, r, [4, 8, 16], alpha=1.0, bootstrap=200,
                        generator=torch.Generator().manual_seed(trial))
        if len(out.survivors) == h:
            all_survived += 1
            assert torch.equal(out.survivors, exact) and torch.allclose(out.risk, risk[exact])
            assert asked == [4, 8, 16, 24]
        if int(exact[0]) in out.survivors.tolist():  # the exact choice survived: it is the choice
            assert out.survivors[0] == exact[0]
    assert all_survived >= 10


def test_pruning_drops_clear_losers_and_keeps_the_winner():
    """Candidate 0 costs 0.1 against every reference, the others 0.9 +- noise: after the first
    8 references only candidate 0 is left, and 8 x 6 entries were computed, not 6 x 24."""
    gen = torch.Generator().manual_seed(2)
    costs = 0.9 + 0.05 * torch.rand(6, 24, generator=gen, dtype=torch.float64)
    costs[0] = 0.1
    out = mbr.prune(lambda rows, a, b: costs[rows][:, a:b], 6, 24, [8, 16], alpha=0.99, bootstrap=100,
                    generator=torch.Generator().manual_seed(0))
    assert out.survivors.tolist() == [0] and out.steps == [8]
    assert out.evaluations == 8 * 6 and out.risk.item() == pytest.approx(0.1)


def test_pruning_options_are_checked():
    with pytest.raises(ParameterError, match="alpha must be in"):
        mbr.prune(lambda *a: None, 2, 2, [1], alpha=1.5)
    with pytest.raises(ParameterError, match="bootstrap must be >= 1"):
        mbr.prune(lambda *a: None, 2, 2, [1], bootstrap=0)
    assert mbr.schedule_of([16, 8, 64, 8], 32) == [8, 16, 32]


# ------------------------------------------------------------------ epsilon sampling


def test_epsilon_filter_by_hand():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda eps: filter_logits(logits, epsilon=eps).isfinite().tolist()[0]  # noqa: E731
    assert kept(0.1) == [True, True, True, False]
    assert kept(0.2) == [True, True, False, False]
    assert kept(0.9) == [True, False, False, False]  # the most probable token always stays
    assert kept(None) == [True] * 4
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ParameterError, match=r"epsilon must be in \(0, 1\)"):
            filter_logits(logits, epsilon=bad)


def _truncated_law(model, src, eps, eos, pad):
    """{(y1, y2): probability} of two-token outputs under epsilon sampling, from the model's full
    (teacher-forced) forward: step 1 without EOS (--min-len 1), step 2 with it; each step's
    distribution renormalised after the ban, cut below eps, renormalised again."""
    def step(prev, ban_eos):
        n = prev.size(0)
        out = model(src.expand(n, -1), torch.full((n,), src.size(1)), prev)
        lp = model.get_normalized_probs(out, log_probs=True)[:, -1].double()
        lp[:, pad] = -math.inf
        if ban_eos:
            lp[:, eos] = -math.inf
        p = lp.softmax(-1)
        keep = p >= eps
        keep[torch.arange(n), p.argmax(-1)] = True
        q = torch.where(keep, p, torch.zeros_like(p))
        return q / q.sum(-1, keepdim=True), p

    q1, p1 = step(torch.tensor([[eos]]), True)
    firsts = q1[0].nonzero().squeeze(1)
    q2, p2 = step(torch.stack([torch.tensor([eos, int(y)]) for y in firsts]), False)
    margin = min((p1 - eps).abs().min().item(), (p2 - eps).abs().min().item())
    law = {(int(y), int(z)): float(q1[0, y] * q2[i, z]) for i, y in enumerate(firsts) for z in q2[i].nonzero()[:, 0]}
    return law, margin


def _chi_square_p(counts, law, n):
    """p-value of Pearson's chi-square of ``counts`` against ``law`` (cells of expectation < 5
    pooled; draws outside the law's support make p 0)."""
    if any(cell not in law for cell in counts):
        return 0.0
    big = [c for c in law if law[c] * n >= 5]
    small = [c for c in law if law[c] * n < 5]
    observed = [counts.get(c, 0) for c in big] + ([sum(counts.get(c, 0) for c in small)] if small else [])
    expected = [law[c] * n for c in big] + ([sum(law[c] for c in small) * n] if small else [])
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.parametrize("path", ["static-cache", "fairseq"])
def test_epsilon_sampling_draws_the_truncated_law(untrained_models, path):
    """4,000 two-token samples of one source from a tiny transformer (its output layer scaled
    so that the law is peaked): chi-square against the enumerated truncated law, p > 0.001,
    and no draw outside its support; the control, plain sampling, fails the same test."""
    from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates

    task, model = untrained_models["transformer"]
    model = __import__("copy").deepcopy(model).eval()
    with torch.no_grad():
        model.decoder.output_projection.weight.mul_(12.0)
    d = task.target_dictionary
    src = torch.tensor([[d.index(w) for w in d.symbols[d.nspecial:d.nspecial + 5]] + [d.eos()]])
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([src.size(1)])}, "id": torch.tensor([0])}
    for eps in (0.05, 0.04, 0.06, 0.03, 0.08, 0.1):
        with torch.no_grad():
            law, margin = _truncated_law(model, src, eps, d.eos(), d.pad())
        if margin > 1e-4:
            break
    assert margin > 1e-4 and 3 <= len(law) <= 400, (len(law), margin)
    n = 4000

    def draws(epsilon):
        cfg = DecodeConfig(strategy="sample", num_candidates=n, epsilon=epsilon, max_len_a=0, max_len_b=2, path=path)
        cand = decode_candidates(model, sample, cfg, generator=torch.Generator().manual_seed(3))
        counts = {}
        for row in cand.as_list():
            key = tuple(row.tolist()) + ((d.eos(),) if len(row) == 1 else ())
            counts[key[:2]] = counts.get(key[:2], 0) + 1
        return counts

    assert _chi_square_p(draws(eps), law, n) > 1e-3
    assert _chi_square_p(draws(None), law, n) < 1e-6
