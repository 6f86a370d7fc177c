"""Continuous relaxation of beam search (Goyal thesis ch. 4): Algorithm 2, the
relaxed step, the soft reorder of fairseq incremental states, the alpha -> inf
limit against hard beam search (ours and fairseq's), gradients, local vs global
scores, and the criteria through fairseq-train."""
import argparse
import json
import math
import os

import pytest
import torch

from conftest import REPO, assert_shards_make_one_run, run_cli
from fairseq_ext.synthetic import tiny_models
from fairseq_ext.core.beam_relaxation import (
    continuous_topk_argmax,
    hamming_step_costs,
    hard_beam_step,
    open_length_hamming_costs,
    soft_beam_loss,
    soft_beam_step,
    soft_max_score,
)
from fairseq_ext.core.schedules import interpolated
from fairseq_ext.decoding.beam_search import local_scores, run_beam
from fairseq_ext.generators.beam_generator import BeamGenerator
from fairseq_ext.decoding.soft_inputs import SoftReorder

# ----------------------------------------------------------------- core


def test_continuous_topk_argmax_hand_values():
    s = torch.tensor([[3.0, 1.0], [2.0, 0.0]])  # K = 2 beams x V = 2 outputs
    p = continuous_topk_argmax(s, 2, 1.0)
    w1 = torch.exp(-torch.tensor([0.0, 4.0, 1.0, 9.0]))  # -(s - 3)^2
    w2 = torch.exp(-torch.tensor([1.0, 1.0, 0.0, 4.0]))  # -(s - 2)^2
    assert torch.allclose(p[0].flatten(), w1 / w1.sum()) and torch.allclose(p[1].flatten(), w2 / w2.sum())


def test_continuous_topk_argmax_tends_to_one_hot_topk():
    torch.manual_seed(0)
    s = torch.randn(4, 3, 7)
    flat_top = s.flatten(-2).topk(3, -1).indices
    target = torch.nn.functional.one_hot(flat_top, 21).float()
    gaps = [(continuous_topk_argmax(s, 3, a).flatten(-2) - target).abs().max().item() for a in (1, 100, 1e6)]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] > 0.1 and gaps[-1] < 1e-6


def test_forbidden_and_dead_entries_get_zero_weight_without_nans():
    s = torch.tensor([[[0.0, float("-inf")], [float("-inf"), float("-inf")]]], requires_grad=True)
    p = continuous_topk_argmax(s, 2, 5.0)  # only one finite candidate: element 2 is dead
    assert torch.equal(p[0, 1], torch.zeros(2, 2)) and p[0, 0, 0, 0] == 1.0
    step = soft_beam_step(torch.tensor([[0.0, float("-inf")]]), s, 5.0, 2)
    assert step.scores[0, 1] == float("-inf") and torch.isfinite(step.scores[0, 0])
    soft_beam_loss(step.scores, step.costs + 1.0, 5.0).sum().backward()
    assert torch.isfinite(s.grad).all()


def test_large_alpha_step_equals_the_hard_step():
    torch.manual_seed(1)
    beam = torch.randn(2, 3)
    local = torch.log_softmax(torch.randn(2, 3, 5), -1)
    costs, d = torch.rand(2, 3), torch.rand(2, 5)
    hard = hard_beam_step(beam, local, 3, costs, d)
    soft = soft_beam_step(beam, local, 1e8, 3, costs, d)
    assert torch.equal(soft.hard_backpointers, hard.hard_backpointers)
    assert torch.equal(soft.hard_outputs, hard.hard_outputs)
    assert torch.allclose(soft.scores, hard.scores, atol=1e-5) and torch.allclose(soft.costs, hard.costs, atol=1e-5)
    assert torch.allclose(soft.backpointers, hard.backpointers, atol=1e-6)


def _relaxed_beam_by_hand(f, d, k, alpha):
    """Algorithm 3 written out entry by entry from the thesis (float64, Python loops),
    for one sentence whose local scores do not depend on the history: f (T, k, V)
    f_t(j, w) for beam slot j, d (T, V) the step costs. Returns L (line 19)."""
    T, K, V = f.shape
    s = [0.0] + [float("-inf")] * (k - 1)
    D = [torch.zeros((), dtype=f.dtype)] * k
    for t in range(T):
        cand = [(s[j] + f[t, j, w], j, w) for j in range(K) for w in range(V) if s[j] != float("-inf")]
        m = sorted((c for c, _, _ in cand), key=lambda c: c.item(), reverse=True)[:k]
        new_s, new_D = [], []
        for i in range(k):
            e = [torch.exp(-alpha * (c - m[i]) ** 2) for c, _, _ in cand]
            z = sum(e)
            p = [x / z for x in e]
            new_s.append(sum(pi * c for pi, (c, _, _) in zip(p, cand)))
            new_D.append(sum(pi * (d[t, w] + D[j]) for pi, (_, j, w) in zip(p, cand)))
        s, D = new_s, new_D
    e = [torch.exp(alpha * (x - max(s, key=lambda c: c.item()))) for x in s]
    return sum(x * y for x, y in zip(e, D)) / sum(e)


def _relaxed_beam_loss(f, d, k, alpha):
    scores = torch.full((1, k), float("-inf"), dtype=f.dtype)
    scores[0, 0] = 0.0
    costs = torch.zeros(1, k, dtype=f.dtype)
    for t in range(f.size(0)):
        step = soft_beam_step(scores, f[t].unsqueeze(0), alpha, k, costs, d[t].unsqueeze(0))
        scores, costs = step.scores, step.costs
    return soft_beam_loss(scores, costs, alpha)[0]


