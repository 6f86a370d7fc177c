"""Candidate decoding: exact agreement with fairseq's SequenceGenerator, scores equal
to a teacher-forced forward, sampling limit cases, and mode handling."""
import math

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_ext.core.sampling import choose_tokens, filter_logits
from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates
from fairseq_ext.decoding.candidates import prefix_sample


def _batch(task, split="valid", n=6):
    task.load_dataset(split)
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(n)])


def _setup(untrained_models, arch):
    task, model = untrained_models[arch]
    sample = _batch(task)
    prefix = None
    if arch == "transformer_lm":
        d = task.dictionary
        sample = prefix_sample(sample, d.pad(), d.eos())
        prefix = sample["prefix"]
    return task, model, sample, prefix


def test_filter_logits_hand_values():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    inf = float("-inf")
    assert filter_logits(logits, topp=0.6)[0, 2].item() == inf
    assert torch.isfinite(filter_logits(logits, topp=0.6)[0, :2]).all()
    kept = torch.isfinite(filter_logits(logits, topp=0.5)[0])
    assert kept.tolist() == [True, False, False]
    assert torch.isfinite(filter_logits(logits, topk=2)[0]).tolist() == [True, True, False]
    assert torch.equal(filter_logits(logits), logits)
    with pytest.raises(ValueError, match="topp"):
        filter_logits(logits, topp=0.0)


def test_choose_tokens_topk1_is_argmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 11, generator=g)
    sampled = choose_tokens(logits, sample=True, topk=1, generator=g)
    assert torch.equal(sampled, logits.argmax(-1))


def _output_layer(model):
    dec = model.decoder
    return getattr(dec, "output_projection", None) or dec.fc_out


@pytest.mark.parametrize(
    "arch,min_len",
    [("transformer", 1), ("transformer", 0), ("lstm", 1), ("lstm", 0), ("transformer_lm", 0)],
)
@pytest.mark.parametrize("eos_bias", [0.0, 3.0])
def test_greedy_matches_sequence_generator(untrained_models, arch, min_len, eos_bias):
    """Row by row identical tokens and scores. A forward hook raises the EOS logit
    so that rows also end early, at different steps. (For a decoder-only model
    SequenceGenerator counts the prompt towards min_len, we count generated tokens
    only, so the LM case is compared with min_len=0.)"""
    task, model, sample, prefix = _setup(untrained_models, arch)
    eos = task.target_dictionary.eos()
    handle = _output_layer(model).register_forward_hook(
        lambda m, i, out: out.index_add(-1, torch.tensor([eos]), torch.full(out.shape[:-1] + (1,), eos_bias))
    )
    try:
        max_len = 12
        cand = decode_candidates(model, sample, DecodeConfig(max_len_b=max_len, min_len=min_len), prefix_tokens=prefix)
        k = prefix.size(1) if prefix is not None else 0
        gen = SequenceGenerator(
            [model], task.target_dictionary, beam_size=1, max_len_a=0, max_len_b=max_len + k, min_len=min_len
        )
        model.eval()
        hypos = gen.generate([model], sample, prefix_tokens=prefix)
    finally:
        handle.remove()
    if eos_bias > 0:
        assert bool(cand.finished.any()), "the EOS bias should end some rows early"
    for i, nbest in enumerate(hypos):
        ref = nbest[0]["tokens"][k:]
        ref_scores = nbest[0]["positional_scores"][k:]
        mine = cand.as_list()[i]
        if not cand.finished[i]:  # SequenceGenerator forces EOS after max_len
            assert len(mine) == max_len and ref[-1] == eos
            ref, ref_scores = ref[:-1], ref_scores[:-1]
        assert torch.equal(mine, ref), (arch, i)
        assert cand.scores[i].item() == pytest.approx(ref_scores.sum().item(), abs=1e-4)


