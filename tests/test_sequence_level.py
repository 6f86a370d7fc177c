"""fairseq adapters of the task losses: fast text conversion equals Dictionary.string,
the lm cost equals a teacher-forced log-probability, BatchScorer caches references
per batch only, cost specs parse with clear errors, --*-post-process auto follows the
target dictionary (and an explicit value that disagrees with it is warned about)."""
import copy
import functools
import logging
import os

import pytest
import torch
from fairseq.data import Dictionary

from fairseq_ext.synthetic import tiny_models, toy
from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig
from fairseq_ext.costs.sequence_cost import LMScorerCost, SequenceCost, resolve_post_process
from fairseq_ext.costs.batch_scorer import BatchScorer, parse_cost_spec

SP = "\u2581"


def _dict():
    d = Dictionary()
    for w in ["▁the", "▁ca", "t", "▁sat", "@@", "x@@", "y"]:
        d.add_symbol(w)
    return d


@pytest.mark.parametrize("post_process", [None, "sentencepiece", "@@ "])
def test_text_matches_dictionary_string(post_process):
    d = _dict()
    cost = SequenceCost("sbleu", d, post_process=post_process)
    rows = [torch.tensor([d.bos(), 4, 5, 6, d.unk(), 7, d.eos(), d.pad()]), torch.tensor([9, 10, 8, d.eos()])]
    for r in rows:  # fairseq's callers strip padding before Dictionary.string; we drop it
        assert cost.target.text(r) == d.string(r[r.ne(d.pad())], post_process)


def test_symbols_keep_eos_only_for_nonterm():
    d = _dict()
    hyp = [torch.tensor([4, 5, d.eos()]), torch.tensor([4, 5, 6])]
    assert SequenceCost("nonterm", d)(hyp).tolist() == [0.0, 1.0]
    assert SequenceCost("edit", d)(hyp, [torch.tensor([4, 5, d.eos()])] * 2).tolist() == pytest.approx([0.0, 0.5])


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_lm_cost_equals_teacher_forced(untrained_models, arch):
    """Each hypothesis's cost is its own teacher-forced NLL, with the sources in any order (candidate sets
    of several parameter sets one after another; fairseq's LSTM encoder needs its batch longest first)
    and repeated."""
    task, model = untrained_models[arch]
    d = task.target_dictionary
    src = [torch.tensor([5, 6, 7, d.eos()]), torch.tensor([8, d.eos()])]
    hyps = [torch.tensor([9, 10, d.eos()]), torch.tensor([11, d.eos()])]
    src, hyps = src + src[::-1] + src[:1], hyps + hyps[::-1] + hyps[1:]  # short sources before long ones
    cost = LMScorerCost(copy.deepcopy(model))(hyps, sources=src)  # a copy: the scorer freezes its parameters
    model.eval()
    with torch.no_grad():
        for i in range(len(src)):
            out = model(src[i].unsqueeze(0), torch.tensor([len(src[i])]), torch.cat([torch.tensor([d.eos()]), hyps[i][:-1]]).unsqueeze(0))
            lp = model.get_normalized_probs(out, log_probs=True)[0]
            expected = -lp.gather(-1, hyps[i].unsqueeze(-1)).sum()
            assert cost[i].item() == pytest.approx(expected.item(), abs=1e-4)


def test_batch_scorer_cache_follows_targets(untrained_models):
    task, model = untrained_models["transformer"]
    task.load_dataset("valid")
    ds = task.dataset("valid")
    a = ds.collater([ds[i] for i in range(4)])
    b = ds.collater([ds[i] for i in range(4, 8)])
    scorer = BatchScorer(task, "edit=1,rep=0.5")
    cfg = DecodeConfig(max_len_b=8)
    for sample in (a, b, a):
        decoded = decode_batch(model, sample, cfg)
        cand, batch = decoded.candidates, decoded.batch
        total, per = scorer.score(cand.as_list(), cand.source_index, batch)
        fresh = BatchScorer(task, "edit=1,rep=0.5").score(cand.as_list(), cand.source_index, batch)[0]
        assert torch.allclose(total, fresh)
        assert torch.allclose(total, per["edit"] + 0.5 * per["rep"])