def test_relaxed_recursion_equals_the_thesis_step_by_step_with_its_gradient():
    """Three relaxed steps (k = 2, V = 3) against Algorithm 3 written out entry by
    entry: same L, same dL/df (float64); and dL/df against central finite
    differences at a small alpha, where L is smooth."""
    g = torch.Generator().manual_seed(5)
    f = torch.randn(3, 2, 3, generator=g, dtype=torch.float64).requires_grad_()
    d = torch.rand(3, 3, generator=g, dtype=torch.float64)
    for alpha in (0.5, 3.0):
        ours = _relaxed_beam_loss(f, d, 2, alpha)
        (grad,) = torch.autograd.grad(ours, f)
        ref = _relaxed_beam_by_hand(f, d, 2, alpha)
        (ref_grad,) = torch.autograd.grad(ref, f)
        assert ours.item() == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
        assert torch.allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)
    eps, flat = 1e-6, f.detach().flatten()
    numeric = torch.empty_like(flat)
    for n in range(flat.numel()):
        plus, minus = flat.clone(), flat.clone()
        plus[n] += eps
        minus[n] -= eps
        numeric[n] = (_relaxed_beam_loss(plus.view_as(f), d, 2, 0.5)
                      - _relaxed_beam_loss(minus.view_as(f), d, 2, 0.5)) / (2 * eps)
    (grad,) = torch.autograd.grad(_relaxed_beam_loss(f, d, 2, 0.5), f)
    assert grad.abs().max() > 1e-3
    assert torch.allclose(grad.flatten(), numeric, rtol=1e-6, atol=1e-8)


def _hamming_padded(hyp, ref):
    """Hamming distance over max(len) positions, a missing position an error."""
    n = max(len(hyp), len(ref))
    return sum(1 for i in range(n) if i >= len(hyp) or i >= len(ref) or hyp[i] != ref[i])


def test_open_length_hamming_costs_sum_to_the_padded_hamming_distance():
    """Every hypothesis of up to 5 tokens over a 4-symbol vocabulary (0 = pad, 1 =
    EOS, ended by EOS, then padding) against references of 1-4 tokens: the summed
    step costs equal the Hamming distance over the longer of the two, counted
    directly; hypothesis-weighted costs too (c(w) per wrong or extra predicted w)."""
    import itertools

    pad, eos, steps = 0, 1, 5
    refs = [[eos], [2, eos], [3, 2, eos], [2, 2, 3, eos]]
    gold = torch.full((len(refs), 4), pad)
    for b, r in enumerate(refs):
        gold[b, : len(r)] = torch.tensor(r)
    weights = torch.tensor([1.0, 1.5, 2.0, 1.0])
    plain = open_length_hamming_costs(gold, steps, 4, eos, pad)
    weighted = open_length_hamming_costs(gold, steps, 4, eos, pad, weights)
    checked = 0
    for n in range(1, steps + 1):
        for body in itertools.product([2, 3], repeat=n - 1):
            hyp = list(body) + [eos]
            tokens = torch.tensor(hyp + [pad] * (steps - n))
            for b, r in enumerate(refs):
                got = plain[b, torch.arange(steps), tokens].sum().item()
                assert got == _hamming_padded(hyp, r), (hyp, r)
                wrong = sum(float(weights[w]) for i, w in enumerate(hyp) if i >= len(r) or r[i] != w)
                missing = max(0, len(r) - len(hyp))
                assert weighted[b, torch.arange(steps), tokens].sum().item() == pytest.approx(wrong + missing)
                checked += 1
    assert checked == 4 * 31


def test_hamming_costs_and_max_score_hand_values():
    d = hamming_step_costs(torch.tensor([[2, 0, 1]]), 3, torch.tensor([1.0, 2.0, 1.0]), ignore_index=1)
    assert d.tolist() == [[[1.0, 2.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 0.0]]]
    s = torch.tensor([[0.0, math.log(3.0)]])
    assert soft_max_score(s, 1.0).item() == pytest.approx(0.75 * math.log(3.0))
    assert soft_beam_loss(s, torch.tensor([[4.0, 8.0]]), 1.0).item() == pytest.approx(7.0)


def test_alpha_schedules_equal_their_formulas():
    assert interpolated("fixed", 1.0, 100.0, 50, 100) == 1.0
    assert interpolated("linear", 1.0, 101.0, 50, 100) == pytest.approx(51.0)
    assert interpolated("exponential", 1.0, 100.0, 50, 100) == pytest.approx(10.0)
    assert interpolated("exponential", 1.0, 100.0, 500, 100) == pytest.approx(100.0)


# ----------------------------------------------------------------- models


@pytest.fixture(scope="module")
def tagger(conll, cache):
    """A tagging_lstm_tiny trained a little with CE (so its decisions are not ties)."""
    task, model, _ = tiny_models.build_task_and_model(conll, "sequence_tagging", "tagging_lstm",
                                                      ["--tagging-cache-dir", cache])
    task.load_dataset("train")
    ds = task.dataset("train")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(30):
        sample = ds.collater([ds[i] for i in range((step * 16) % 180, (step * 16) % 180 + 16)])
        lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True).clamp_min(-1e4)
        loss = -lprobs.gather(-1, sample["target"].unsqueeze(-1)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    task.load_dataset("test")
    test = task.dataset("test")
    return task, model, test.collater([test[i] for i in range(12)])


@pytest.fixture(scope="module")
def translators(toy_bin):
    out = {}
    for arch in ("transformer", "lstm"):
        task, model, _ = tiny_models.build_task_and_model(toy_bin, "translation", arch)
        task.load_dataset("valid")
        ds = task.dataset("valid")
        out[arch] = (task, model.eval(), ds.collater([ds[i] for i in range(6)]))
    return out


def _models(tagger, translators):
    return {"tagging_lstm": tagger, **translators}


@pytest.mark.parametrize("arch", ["transformer", "lstm", "tagging_lstm"])
def test_one_hot_soft_reorder_equals_fairseq_reorder(arch, tagger, translators):
    """Beams with different prefixes; a one-hot soft reorder must (1) equal fairseq's
    reorder (``reorder_incremental_state_scripting``, what SequenceGenerator calls)
    entry by entry, (2) actually move states (some entry changes), and (3) continue
    each row as its chosen beam: the next step from the reordered state equals a
    full, non-incremental pass over that beam's prefix plus the next token."""
    task, model, sample = _models(tagger, translators)[arch]
    decoder = model.decoder
    B, k = sample["target"].size(0), 3
    V = len(task.target_dictionary)
    rows = torch.arange(B).repeat_interleave(k)
    net = sample["net_input"]
    enc = model.encoder.reorder_encoder_out(model.encoder(net["src_tokens"], src_lengths=net["src_lengths"]), rows)
    g = torch.Generator().manual_seed(3)
    prev = torch.randint(4, V, (B * k, 3), generator=g)
    state = {}
    with torch.no_grad():
        for t in range(3):
            decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
    choice = torch.randint(0, k, (B * k,), generator=g)
    order = rows * k + choice
    before = {key: {sub: v.clone() for sub, v in value.items() if isinstance(v, torch.Tensor)}
              for key, value in state.items()}
    soft_state = {key: dict(v) for key, v in state.items()}
    SoftReorder(decoder)(soft_state, torch.nn.functional.one_hot(choice, k).float(), B)
    decoder.reorder_incremental_state_scripting(state, order)
    assert state.keys() == soft_state.keys()
    compared, moved = 0, 0
    for key in state:
        for sub, value in state[key].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, soft_state[key][sub]), (key, sub)
                compared += 1
                moved += int(value.shape != before[key][sub].shape or not torch.equal(value, before[key][sub]))
    assert compared >= 2 and moved >= 1
    nxt = torch.cat([prev.index_select(0, order), torch.randint(4, V, (B * k, 1), generator=g)], dim=1)
    with torch.no_grad():
        stepped = decoder(nxt, encoder_out=enc, incremental_state=soft_state)[0][:, -1]
        full = decoder(nxt, encoder_out=enc)[0][:, -1]
    assert torch.allclose(stepped, full, atol=1e-4), (stepped - full).abs().max()