def test_min_len_bans_early_eos(untrained_models):
    task, model, sample, _ = _setup(untrained_models, "transformer")
    eos = task.target_dictionary.eos()
    handle = _output_layer(model).register_forward_hook(
        lambda m, i, out: out.index_add(-1, torch.tensor([eos]), torch.full(out.shape[:-1] + (1,), 50.0))
    )
    try:
        free = decode_candidates(model, sample, DecodeConfig(max_len_b=10, min_len=0))
        banned = decode_candidates(model, sample, DecodeConfig(max_len_b=10, min_len=3))
    finally:
        handle.remove()
    assert free.lengths.tolist() == [1] * sample["nsentences"]  # EOS alone
    assert banned.lengths.tolist() == [4] * sample["nsentences"]  # 3 tokens, then EOS


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_scores_equal_teacher_forced_log_probs(untrained_models, arch):
    task, model, sample, _ = _setup(untrained_models, arch)
    cand = decode_candidates(
        model, sample, DecodeConfig(strategy="sample", num_candidates=3, max_len_b=8), generator=torch.Generator().manual_seed(3)
    )
    d = task.target_dictionary
    rows = cand.as_list()
    src = sample["net_input"]["src_tokens"].index_select(0, cand.source_index)
    src_len = sample["net_input"]["src_lengths"].index_select(0, cand.source_index)
    from fairseq.data import data_utils

    target = data_utils.collate_tokens(rows, d.pad(), d.eos())
    prev = data_utils.collate_tokens(rows, d.pad(), d.eos(), move_eos_to_beginning=True)
    if not bool(cand.finished.all()):  # rows without EOS: shift by hand
        prev = torch.cat([prev.new_full((prev.size(0), 1), d.eos()), target[:, :-1]], dim=1)
    model.eval()
    with torch.no_grad():
        lp = model.get_normalized_probs(model(src, src_len, prev), log_probs=True)
    tok = lp.gather(-1, target.unsqueeze(-1)).squeeze(-1).masked_fill(target.eq(d.pad()), 0).sum(1)
    assert torch.allclose(tok, cand.scores, atol=1e-4)


def test_sampling_shapes_seed_and_mode_restored(untrained_models):
    task, model, sample, _ = _setup(untrained_models, "transformer")
    model.train()
    cfg = DecodeConfig(strategy="sample", num_candidates=4, topk=5, max_len_b=9)
    a = decode_candidates(model, sample, cfg, generator=torch.Generator().manual_seed(7))
    b = decode_candidates(model, sample, cfg, generator=torch.Generator().manual_seed(7))
    assert model.training, "train mode must be restored after decoding"
    assert torch.equal(a.tokens, b.tokens), "same seed, dropout off: identical samples"
    bsz = sample["nsentences"]
    assert a.tokens.size(0) == bsz * 4 and a.source_index.tolist() == [i for i in range(bsz) for _ in range(4)]
    assert int(a.lengths.max()) <= 9
    # padding only after the end
    for row, n in zip(a.tokens, a.lengths.tolist()):
        assert row[n:].eq(task.target_dictionary.pad()).all()


def test_topk1_sampling_equals_greedy(untrained_models):
    task, model, sample, prefix = _setup(untrained_models, "transformer_lm")
    greedy = decode_candidates(model, sample, DecodeConfig(max_len_b=10), prefix_tokens=prefix)
    s = decode_candidates(model, sample, DecodeConfig(strategy="sample", topk=1, max_len_b=10), prefix_tokens=prefix)
    assert torch.equal(greedy.tokens, s.tokens)


def test_beam_returns_nbest_and_ref_ratio_limit(untrained_models):
    task, model, sample, _ = _setup(untrained_models, "transformer")
    cfg = DecodeConfig(strategy="beam", num_candidates=2, beam_size=3, max_len_ref_ratio=1.3)
    cand = decode_candidates(model, sample, cfg)
    longest = int(sample["target"].ne(task.target_dictionary.pad()).sum(1).max())
    assert cand.tokens.size(0) == 2 * sample["nsentences"]
    assert int(cand.lengths.max()) <= math.ceil(1.3 * longest) + 1  # + the EOS beam search forces


def test_bad_config_errors():
    with pytest.raises(ValueError, match="strategy"):
        DecodeConfig(strategy="nucleus")
    with pytest.raises(ValueError, match="greedy"):
        DecodeConfig(strategy="greedy", num_candidates=2)


@pytest.mark.parametrize("arch", ["transformer", "lstm", "transformer_lm"])
def test_sequence_log_probs_equal_decoder_scores(untrained_models, arch):
    from fairseq_ext.scoring.teacher_forced import sequence_log_probs

    task, model, sample, prefix = _setup(untrained_models, arch)
    cand = decode_candidates(model, sample, DecodeConfig(strategy="sample", num_candidates=2, max_len_b=7),
                             prefix_tokens=prefix, generator=torch.Generator().manual_seed(5))
    model.eval()
    lp = sequence_log_probs(model, sample, cand.as_list(), cand.source_index, prefix_tokens=prefix)
    assert lp.requires_grad
    assert torch.allclose(lp.detach(), cand.scores, atol=1e-4)
    # the same hypotheses as one padded tensor, right- or left-padded, one extra pad column
    pad = model.decoder.dictionary.pad()
    right = torch.cat([cand.tokens, cand.tokens.new_full((cand.tokens.size(0), 1), pad)], dim=1)
    shift = right.size(1) - cand.lengths
    left = torch.stack([row.roll(int(s)) for row, s in zip(right, shift)])
    assert left[:, 0].eq(pad).all() and not torch.equal(left, right)
    for padded in (right, left):
        lp = sequence_log_probs(model, sample, padded, cand.source_index, prefix_tokens=prefix)
        assert torch.allclose(lp.detach(), cand.scores, atol=1e-4)
