"""Tests for fairseq_ext.core.task_losses: ranges, identities, hand-computed values, errors."""
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_ext.core.beam_relaxation import parse_label_weights
from fairseq_ext.core.subwords import detect_subword_scheme
from fairseq_ext.core.task_losses import (
    TASK_LOSSES,
    TaskLoss,
    build_task_loss,
    register_task_loss,
    task_loss_names,
)
from fairseq_ext.runtime.distributed import pooled_mean

FAST = settings(max_examples=50, deadline=None)
vocab = st.sampled_from(["a", "b", "c", "the", "cat", "sat"])
words = st.lists(vocab, max_size=12)
nonempty_words = st.lists(vocab, min_size=1, max_size=12)
tags = st.lists(st.sampled_from(["O", "B-PER", "I-PER"]), max_size=10)


def test_registry_lists_builtin_losses():
    assert {"sbleu", "chrf", "edit", "rep", "nonterm", "hamming"} <= set(task_loss_names())
    assert task_loss_names() == sorted(TASK_LOSSES)
    for name in ("sbleu", "chrf", "edit", "hamming"):
        assert TASK_LOSSES[name].needs_reference
    for name in ("rep", "nonterm"):
        assert not TASK_LOSSES[name].needs_reference
    assert TASK_LOSSES["sbleu"].input_kind == TASK_LOSSES["chrf"].input_kind == "text"
    assert TASK_LOSSES["edit"].input_kind == "tokens"


def test_unknown_loss_names_it_and_lists_valid_names():
    with pytest.raises(ValueError, match=r"'meteor'.*chrf, comet, edit, fluency, hamming"):
        build_task_loss("meteor")


def test_bad_options_are_reported():
    with pytest.raises(ValueError, match=r"'rep'.*'m'.*options are: n"):
        build_task_loss("rep", m=3)
    with pytest.raises(ValueError, match=r"'nonterm'.*eos"):
        build_task_loss("nonterm")
    with pytest.raises(ValueError, match="n must be >= 1"):
        build_task_loss("rep", n=0)


def test_register_from_outside_and_twice():
    @register_task_loss("_test_length")
    class Length(TaskLoss):
        needs_reference = False
        input_kind = "tokens"

        def sentence_cost(self, hyp, ref):
            return float(len(hyp))

    try:
        assert build_task_loss("_test_length")([[1, 2], [3]]).tolist() == [2.0, 1.0]
        with pytest.raises(ValueError, match="already registered"):
            register_task_loss("_test_length")(Length)
        with pytest.raises(ValueError, match="already registered"):
            register_task_loss("sbleu")(Length)
    finally:
        del TASK_LOSSES["_test_length"]
    with pytest.raises(TypeError, match="subclass of TaskLoss"):
        register_task_loss("_test_fn")(lambda hyps, refs: None)


def test_reference_checks():
    with pytest.raises(ValueError, match="needs references"):
        build_task_loss("edit")([["a"]])
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        build_task_loss("sbleu")(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="must be a str"):
        build_task_loss("chrf")([["a"]], [["a"]])
    with pytest.raises(TypeError, match="split"):
        build_task_loss("rep")(["a b c d e"])


def test_output_is_float32_cpu_vector():
    costs = build_task_loss("rep", n=2)([["a", "a"], torch.tensor([1, 2, 1, 2])])
    assert costs.dtype == torch.float32 and costs.device.type == "cpu" and costs.shape == (2,)
    empty = build_task_loss("edit")([], [])
    assert empty.dtype == torch.float32 and empty.shape == (0,)


def test_rep_hand_example():
    # 4-grams of "a b c d a b c d": abcd bcda cdab dabc abcd -> 5 total, 4 unique.
    assert build_task_loss("rep")(["a b c d a b c d".split()]).item() == pytest.approx(0.2)
    assert build_task_loss("rep")([["a", "a", "a"]]).item() == 0.0  # fewer than n tokens
    assert build_task_loss("rep", n=1)([["a", "a", "b", "b"]]).item() == pytest.approx(0.5)