def test_parse_cost_spec():
    assert [(t.name, t.weight) for t in parse_cost_spec("sbleu")] == [("sbleu", 1.0)]
    assert [(t.name, t.weight) for t in parse_cost_spec("edit=1,rep=0.5")] == [("edit", 1.0), ("rep", 0.5)]
    with pytest.raises(ValueError, match="'bleurt' is not a task loss"):
        parse_cost_spec("bleurt")
    with pytest.raises(ValueError, match="not a number"):
        parse_cost_spec("edit=x")
    with pytest.raises(ValueError, match="twice"):
        parse_cost_spec("edit,edit")


def _dict_of(symbols):
    d = Dictionary()
    for w in symbols:
        d.add_symbol(w)
    return d


SP_DICT = [SP + "the", SP + "ca", "t", SP + "sat", "."]
BPE_DICT = ["the", "ca@@", "t", "sat", "."]
WORD_DICT = ["the", "cat", "sat", "."]


@pytest.mark.parametrize("symbols,value,expected,warns", [
    (SP_DICT, "auto", "sentencepiece", False),
    (BPE_DICT, "auto", "subword_nmt", False),
    (WORD_DICT, "auto", None, False),
    (SP_DICT, "sentencepiece", "sentencepiece", False),
    (BPE_DICT, "@@ ", "@@ ", False),
    (WORD_DICT, "none", None, False),
    (WORD_DICT, "wordpiece", "wordpiece", False),  # a scheme the detector does not know: trusted
    (SP_DICT, "none", None, True),  # sBLEU on pieces
    (SP_DICT, None, None, True),
    (BPE_DICT, "sentencepiece", "sentencepiece", True),
    (WORD_DICT, "subword_nmt", "subword_nmt", True),
])
def test_resolve_post_process(caplog, symbols, value, expected, warns):
    with caplog.at_level(logging.INFO, logger="fairseq_ext.costs.sequence_cost"):
        assert resolve_post_process(value, _dict_of(symbols), "--mrt-post-process", ["sbleu"]) == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(warnings) == warns, warnings
    for message in warnings:
        assert message.startswith(f"--mrt-post-process {value or 'none'}") and "sbleu will be scored on" in message
    if value == "auto":  # the choice is logged once
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert len(infos) == 1 and infos[0].startswith(f"--mrt-post-process auto: {expected or 'none'}")


def test_resolve_post_process_rejects_unknown_value():
    with pytest.raises(ValueError, match="--pg-post-process: unknown value 'spm'"):
        resolve_post_process("spm", _dict_of(SP_DICT), "--pg-post-process", ["sbleu"])


def test_post_process_only_resolved_for_text_costs(untrained_models, caplog):
    task, _ = untrained_models["transformer"]
    with caplog.at_level(logging.INFO, logger="fairseq_ext.costs.sequence_cost"):
        assert BatchScorer(task, "edit", post_process="sentencepiece").post_process is None
    assert not caplog.records  # edit compares symbols: no BPE removal, nothing to say
    with pytest.raises(ValueError, match="--mrt-post-process: unknown value 'spm'"):
        BatchScorer(task, "edit", post_process="spm", criterion="mrt")


def _pieces(line, scheme):
    """A word-level line in sentencepiece / subword-nmt form: every word of three or more
    letters split after its second letter."""
    out = []
    for w in line.split():
        head, tail = w[:2], w[2:]
        if scheme == "sentencepiece":
            out += [SP + head] + ([tail] if tail else [])
        else:
            out += [head + "@@", tail] if tail else [head]
    return " ".join(out)