def test_hard_beam_equals_fairseq_beam_search(tagger):
    """Forced length gives every hypothesis the same length, so fairseq's length
    normalisation does not change the ranking: the best hypotheses must agree."""
    task, model, sample = tagger
    horizon = sample["target"].ne(1).sum(1)
    with torch.no_grad():
        ours = run_beam(model, sample["net_input"], horizon, 3, hard=True).best_tokens()
        gen = task.build_generator([model], argparse.Namespace(beam=3))
        theirs = gen.generate([model], sample)
    for b in range(sample["target"].size(0)):
        assert torch.equal(ours[b, : horizon[b]], theirs[b][0]["tokens"]), b


def test_soft_beam_tends_to_fairseq_beam_search_and_its_hamming_cost(tagger):
    """As alpha -> inf the soft beam's best hypotheses are fairseq's beam search
    ones (an independent search; forced length, so its length normalisation does
    not reorder them) and L is their Hamming cost against the gold labels, counted
    directly; at alpha 1 L is not that cost."""
    task, model, sample = tagger
    target = sample["target"]
    horizon = target.ne(1).sum(1)
    d = hamming_step_costs(target, len(task.target_dictionary), ignore_index=1)
    with torch.no_grad():
        theirs = task.build_generator([model], argparse.Namespace(beam=3)).generate([model], sample)
        fairseq_cost = torch.tensor([float(theirs[b][0]["tokens"].ne(target[b, : horizon[b]]).sum())
                                     for b in range(target.size(0))])
        gaps = []
        for alpha in (1.0, 1e9):
            soft = run_beam(model, sample["net_input"], horizon, 3, alpha=alpha, step_costs=d)
            gaps.append((soft_beam_loss(soft.scores, soft.costs, alpha) - fairseq_cost).abs().max().item())
    for b in range(target.size(0)):
        assert torch.equal(soft.best_tokens()[b, : horizon[b]], theirs[b][0]["tokens"]), b
    assert gaps[1] < 1e-4 and gaps[0] > 10 * gaps[1], gaps
    assert fairseq_cost.sum() > 0  # the limit is not trivially zero


@pytest.mark.parametrize("arch", ["lstm", "tagging_lstm"])
def test_beam_gradients_equal_float64_finite_differences(arch, tagger, translators):
    """The relaxed direct loss of a whole search through the model (soft states,
    soft inputs, soft reorder) in float64 at small alpha: its derivative along a
    random parameter direction equals a central finite difference. Needs the beam
    to keep the model's precision (a float32 beam agrees to ~1e-3 at best). Not
    the transformer: fairseq's attention softmax is float32 whatever the model's
    dtype (``fairseq.utils.softmax``), which limits any check to ~1e-3."""
    import copy

    task, model, sample = _models(tagger, translators)[arch]
    model = copy.deepcopy(model).double().eval()
    target = sample["target"][:3]
    net = {key: value[:3] for key, value in sample["net_input"].items()}
    horizon = target.ne(1).sum(1).clamp(max=4)
    d = hamming_step_costs(target[:, :4], len(task.target_dictionary), ignore_index=1)
    params = [p for p in model.decoder.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    direction = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]

    def loss():
        result = run_beam(model, net, horizon, 2, alpha=0.5, step_costs=d)
        assert result.scores.dtype == torch.float64
        return soft_beam_loss(result.scores, result.costs, 0.5).sum()

    grads = torch.autograd.grad(loss(), params, allow_unused=True)
    analytic = sum((gr * u).sum() for gr, u in zip(grads, direction) if gr is not None)
    eps = 1e-6
    with torch.no_grad():
        for p, u in zip(params, direction):
            p.add_(eps * u)
        plus = loss()
        for p, u in zip(params, direction):
            p.sub_(2 * eps * u)
        minus = loss()
    numeric = (plus - minus) / (2 * eps)
    assert abs(analytic.item()) > 1e-4
    assert analytic.item() == pytest.approx(numeric.item(), rel=1e-6)