def test_edit_hand_examples():
    edit = build_task_loss("edit")
    # "a b c" -> "a x c d": one substitution, one insertion; reference length 4.
    costs = edit(["a b c".split(), [], [], ["a"] * 9], ["a x c d".split(), [], ["a"], ["b"]])
    assert costs.tolist() == pytest.approx([0.5, 0.0, 1.0, 1.0])
    assert edit([[], ["z"]], [[], []]).tolist() == [0.0, 1.0]
    ids = edit([torch.tensor([5, 6, 7])], [torch.tensor([5, 9, 7, 8])])
    assert ids.item() == pytest.approx(0.5)


def test_hamming_hand_example_with_o_weight():
    hyp = ["O", "B-PER", "O"]
    ref = ["O", "O", "O", "I-PER"]
    # position 1: ref O mismatched (w=2); position 3: missing hyp, ref I-PER (w=1)
    plain = build_task_loss("hamming", weights={"O": 2.0})
    assert plain([hyp], [ref]).item() == pytest.approx(3.0)
    normalized = build_task_loss("hamming", weights={"O": 2.0}, normalize=True)
    assert normalized([hyp], [ref]).item() == pytest.approx(3.0 / 7.0)
    unweighted = build_task_loss("hamming", normalize=True)
    assert unweighted([hyp], [ref]).item() == pytest.approx(2.0 / 4.0)
    # positions past the reference are ignored; an empty reference costs 0
    assert unweighted([["O", "O", "x"], ["O"]], [["O", "O"], []]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="finite and >= 0"):
        build_task_loss("hamming", weights={"O": -1.0})


def test_sbleu_and_chrf_values():
    sbleu = build_task_loss("sbleu")
    costs = sbleu(["the cat sat on the mat", "dog runs far"], ["the cat sat on the mat", "a b c"])
    assert costs[0].item() == 0.0
    assert costs[1].item() > 0.95
    partial = sbleu(["the cat sat on a mat"], ["the cat sat on the mat"]).item()
    assert 0.0 < partial < 1.0
    floor = build_task_loss("sbleu", smooth_method="floor", smooth_value=0.1)
    assert 0.0 < floor(["the cat sat on a mat"], ["the cat sat on the mat"]).item() < 1.0
    chrf = build_task_loss("chrf")
    assert chrf(["the cat", "xyz"], ["the cat", "abc"]).tolist() == pytest.approx([0.0, 1.0])


def test_nonterm():
    nonterm = build_task_loss("nonterm", eos=2)
    costs = nonterm([[4, 5, 2], [4, 5, 6], [], torch.tensor([2])])
    assert costs.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert build_task_loss("nonterm", eos="</s>")([["a", "</s>"], ["a"]]).tolist() == [0.0, 1.0]


@FAST
@given(hyp=words, ref=words)
def test_costs_lie_in_unit_interval(hyp, ref):
    text_h, text_r = " ".join(hyp), " ".join(ref)
    costs = [
        build_task_loss("sbleu")([text_h], [text_r]),
        build_task_loss("chrf")([text_h], [text_r]),
        build_task_loss("edit")([hyp], [ref]),
        build_task_loss("rep", n=2)([hyp]),
        build_task_loss("nonterm", eos="the")([hyp]),
        build_task_loss("hamming", weights={"a": 3.0, "b": 0.5}, normalize=True)([hyp], [ref]),
    ]
    for cost in costs:
        assert 0.0 <= cost.item() <= 1.0


@FAST
@given(y=nonempty_words, labels=tags)
def test_reference_costs_vanish_on_the_reference(y, labels):
    text = " ".join(y)
    assert build_task_loss("sbleu")([text], [text]).item() == 0.0
    assert build_task_loss("chrf")([text], [text]).item() == 0.0
    assert build_task_loss("edit")([y], [y]).item() == 0.0
    assert build_task_loss("hamming", weights={"O": 2.0})([labels], [labels]).item() == 0.0


@FAST
@given(hyp=tags, ref=tags)
def test_hamming_normalized_is_unweighted_mismatch_rate(hyp, ref):
    got = build_task_loss("hamming", normalize=True)([hyp], [ref]).item()
    mismatches = sum(i >= len(hyp) or hyp[i] != r for i, r in enumerate(ref))
    assert got == pytest.approx(mismatches / len(ref) if ref else 0.0)