@pytest.fixture(scope="module", params=["sentencepiece", "subword_nmt"])
def pieces_bin(request, toy_raw, tmp_path_factory):
    """The toy corpus segmented into (hand-made) subword pieces, binarized: (scheme, data dir)."""
    raw = tmp_path_factory.mktemp(f"raw_{request.param}")
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            with open(os.path.join(toy_raw, f"{split}.{side}")) as f:
                (raw / f"{split}.{side}").write_text("".join(_pieces(l, request.param) + "\n" for l in f))
    return request.param, toy.binarize_translation(str(raw), str(tmp_path_factory.mktemp(f"bin_{request.param}")))


@pytest.mark.parametrize("criterion", [["--criterion", "mgs", "--mgs-task-loss", "sbleu"],
                                       ["--criterion", "mrt", "--mrt-task-loss", "chrf=1,edit=1"],
                                       ["--criterion", "pg"]])
def test_criteria_score_text_without_pieces_by_default(pieces_bin, toy_raw, criterion, caplog):
    """End to end from the command line's options: a criterion built by fairseq with its
    default --*-post-process scores the references of a BPE'd data set as the original words."""
    scheme, data = pieces_bin
    task, _, args = tiny_models.build_task_and_model(data, "translation", "transformer", criterion)
    with caplog.at_level(logging.INFO, logger="fairseq_ext.costs.sequence_cost"):
        crit = task.build_criterion(args)
    assert any(f"post-process auto: {scheme}" in r.getMessage() for r in caplog.records)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    batch = ds.collater([ds[i] for i in range(5)])
    seen = []
    for cost in crit.scorer.costs.values():  # record what the text losses receive
        if cost.loss.input_kind == "text":
            cost.from_converted = (lambda hyps, refs, sources=None, prepared=None, score=cost.from_converted:
                                   seen.append((hyps, refs)) or score(hyps, refs, sources, prepared))
    refs = crit.scorer.references(batch)
    crit.scorer.score(refs, torch.arange(len(refs)), batch)
    with open(os.path.join(toy_raw, "valid.tgt")) as f:
        words = f.read().splitlines()
    expected = [words[i] for i in batch["id"].tolist()]
    assert seen and all(hyps == refs == expected for hyps, refs in seen)


def test_forced_none_on_pieces_warns(pieces_bin, caplog):
    scheme, data = pieces_bin
    task, _, args = tiny_models.build_task_and_model(data, "translation", "transformer",
                                             ["--criterion", "mgs", "--mgs-post-process", "none"])
    with caplog.at_level(logging.INFO, logger="fairseq_ext.costs.sequence_cost"):
        assert task.build_criterion(args).scorer.post_process is None
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and warning[0].startswith("--mgs-post-process none, but")
    assert scheme in warning[0] or ("@@" if scheme == "subword_nmt" else SP) in warning[0]


@pytest.mark.parametrize("criterion", ["mgs", "mrt", "pg"])
def test_a_cost_spec_is_parsed_once_per_criterion_build(toy_bin, criterion, monkeypatch):
    """The option's check at parsing and the criterion's scorer share one parse of the spec (a
    spec not parsed before in this process: a fresh weight), and no name is split again later:
    the spec's parser and the options' splitter each run once per term."""
    from fairseq_ext.core import task_losses
    from fairseq_ext.synthetic import tiny_models

    calls = {"parse": 0, "split": 0}
    parse, split = task_losses._parse_spec.__wrapped__, task_losses.split_options

    def counted_parse(spec):
        calls["parse"] += 1
        return parse(spec)

    def counted_split(name):
        calls["split"] += 1
        return split(name)

    monkeypatch.setattr(task_losses, "_parse_spec", functools.lru_cache(maxsize=8)(counted_parse))
    monkeypatch.setattr(task_losses, "split_options", counted_split)
    spec = f"edit=1,chrf(beta=1)=0.{len(criterion)}25"
    task, _, args = tiny_models.build_task_and_model(toy_bin, "translation", "transformer",
                                                     ["--criterion", criterion, f"--{criterion}-task-loss", spec])
    crit = task.build_criterion(args)
    assert calls == {"parse": 1, "split": 2}
    assert [(t.name, t.weight) for t in crit.scorer.terms] == [("edit", 1.0), ("chrf(beta=1)", float(f"0.{len(criterion)}25"))]