def test_global_scores_are_the_raw_logits(tagger):
    """Adding a constant to every logit of one step leaves the local
    (log-softmax) beam unchanged and shifts every global score by that constant."""
    task, model, sample = tagger
    horizon = sample["target"].ne(1).sum(1)
    calls = []

    def shift(module, inputs, output):
        calls.append(1)
        return output + 5.0 if len(calls) == 2 else output

    with torch.no_grad():
        base = {n: run_beam(model, sample["net_input"], horizon, 3, alpha=2.0, normalization=n) for n in ("local", "global")}
        handle = model.decoder.fc_out.register_forward_hook(shift)
        try:
            shifted = {}
            for n in ("local", "global"):
                calls.clear()
                shifted[n] = run_beam(model, sample["net_input"], horizon, 3, alpha=2.0, normalization=n)
        finally:
            handle.remove()
    alive = torch.isfinite(base["local"].scores)
    assert torch.allclose(shifted["local"].scores[alive], base["local"].scores[alive], atol=1e-5)
    assert torch.allclose(shifted["global"].scores[alive], base["global"].scores[alive] + 5.0, atol=1e-4)


# ----------------------------------------------------------------- open length (translation)


def _teacher_forced(model, src, src_lengths, tokens, normalization, pad, eos):
    """Sum over the non-pad positions of f(token) for each row of ``tokens`` (N, T)."""
    n = tokens.size(0)
    prev = torch.cat([torch.full((n, 1), eos), tokens[:, :-1]], dim=1).masked_fill(
        torch.cat([torch.zeros(n, 1, dtype=torch.bool), tokens[:, :-1].eq(pad)], dim=1), eos)
    enc = model.encoder(src.expand(n, -1), src_lengths=src_lengths.expand(n))
    f = local_scores(model.decoder(prev, encoder_out=enc)[0], normalization)
    return f.gather(-1, tokens.clamp_min(0).unsqueeze(-1)).squeeze(-1).masked_fill(tokens.eq(pad), 0.0).sum(-1)


@pytest.mark.parametrize("normalization", ["local", "global"])
def test_open_length_hard_beam_is_exact_search_when_it_holds_every_hypothesis(normalization, translators):
    """An enumerable toy: with a length limit of 3 (EOS included), a random-weight
    transformer has (V - 4)(V - 3) hypotheses (no pad, BOS or unk, no EOS first,
    EOS last); a
    beam that large is exhaustive search, so its k best ended hypotheses must be the
    top of the brute-force ranking of all of them, in order, with their summed
    scores, under local and under raw (global) scores."""
    task, model, sample = translators["transformer"]
    d = task.target_dictionary
    V, pad, eos = len(d), d.pad(), d.eos()
    net = {key: value[:1] for key, value in sample["net_input"].items() if key != "prev_output_tokens"}
    words = torch.tensor([w for w in range(V) if w not in (pad, eos, d.bos(), d.unk())])
    two = torch.stack([words, torch.full_like(words, eos), torch.full_like(words, pad)], dim=1)
    first, second = torch.cartesian_prod(words, words).unbind(1)
    three = torch.stack([first, second, torch.full_like(first, eos)], dim=1)
    every = torch.cat([two, three])
    assert every.size(0) == (V - 4) * (V - 3)
    with torch.no_grad():
        brute = _teacher_forced(model, net["src_tokens"], net["src_lengths"], every, normalization, pad, eos)
        result = run_beam(model, net, torch.tensor([3]), every.size(0), normalization=normalization, hard=True,
                          stop_at_eos=True)
    top = brute.topk(5)
    assert torch.allclose(result.scores[0, :5], top.values, atol=1e-4)
    assert torch.equal(result.tokens[0, :5], every[top.indices])
    assert torch.isfinite(result.scores).all()  # every hypothesis ended within the limit
    assert not (result.tokens.eq(d.bos()) | result.tokens.eq(d.unk())).any()  # so the beam held exactly `every`


def test_open_length_beam_scores_are_summed_and_hypotheses_end_with_eos(translators):
    """BeamGenerator with a length limit (translation): every hypothesis ends with
    EOS within the limit, contains no pad, and its score is the teacher-forced sum
    of its positional scores (hard beam: no length normalisation), local and global."""
    task, model, sample = translators["transformer"]
    d = task.target_dictionary
    for normalization in ("local", "global"):
        gen = BeamGenerator([model], d, beam=3, normalization=normalization, soft=False, max_len_a=1.0, max_len_b=3)
        hyps = gen.generate([model], sample)
        width = sample["net_input"]["src_tokens"].size(1)  # fairseq's limit: 1.0 * width + 3 tokens, then EOS
        for b, nbest in enumerate(hyps):
            assert len(nbest) == 3
            scores = [float(h["score"]) for h in nbest]
            assert scores == sorted(scores, reverse=True)
            for h in nbest:
                tokens = h["tokens"]
                assert tokens[-1] == d.eos() and not tokens[:-1].eq(d.eos()).any() and not tokens.eq(d.pad()).any()
                assert len(tokens) <= width + 3 + 1
                assert float(h["positional_scores"].sum()) == pytest.approx(float(h["score"]), abs=1e-3)


@pytest.mark.parametrize("arch", ["transformer", "lstm", "tagging_lstm"])
@pytest.mark.parametrize("hard", [False, True])
def test_a_sentences_search_does_not_depend_on_its_batch(arch, hard, tagger, translators):
    """Sentences of different horizons leave the search's batch at different steps
    (their rows dropped from the decoder's state, the encoder output and the soft
    inputs); each sentence's final scores and hypotheses equal those of the same
    sentence searched alone, where nothing is dropped. Fails when the kept rows are
    mis-indexed in any of them (soft search: the state, then the mix)."""
    task, model, sample = _models(tagger, translators)[arch]
    net = sample["net_input"]
    target = sample["target"]
    if arch == "tagging_lstm":
        horizon, open_length = target.ne(1).sum(1), False
    else:
        horizon, open_length = target.ne(1).sum(1) + 2, True
    assert horizon.unique().numel() > 2  # several leaving steps
    with torch.no_grad():
        batch = run_beam(model, net, horizon, 3, alpha=2.0, hard=hard, stop_at_eos=open_length)
        for b in range(target.size(0)):
            src = net["src_tokens"][b: b + 1]
            src = src[:, src[0].ne(task.source_dictionary.pad())]  # its own length: no padding columns
            alone = run_beam(model, {"src_tokens": src, "src_lengths": net["src_lengths"][b: b + 1]},
                             horizon[b: b + 1], 3, alpha=2.0, hard=hard, stop_at_eos=open_length)
            assert torch.allclose(batch.scores[b], alone.scores[0], atol=1e-4), (b, batch.scores[b], alone.scores[0])
            if hard:
                length = alone.tokens.size(-1)
                assert torch.equal(batch.tokens[b, :, :length], alone.tokens[0]), b
                assert batch.tokens[b, :, length:].eq(1).all(), b


