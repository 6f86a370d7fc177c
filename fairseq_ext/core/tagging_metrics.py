"""Tagging metrics: span-level precision / recall / F1 with the semantics of the
CoNLL shared tasks' ``conlleval`` script, and token-level accuracy.

NER (thesis sections 3.3.3 and 4.5.1, Tables 3.1 and 4.2) is scored by F1 over
entity chunks as ``conlleval.pl`` reads them; POS tagging (and supertagging,
Tables 4.1, 5.2, 5.3) by token accuracy.

conlleval semantics, reproduced exactly (``conlleval_counts``):

- a label ``X-TYPE`` has chunk tag X (``B``, ``I``, ``E``, ...) and type TYPE
  (split at the first ``-``); a label without ``-`` (``O``) has type "";
- a chunk starts at ``B``, at ``I`` or ``E`` after ``O`` (so broken BIO such as
  ``O I-PER`` or a sentence that opens with ``I-PER`` starts a chunk) and
  wherever the type changes (``B-PER I-LOC`` is two chunks); it ends before
  ``B`` or ``O`` and where the type changes (``startOfChunk`` / ``endOfChunk``);
- a predicted chunk is correct when it starts and ends where a gold chunk does
  and has its type; sentence boundaries end every chunk;
- precision = correct / predicted chunks, recall = correct / gold chunks,
  F1 = 2PR / (P + R), all in percent (0 when undefined), overall and per type
  (``f1_macro``: the mean over types, the thesis's Table 4.2 caption says macro F1);
- accuracy = tokens whose whole label is correct / tokens.

Pure Python, no torch or fairseq.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, Sequence, Tuple

_CHUNK_LABEL = re.compile(r"^[BIES]-.+$")


def split_label(label: str) -> Tuple[str, str]:
    """``"B-PER"`` -> ``("B", "PER")``, ``"O"`` -> ``("O", "")`` (conlleval's ``/^([^-]*)-(.*)$/``)."""
    tag, sep, type_ = label.partition("-")
    return (tag, type_) if sep else (label, "")


def chunk_end(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval ``endOfChunk``: did a chunk end between the previous and this token?"""
    if (prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}:
        return True
    if prev_tag not in ("O", ".") and prev_type != type_:
        return True
    return prev_tag in ("[", "]")


def chunk_start(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval ``startOfChunk``: did a chunk start at this token?"""
    if (prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}:
        return True
    if tag not in ("O", ".") and prev_type != type_:
        return True
    return tag in ("[", "]")


@dataclass
class ChunkCounts:
    """conlleval's counters. ``gold``, ``pred`` and ``correct`` count chunks per type."""

    tokens: int = 0
    correct_tags: int = 0
    gold: Counter = field(default_factory=Counter)
    pred: Counter = field(default_factory=Counter)
    correct: Counter = field(default_factory=Counter)


def _check_aligned(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold labels but {len(p)} predicted")


def conlleval_counts(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> ChunkCounts:
    """Run conlleval's chunk state machine over B sentences.

    gold, pred: B label sequences each, sentence i of equal length in both. Every
    sentence is followed by a boundary (conlleval's blank line: gold and
    predicted label ``O``, not counted as a token).
    """
    _check_aligned(gold, pred)
    counts = ChunkCounts()
    last_g, last_g_type, last_p, last_p_type = "O", "", "O", ""
    in_correct = False
    stream = []  # (gold label, predicted label, is a token); boundaries are not tokens
    for g_sent, p_sent in zip(gold, pred):
        stream += [(g, p, True) for g, p in zip(g_sent, p_sent)] + [("O", "O", False)]
    for g_label, p_label, is_token in stream:
        g, g_type = split_label(g_label)
        p, p_type = split_label(p_label)
        g_end = chunk_end(last_g, g, last_g_type, g_type)
        p_end = chunk_end(last_p, p, last_p_type, p_type)
        g_start = chunk_start(last_g, g, last_g_type, g_type)
        p_start = chunk_start(last_p, p, last_p_type, p_type)
        if in_correct:
            if g_end and p_end and last_p_type == last_g_type:
                in_correct = False
                counts.correct[last_g_type] += 1
            elif g_end != p_end or p_type != g_type:
                in_correct = False
        if g_start and p_start and p_type == g_type:
            in_correct = True
        if g_start:
            counts.gold[g_type] += 1
        if p_start:
            counts.pred[p_type] += 1
        if is_token:
            counts.tokens += 1
            counts.correct_tags += int(g == p and g_type == p_type)
        last_g, last_g_type, last_p, last_p_type = g, g_type, p, p_type
    if in_correct:
        counts.correct[last_g_type] += 1
    return counts


def precision_recall_f1(correct: int, predicted: int, gold: int) -> Tuple[float, float, float]:
    """(P, R, F1) in percent; each is 0 where its denominator is 0 (as conlleval)."""
    p = 100.0 * correct / predicted if predicted else 0.0
    r = 100.0 * correct / gold if gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def _row(correct: int, predicted: int, gold: int) -> Dict[str, float]:
    p, r, f = precision_recall_f1(correct, predicted, gold)
    return {"precision": p, "recall": r, "f1": f, "gold": gold, "predicted": predicted, "correct": correct}


def chunk_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> Dict:
    """Span-level scores (conlleval): overall (micro) precision / recall / f1 and
    token accuracy (percent), ``f1_macro`` (mean of the per-type F1s), chunk and
    token counts, and ``per_type`` rows (the empty type, a chunk of a label without
    ``-``, counts overall but has no row, as in conlleval)."""
    c = conlleval_counts(gold, pred)
    overall = _row(sum(c.correct.values()), sum(c.pred.values()), sum(c.gold.values()))
    types = sorted((set(c.gold) | set(c.pred)) - {""})
    per_type = {t: _row(c.correct[t], c.pred[t], c.gold[t]) for t in types}
    return {
        **overall,
        "f1_macro": sum(r["f1"] for r in per_type.values()) / len(per_type) if per_type else 0.0,
        "accuracy": 100.0 * c.correct_tags / c.tokens if c.tokens else 0.0,
        "tokens": c.tokens,
        "per_type": per_type,
    }


def token_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> Dict:
    """Token-level scores: accuracy (percent), token count, and ``per_label`` rows
    (precision / recall / f1 of each label as a token class)."""
    _check_aligned(gold, pred)
    n_gold: Counter = Counter()
    n_pred: Counter = Counter()
    n_correct: Counter = Counter()
    for g_sent, p_sent in zip(gold, pred):
        for g, p in zip(g_sent, p_sent):
            n_gold[g] += 1
            n_pred[p] += 1
            n_correct[g] += int(g == p)
    tokens = sum(n_gold.values())
    labels = sorted(set(n_gold) | set(n_pred))
    return {
        "accuracy": 100.0 * sum(n_correct.values()) / tokens if tokens else 0.0,
        "tokens": tokens,
        "per_label": {lab: _row(n_correct[lab], n_pred[lab], n_gold[lab]) for lab in labels},
    }


def is_chunk_tagset(labels: Iterable[str]) -> bool:
    """True when every label is ``O`` or ``B-``/``I-``/``E-``/``S-`` + type (a span tag set)."""
    labels = list(labels)
    return bool(labels) and all(lab == "O" or _CHUNK_LABEL.match(lab) for lab in labels)