def test_parse_label_weights():
    assert parse_label_weights("O=2.0,B-PER=1.5") == {"O": 2.0, "B-PER": 1.5}
    assert parse_label_weights(" O = 2 , I-LOC=0 ") == {"O": 2.0, "I-LOC": 0.0}
    assert parse_label_weights("") == {}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("O", "LABEL=WEIGHT"),
        ("O=2,", "LABEL=WEIGHT"),
        ("=2", "empty label"),
        ("O=two", "'two' is not a number"),
        ("O=-1", "finite and >= 0"),
        ("O=nan", "finite and >= 0"),
        ("O=1,O=2", "given twice"),
    ],
)
def test_parse_label_weights_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_label_weights(spec)


def test_pooled_mean_without_distributed():
    mean = pooled_mean(torch.tensor([0.0, 1.0, 0.5, 0.5]))
    assert mean.dim() == 0 and mean.item() == pytest.approx(0.5)
    assert pooled_mean(torch.tensor([[1.0, 2.0], [3.0, 6.0]])).item() == pytest.approx(3.0)
    empty = pooled_mean(torch.zeros(0))
    assert empty.item() == 0.0 and not torch.isnan(empty)


SP = "\u2581"


@pytest.mark.parametrize("symbols,scheme", [
    ([SP + "the", SP + "ca", "t", SP + "sat", ".", SP], "sentencepiece"),
    (["the", "ca@@", "t", "sat", ".", "re@@", "d@@", "dish"], "subword_nmt"),
    (["the", "cat", "sat", ".", "e-mail"], None),
    ([], None),
])
def test_detect_subword_scheme(symbols, scheme):
    assert detect_subword_scheme(symbols)[0] == scheme


def test_detect_subword_scheme_share_and_threshold():
    words = [f"w{i}" for i in range(38)]
    # 2 of 40 symbols marked: 5%, at the default threshold; 1 of 40 is a stray symbol, not a scheme
    assert detect_subword_scheme(words + ["ab@@", "c@@"]) == ("subword_nmt", 0.05)
    assert detect_subword_scheme(words + ["ab@@", "c"]) == (None, 0.025)
    assert detect_subword_scheme(words + ["ab@@", "c"], min_share=0.01) == ("subword_nmt", 0.025)
    # both marks: the more frequent one wins
    assert detect_subword_scheme([SP + "a", SP + "b", "c@@", "d"]) == ("sentencepiece", 0.5)
    assert detect_subword_scheme([SP + "a", "b@@", "c@@", "d"]) == ("subword_nmt", 0.5)


def test_options_in_parentheses():
    """A cost's options after its name: values typed, a weight after them, commas inside
    the parentheses kept, bad option lists refused naming the cost's options."""
    from fairseq_ext.core.task_losses import parse_task_loss_spec, split_options

    assert split_options("comet(model=Unbabel/wmt22-comet-da,batch_size=16)") == (
        "comet", {"model": "Unbabel/wmt22-comet-da", "batch_size": 16})
    assert split_options("chrf(beta=0.5,word_order=2)") == ("chrf", {"beta": 0.5, "word_order": 2})
    assert split_options("rep") == ("rep", {})
    terms = parse_task_loss_spec("chrf(beta=1,word_order=2)=0.5,rep(n=3)")
    assert [(t.name, t.base, dict(t.options), t.weight) for t in terms] == [
        ("chrf(beta=1,word_order=2)", "chrf", {"beta": 1, "word_order": 2}, 0.5), ("rep(n=3)", "rep", {"n": 3}, 1.0)]
    for bad, message in [("chrf(gamma=1)", "its options are: beta, word_order"), ("chrf(beta)", "is not key=value"),
                         ("chrf(beta=1", "one pair of parentheses"), ("edit(n=1)", "its options are: (none)")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_task_loss_spec(bad)
    # chrF with beta 1 weights precision and recall alike: a hypothesis that repeats the
    # reference twice has full recall and half the precision (F1 below F2)
    hyp, ref = "the cat sat the cat sat", "the cat sat"
    f2 = 1 - float(build_task_loss("chrf")([hyp], [ref])[0])
    f1 = 1 - float(build_task_loss("chrf(beta=1)")([hyp], [ref])[0])
    assert f1 < f2 and f2 > 0.5