def _shift_eos(model, eos: int, shift: float):
    """A forward hook adding ``shift`` to the EOS logit of the decoder's output layer."""
    layer = model.decoder.output_projection if hasattr(model.decoder, "output_projection") else model.decoder.fc_out

    def hook(module, inputs, output):
        return output + shift * torch.nn.functional.one_hot(torch.tensor(eos), output.size(-1)).to(output.dtype)

    return layer.register_forward_hook(hook)


@pytest.mark.parametrize("max_len_a,max_len_b", [(0.0, 4), (0.5, 1)])
def test_open_length_limit_is_fairseqs(max_len_a, max_len_b, translators):
    """fairseq's SequenceGenerator allows max_len_a * (source width) + max_len_b
    tokens and then EOS (a = 0, b = 4: 5 tokens with EOS). With EOS made very
    unlikely every hypothesis runs to the limit: ours must be exactly as long."""
    task, model, sample = translators["transformer"]
    d = task.target_dictionary
    handle = _shift_eos(model, d.eos(), -50.0)
    try:
        with torch.no_grad():
            args = argparse.Namespace(beam=3, max_len_a=max_len_a, max_len_b=max_len_b)
            theirs = task.build_generator([model], args).generate([model], sample)
            ours = BeamGenerator([model], d, beam=3, soft=False, max_len_a=max_len_a,
                                 max_len_b=max_len_b).generate([model], sample)
    finally:
        handle.remove()
    expected = int(max_len_a * sample["net_input"]["src_tokens"].size(1) + max_len_b) + 1
    assert {len(h["tokens"]) for hyps in theirs for h in hyps} == {expected}
    assert {len(h["tokens"]) for hyps in ours for h in hyps} == {expected}
    assert all(h["tokens"][-1] == d.eos() for hyps in ours for h in hyps)


@pytest.mark.parametrize("shift", [8.0, -50.0])
def test_training_search_follows_the_decoding_rules(shift, translators, monkeypatch):
    """The translation criterion searches under the decoder's rules: every
    hypothesis has exactly one EOS, at its end, no pad / BOS / unk, at most
    reference length + --soft-beam-extra-len tokens (all of them when EOS is made
    unlikely, some shorter than the reference when it is made likely), and the
    logged beam cost is the Hamming distance over the longer of hypothesis and
    reference, counted directly."""
    import fairseq_ext.criterions.soft_beam as criterion_module
    from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion

    task, model, sample = translators["lstm"]
    d = task.target_dictionary
    seen = []

    def spy(*args, **kwargs):
        seen.append(run_beam(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(criterion_module, "run_beam", spy)
    criterion = SoftBeamDirectLossCriterion(task, soft_beam_size=3, soft_beam_alpha=2.0, soft_beam_extra_len=2)
    handle = _shift_eos(model, d.eos(), shift)
    try:
        with torch.no_grad():
            _, _, log = criterion(model, sample)
    finally:
        handle.remove()
    best = seen[0].best_tokens()
    target = sample["target"]
    lengths, hamming = [], 0
    for b in range(target.size(0)):
        ref = target[b][target[b].ne(d.pad())].tolist()
        n = int(best[b].eq(d.eos()).nonzero()[0]) + 1
        hyp = best[b, :n].tolist()
        assert hyp.count(d.eos()) == 1 and not {d.pad(), d.bos(), d.unk()} & set(hyp), hyp
        assert best[b, n:].eq(d.pad()).all() and n <= len(ref) + 2
        lengths.append(n - len(ref))
        hamming += _hamming_padded(hyp, ref)
    assert float(log["beam_cost"]) == hamming
    if shift < 0:
        assert set(lengths) == {2}
    else:
        assert min(lengths) < 0


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_search_dropout_modes(arch, translators):
    """In train mode (dropout 0.1): with --soft-beam-dropout none two calls give
    identical gradients, no dropout module drops anything, and the model is back in
    train mode; independent masks give different gradients on two calls, and the k rows
    of a sentence get different masks; shared masks are equal over a sentence's k rows
    (read off the decoder's dropout module at the steps that run B x k rows: entries it
    zeroed) but drawn anew on each call."""
    import copy

    from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion

    task, model, sample = translators[arch]
    model = copy.deepcopy(model).train()
    B, k = sample["target"].size(0), 3
    calls = []
    drop = model.decoder.dropout_module if arch == "transformer" else model.decoder.dropout_out_module
    drop.register_forward_hook(lambda m, i, o: calls.append((i[0].detach(), o.detach())))

    def grads(mode):
        calls.clear()
        model.zero_grad()
        criterion = SoftBeamDirectLossCriterion(task, soft_beam_size=k, soft_beam_dropout=mode)
        criterion(model, sample)[0].backward()
        kept = []  # (B, k, rest) kept entries at each step with B x k rows
        for x, y in calls:
            dims = [d for d, n in enumerate(x.shape) if n == B * k]
            if dims:
                keep = (y != 0) | (x == 0)
                kept.append(keep.movedim(dims[0], 0).reshape(B, k, -1))
        assert kept, "no dropout call on B x k rows"
        return [p.grad.clone() for p in model.parameters() if p.grad is not None], kept

    a, _ = grads("none")
    b, kept = grads("none")
    assert model.training and all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(m.all() for m in kept)  # eval mode: no dropout at all
    c, kept = grads("independent")
    e, _ = grads("independent")
    assert not all(torch.equal(x, y) for x, y in zip(c, e))
    assert not all(m.all() for m in kept) and not torch.equal(kept[0][:, 0], kept[0][:, 1])
    _, kept = grads("shared")
    assert not all(m.all() for m in kept)
    assert all(torch.equal(m[:, 0], m[:, j]) for m in kept for j in range(1, k))
    _, other = grads("shared")
    assert not torch.equal(kept[0], other[0])  # masks are drawn, not switched off


def test_fairseq_generate_translation_search(toy_bin, tmp_path):
    """--task translation_search through fairseq-generate on a trained tiny
    transformer: beam 1 of our hard search is fairseq's greedy output, beam 3 is
    fairseq's --unnormalized beam search on this model (the two searches treat
    finished hypotheses differently, so in general they may differ); soft beam
    decoding at alpha 1e9 prints the hard beam's hypotheses; printed scores are the
    sums of the printed positional scores (no length normalisation); shards make
    one run; the global (raw-logit) search at beam 1 is greedy search (softmax keeps
    the argmax)."""
    user = ["--user-dir", os.path.join(REPO, "fairseq_ext")]
    run_cli(["fairseq-train", toy_bin, *user, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
             "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "400",
             "--max-update", "150", "--num-workers", "0", "--save-dir", str(tmp_path / "ck"), "--no-epoch-checkpoints",
             "--disable-validation", "--seed", "1"])
    base = ["fairseq-generate", toy_bin, *user, "--task", "translation_search", "--path",
            str(tmp_path / "ck" / "checkpoint_last.pt"), "--gen-subset", "valid", "--batch-size", "16"]
    outs, hyps = {}, {}
    for name, extra in (("fairseq1", ["--beam", "1"]), ("hard1", ["--beam", "1", "--search-algorithm", "hard"]),
                        ("fairseq3", ["--beam", "3", "--unnormalized"]),
                        ("hard3", ["--beam", "3", "--search-algorithm", "hard"]),
                        ("soft3", ["--beam", "3", "--search-algorithm", "soft", "--search-alpha", "1e9"]),
                        ("global1", ["--beam", "1", "--search-algorithm", "hard", "--search-normalization",
                                     "global"]),
                        ("global3", ["--beam", "3", "--search-algorithm", "hard", "--search-normalization",
                                     "global", "--max-len-b", "20"])):
        outs[name] = run_cli(base + extra).stdout
        hyps[name] = {l.split("\t")[0]: l.split("\t")[2] for l in outs[name].splitlines() if l.startswith("H-")}
    assert len(hyps["fairseq1"]) == 40
    assert hyps["hard1"] == hyps["fairseq1"]
    assert hyps["hard3"] == hyps["fairseq3"]
    assert hyps["soft3"] == hyps["hard3"] and hyps["hard3"] != hyps["hard1"]
    assert hyps["global1"] == hyps["fairseq1"]  # the argmax of the raw logits is the argmax of log-softmax
    for name in ("hard3", "global3"):
        lines = outs[name].splitlines()
        scores = {l.split("\t")[0][2:]: float(l.split("\t")[1]) for l in lines if l.startswith("H-")}
        positional = {l.split("\t")[0][2:]: sum(map(float, l.split("\t")[1].split())) for l in lines
                      if l.startswith("P-")}
        assert scores.keys() == positional.keys()
        assert all(abs(scores[i] - positional[i]) < 1e-2 * max(1.0, abs(scores[i])) for i in scores)
    assert_shards_make_one_run(base + ["--beam", "3", "--search-algorithm", "soft", "--search-alpha", "1"])
    with pytest.raises(AssertionError, match="--search-alpha must be > 0"):
        run_cli(base + ["--search-algorithm", "soft", "--search-alpha", "0"])
    with pytest.raises(AssertionError, match="--sampling needs --search-algorithm fairseq or hard"):
        run_cli(base + ["--search-algorithm", "soft", "--sampling", "--beam", "1"])
    sampled = run_cli(base + ["--sampling", "--beam", "1", "--seed", "1"])  # the default hard: fairseq's sampler
    assert "--sampling: fairseq's sampling generator" in sampled.stderr + sampled.stdout


# ----------------------------------------------------------------- through fairseq-train

SB = ["--soft-beam-alpha", "1", "--soft-beam-alpha-schedule", "exponential", "--soft-beam-alpha-final", "10",
      "--soft-beam-alpha-updates", "20", "--optimizer", "adam", "--lr", "0.002", "--max-update", "12",
      "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "json", "--seed", "1"]


@pytest.mark.parametrize("criterion,arch", [
    ("soft_beam_direct_loss", "transformer"), ("soft_beam_direct_loss", "lstm"), ("soft_beam_direct_loss", "tagging_lstm"),
    ("soft_beam_hinge", "transformer"), ("soft_beam_hinge", "tagging_lstm")])
def test_fairseq_train_runs(criterion, arch, toy_bin, conll, cache, tmp_path):
    if arch == "tagging_lstm":
        data = [conll, "--task", "sequence_tagging", "--tagging-cache-dir", cache, "--arch", "tagging_lstm_tiny",
                "--batch-size", "16", "--soft-beam-hamming-weights", "O=2.0"]
    else:
        data = [toy_bin, "--task", "translation"] + tiny_models.TINY_ARCHS[arch] + ["--max-tokens", "300"]
    proc = run_cli(["fairseq-train", *data, "--user-dir", os.path.join(REPO, "fairseq_ext"), "--criterion", criterion,
                    *SB, "--save-dir", str(tmp_path / "ck")])
    valid = [json.loads(l[l.index("{"):]) for l in proc.stdout.splitlines() if "| valid |" in l]
    assert valid and all(math.isfinite(float(v["valid_loss"])) for v in valid)
    assert "valid_beam_cost" in valid[-1]
    # alpha 1 -> 10 geometrically over 20 updates; validation reads the clock of the
    # 12th (last) step, which ran after 11 updates: 10^(11/20)
    assert float(valid[-1]["valid_soft_beam_alpha"]) == pytest.approx(10 ** (11 / 20), abs=1e-3)


def test_decoding_defaults_to_the_checkpoints_normalization(toy_bin, tmp_path):
    """A model trained with --soft-beam-normalization global decodes with raw scores by
    default: the printed scores equal those of --search-normalization global (the
    sums of raw logits), not those of local (log-probabilities); asking for local
    warns, as does fairseq's own (renormalising) search."""
    user = ["--user-dir", os.path.join(REPO, "fairseq_ext")]
    run_cli(["fairseq-train", toy_bin, *user, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
             "--criterion", "soft_beam_direct_loss", "--soft-beam-normalization", "global", "--optimizer", "adam",
             "--lr", "0.01", "--max-tokens", "300", "--max-update", "2", "--num-workers", "0",
             "--save-dir", str(tmp_path / "ck"),
             "--no-epoch-checkpoints", "--disable-validation", "--seed", "1"])
    base = ["fairseq-generate", toy_bin, *user, "--task", "translation_search", "--path",
            str(tmp_path / "ck" / "checkpoint_last.pt"), "--gen-subset", "valid", "--batch-size", "16", "--beam", "3"]
    runs = {name: run_cli(base + extra) for name, extra in (
        ("default", ["--search-algorithm", "hard"]),
        ("global", ["--search-algorithm", "hard", "--search-normalization", "global"]),
        ("local", ["--search-algorithm", "hard", "--search-normalization", "local"]),
        ("fairseq", ["--search-algorithm", "fairseq"]),
        ("unset", []))}
    scores = {name: [l.split("\t")[1] for l in proc.stdout.splitlines() if l.startswith("H-")]
              for name, proc in runs.items()}
    assert len(scores["default"]) == 40
    assert scores["default"] == scores["global"] and scores["default"] != scores["local"]
    assert "trained with --soft-beam-normalization global" in runs["local"].stderr + runs["local"].stdout
    assert "renormalises" in runs["fairseq"].stderr + runs["fairseq"].stdout
    assert "trained with" not in runs["default"].stderr + runs["default"].stdout
    assert scores["unset"] == scores["default"]  # --search-algorithm hard is the default


def test_bad_length_options_are_refused(translators):
    from fairseq_ext.runtime.cli import ConfigError
    from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion

    task, model, sample = translators["lstm"]
    with pytest.raises(ConfigError, match="--soft-beam-extra-len must be >= 0"):
        SoftBeamDirectLossCriterion(task, soft_beam_extra_len=-1)
    gen = BeamGenerator([model], task.target_dictionary, beam=2, soft=False, max_len_a=0.0, max_len_b=0)
    with pytest.raises(ConfigError, match="--max-len-a 0.0 / --max-len-b 0 allow 0 tokens"):
        gen.generate([model], sample)


def test_bad_hamming_weights_are_refused(conll, cache, tmp_path):
    with pytest.raises(AssertionError, match="--soft-beam-hamming-weights"):
        run_cli(["fairseq-train", conll, "--user-dir", os.path.join(REPO, "fairseq_ext"), "--task",
                 "sequence_tagging", "--tagging-cache-dir", cache, "--arch", "tagging_lstm_tiny", "--criterion",
                 "soft_beam_direct_loss", "--soft-beam-hamming-weights", "NOPE=2", "--optimizer", "adam",
                 "--lr", "0.01", "--max-update", "1", "--save-dir", str(tmp_path / "ck")])


# ----------------------------------------------------------------- self-normalisation


def test_self_normalized_nll_hand_values():
    from fairseq_ext.core.token_losses import self_normalized_nll

    logits = torch.tensor([[math.log(2.0), math.log(2.0)], [0.0, 0.0]])
    loss, nll, log_z = self_normalized_nll(logits, torch.tensor([0, 1]), 0.5, ignore_index=1)
    # row 0: log Z = log 4, -log p = log 2; row 1 is padding
    assert log_z.tolist() == pytest.approx([math.log(4.0), 0.0])
    assert nll.item() == pytest.approx(math.log(2.0))
    assert loss.item() == pytest.approx(math.log(2.0) + 0.5 * math.log(4.0) ** 2)


def test_self_normalized_ce_drives_log_z_to_zero(toy_bin, tmp_path):
    """Same model, data and updates: the penalty brings mean |log Z| far below
    plain CE's at a similar CE (measured: 4.62 -> 0.96, CE 4.85 -> 5.78 bits). The
    tiny lstm, whose output layer has a bias that can absorb a constant; fairseq's
    transformer output projection has none and moves log Z more slowly."""
    logs = {}
    for name, crit in (("ce", ["--criterion", "self_normalized_ce", "--self-norm-lambda", "0"]),
                       ("l2", ["--criterion", "self_normalized_ce", "--self-norm-lambda", "1.0"])):
        proc = run_cli(["fairseq-train", toy_bin, "--task", "translation", *tiny_models.TINY_ARCHS["lstm"],
                        "--user-dir", os.path.join(REPO, "fairseq_ext"), *crit, "--optimizer", "adam", "--lr", "0.005",
                        "--max-tokens", "400", "--max-epoch", "6", "--no-epoch-checkpoints", "--num-workers", "0",
                        "--log-format", "json", "--seed", "1", "--save-dir", str(tmp_path / name)])
        logs[name] = [json.loads(l[l.index("{"):]) for l in proc.stdout.splitlines() if "| valid |" in l][-1]
    ce, l2 = logs["ce"], logs["l2"]
    assert abs(float(l2["valid_log_z_mean"])) < 0.25 * abs(float(ce["valid_log_z_mean"])), (ce, l2)
    assert float(l2["valid_nll_loss"]) < 1.3 * float(ce["valid_nll_loss"]), (ce, l2)
    assert float(ce["valid_log_z_var"]) >= 0 and float(l2["valid_log_z_var"]) >= 0


def test_fairseq_generate_with_hard_and_soft_beam_search(conll, cache, tmp_path):
    """--search-algorithm hard (raw-score ranking) and soft (alpha -> inf) return
    fairseq's beam-search hypotheses on a trained tagger (forced length: equal
    lengths, so fairseq's length normalisation does not reorder them); at beam 1
    the global (raw-logit) search is fairseq's greedy search; a small alpha runs
    too."""
    task_args = ["--user-dir", os.path.join(REPO, "fairseq_ext"), "--task", "sequence_tagging", "--tagging-cache-dir",
                 cache]
    run_cli(["fairseq-train", conll, *task_args, "--arch", "tagging_lstm_tiny", "--criterion", "cross_entropy",
             "--optimizer", "adam", "--lr", "0.01", "--batch-size", "16", "--max-update", "120", "--num-workers", "0",
             "--save-dir", str(tmp_path / "ck"), "--no-epoch-checkpoints", "--disable-validation", "--seed", "1"])
    hyps = {}
    for name, extra in (("fairseq", []), ("hard", ["--search-algorithm", "hard"]),
                        ("soft", ["--search-algorithm", "soft", "--search-alpha", "1e9"]),
                        ("soft_a1", ["--search-algorithm", "soft", "--search-alpha", "1"]),
                        ("fairseq1", ["--beam", "1"]),
                        ("global1", ["--search-algorithm", "hard", "--search-normalization", "global", "--beam", "1"])):
        out = run_cli(["fairseq-generate", conll, *task_args, "--path", str(tmp_path / "ck" / "checkpoint_last.pt"),
                       "--gen-subset", "test", "--beam", "3", "--batch-size", "8", *extra]).stdout
        hyps[name] = {l.split("\t")[0]: l.split("\t")[2] for l in out.splitlines() if l.startswith("H-")}
    assert len(hyps["fairseq"]) == 31
    sharded = assert_shards_make_one_run(
        ["fairseq-generate", conll, *task_args, "--path", str(tmp_path / "ck" / "checkpoint_last.pt"),
         "--gen-subset", "test", "--beam", "3", "--batch-size", "8", "--search-algorithm", "soft",
         "--search-alpha", "1"])
    assert {f"H-{i}": h[0].split("\t")[1] for i, h in sharded.items()} == hyps["soft_a1"]
    assert hyps["hard"] == hyps["fairseq"] and hyps["soft"] == hyps["fairseq"]
    assert hyps["soft_a1"].keys() == hyps["fairseq"].keys()
    assert all(len(hyps["soft_a1"][i].split()) == len(hyps["fairseq"][i].split()) for i in hyps["soft_a1"])
    assert hyps["global1"] == hyps["fairseq1"]  # raw-score greedy is greedy: softmax keeps the argmax


def test_search_without_dropout_keeps_rnns_trainable_and_dropout_free(toy_bin):
    """--soft-beam-dropout none on a model whose encoder is a 2-layer torch LSTM with
    dropout 0.5 between its layers: the search pass leaves that dropout out (two calls
    in train mode give the same loss and gradients, equal to those of the model in
    eval mode), and the LSTM runs in training mode meanwhile (cuDNN computes an RNN's
    backward only in training mode: on CUDA an eval-mode pass cannot be
    differentiated); afterwards its mode and dropout are as before."""
    from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion

    task, model, _ = tiny_models.build_task_and_model(toy_bin, "translation", "lstm",
                                              ["--encoder-layers", "2", "--decoder-layers", "2",
                                               "--encoder-dropout-out", "0.5"])
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    rnn = model.encoder.lstm
    assert isinstance(rnn, torch.nn.LSTM) and rnn.dropout == 0.5
    seen = []
    rnn.register_forward_pre_hook(lambda m, i: seen.append((m.training, m.dropout)))
    criterion = SoftBeamDirectLossCriterion(task, soft_beam_size=3, soft_beam_dropout="none")

    def run(train):
        model.train(train)
        model.zero_grad()
        loss = criterion(model, sample)[0]
        loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (la, ga), (lb, gb) = run(True), run(True)
    assert seen and all(s == (True, 0.0) for s in seen)
    assert model.training and rnn.training and rnn.dropout == 0.5
    assert la == lb and all(torch.equal(x, y) for x, y in zip(ga, gb))
    le, ge = run(False)
    assert le == pytest.approx(la, rel=1e-6) and all(torch.allclose(x, y, atol=1e-6) for x, y in zip(ga, ge))


@pytest.mark.parametrize("criterion_name", ["soft_beam_direct_loss", "soft_beam_hinge"])
def test_search_arithmetic_stays_float32_under_autocast(criterion_name, translators, monkeypatch):
    """Under autocast (--amp; here the CPU's bfloat16 autocast) the decoder runs in half
    precision but every beam step's arithmetic runs with autocast off, on float32 scores,
    and returns float32 scores and costs (on CUDA, autocast's half-precision einsum
    handed half-precision costs to the search's float32 buffers and index_copy refused
    them: docs/performance.md, "CUDA-only behaviour the tests check"); the loss is finite and within
    bfloat16's rounding of the float32 loss, and its gradients are finite."""
    import copy

    from fairseq_ext.core import beam_relaxation as core
    from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion, SoftBeamHingeCriterion
    from fairseq_ext.decoding import beam_search as generator

    steps = []
    for name in ("soft_beam_step", "hard_beam_step"):
        def spy(*args, _fn=getattr(core, name), **kwargs):
            out = _fn(*args, **kwargs)
            steps.append((torch.is_autocast_enabled("cpu"), args[1].dtype, out.scores.dtype, out.costs.dtype))
            return out
        monkeypatch.setattr(generator, name, spy)
    cls = SoftBeamDirectLossCriterion if criterion_name == "soft_beam_direct_loss" else SoftBeamHingeCriterion
    task, model, sample = translators["transformer"]
    model = copy.deepcopy(model)
    criterion = cls(task, soft_beam_size=3)
    reference = float(criterion(model, sample)[0].detach())
    steps.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = criterion(model, sample)[0]
    assert steps and all(s == (False,) + (torch.float32,) * 3 for s in steps), set(steps)
    assert loss.dtype == torch.float32
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(reference, rel=0.05)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
