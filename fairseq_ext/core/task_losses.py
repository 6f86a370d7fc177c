"""Sequence-level task losses (costs) Δ(ŷ, y) with a batched API.

Every loss maps a batch of B hypotheses (and, when it needs them, B references)
to a float32 CPU tensor of shape (B,) of per-sequence costs; lower is better.

======== ========= ========= ====================================================
name     input     reference cost
======== ========= ========= ====================================================
sbleu    text      yes       1 - sentence BLEU / 100 (sacrebleu, smoothed), [0, 1]
chrf     text      yes       1 - sentence chrF / 100 (sacrebleu), [0, 1]
edit     tokens    yes       min(1, Levenshtein(ŷ, y) / |y|), [0, 1]
rep      tokens    no        1 - unique n-grams / n-grams of ŷ, [0, 1]
nonterm  tokens    no        1 if ŷ contains no EOS else 0
hamming  tokens    yes       Σ_{i<|y|} w(y_i) [ŷ_i != y_i], optionally normalized
======== ========= ========= ====================================================

"text" losses take strings that the caller has already BPE-removed and
detokenized (``detect_subword_scheme`` tells which subword segmentation a
vocabulary or a text looks like, so callers can check). "tokens" losses take token sequences (lists or tuples of ints or
strings, or 1-D LongTensors). For ``edit``, ``rep`` and ``hamming`` the caller
strips EOS and padding first; ``nonterm`` needs the EOS kept.

METEOR is deliberately not provided: it needs WordNet and paraphrase corpora
downloaded at run time. The ``lm`` cost (negative log-probability under a frozen
fairseq scorer) lives in a fairseq adapter, which registers it here with
``@register_task_loss("lm")``.

This module imports only torch (sacrebleu and editdistance lazily, when a loss
that needs them is built) and nothing else from the package, so
``scripts/score/score.py`` can load it by file path without importing fairseq.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, Iterable, Optional, Sequence, Union

import torch

Token = Union[int, str]
TokenSeq = Union[Sequence[Token], torch.Tensor]

TASK_LOSSES: dict[str, type["TaskLoss"]] = {}


def register_task_loss(name: str) -> Callable[[type["TaskLoss"]], type["TaskLoss"]]:
    """Class decorator adding a ``TaskLoss`` subclass to ``TASK_LOSSES`` under ``name``.

    Usable from any module; registering a name twice raises ``ValueError``.
    """

    def register(cls: type[TaskLoss]) -> type[TaskLoss]:
        if name in TASK_LOSSES:
            raise ValueError(
                f"task loss {name!r} is already registered (by {TASK_LOSSES[name].__qualname__})"
            )
        if not (isinstance(cls, type) and issubclass(cls, TaskLoss)):
            raise TypeError(f"task loss {name!r} must be a subclass of TaskLoss, got {cls!r}")
        if cls.input_kind not in ("text", "tokens"):
            raise ValueError(
                f"task loss {name!r}: input_kind must be 'text' or 'tokens', got {cls.input_kind!r}"
            )
        TASK_LOSSES[name] = cls
        return cls

    return register


def task_loss_names() -> list[str]:
    """Sorted names of all registered task losses."""
    return sorted(TASK_LOSSES)


def build_task_loss(name: str, **options) -> "TaskLoss":
    """Instantiate the task loss registered as ``name`` with keyword ``options``."""
    if name not in TASK_LOSSES:
        raise ValueError(
            f"unknown task loss {name!r}; valid names: {', '.join(task_loss_names())}"
        )
    cls = TASK_LOSSES[name]
    signature = inspect.signature(cls)
    try:
        signature.bind(**options)
    except TypeError as err:
        valid = [p for p in signature.parameters if p not in ("args", "kwargs")]
        raise ValueError(
            f"task loss {name!r}: {err}; its options are: {', '.join(valid) or '(none)'}"
        ) from None
    return cls(**options)


class TaskLoss:
    """A sequence-level cost Δ(ŷ, y), evaluated on a batch.

    Subclasses set ``needs_reference`` and ``input_kind`` ("text" or "tokens") and
    implement ``sentence_cost``; a loss that is cheaper batched (e.g. a model
    scorer) overrides ``batch_cost`` instead.
    """

    needs_reference: bool = True
    input_kind: str = "text"

    def __call__(self, hyps: Sequence, refs: Optional[Sequence] = None) -> torch.Tensor:
        """Costs of B hypotheses against B references.

        Args:
            hyps: B strings ("text") or B token sequences ("tokens").
            refs: B references of the same kind; required iff ``needs_reference``.

        Returns:
            float32 CPU tensor of shape (B,).
        """
        hyps = [self._check_item(h, "hypothesis") for h in hyps]
        if refs is None:
            if self.needs_reference:
                raise ValueError(f"{type(self).__name__} needs references, but refs is None")
        else:
            refs = [self._check_item(r, "reference") for r in refs]
            if len(refs) != len(hyps):
                raise ValueError(
                    f"{type(self).__name__}: {len(hyps)} hypotheses but {len(refs)} references"
                )
        costs = self.batch_cost(hyps, refs)
        return torch.as_tensor(costs, dtype=torch.float32).detach().cpu().reshape(len(hyps))

    def batch_cost(
        self, hyps: list, refs: Optional[list]
    ) -> Union[list[float], torch.Tensor]:
        """B costs; ``refs`` is None or has length B. Defaults to a loop over sentences."""
        if refs is None:
            return [self.sentence_cost(h, None) for h in hyps]
        return [self.sentence_cost(h, r) for h, r in zip(hyps, refs)]

    def sentence_cost(self, hyp, ref) -> float:
        """Cost of one hypothesis (str or list of tokens) against one reference."""
        raise NotImplementedError

    def _check_item(self, item, role: str):
        """Validate one input; token sequences come back as plain lists."""
        if self.input_kind == "text":
            if not isinstance(item, str):
                raise TypeError(
                    f"{type(self).__name__} takes text: each {role} must be a str, "
                    f"got {type(item).__name__}"
                )
            return item
        if isinstance(item, str):
            raise TypeError(
                f"{type(self).__name__} takes token sequences: split the {role} "
                f"string into tokens first"
            )
        if isinstance(item, torch.Tensor):
            if item.dim() != 1:
                raise ValueError(
                    f"{type(self).__name__}: each {role} tensor must be 1-D, got shape "
                    f"{tuple(item.shape)}"
                )
            return item.tolist()
        return list(item)


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


@register_task_loss("sbleu")
class SentenceBleuCost(TaskLoss):
    """1 - sBLEU / 100, sacrebleu's smoothed sentence BLEU with effective order."""

    needs_reference = True
    input_kind = "text"

    def __init__(self, smooth_method: str = "exp", smooth_value: Optional[float] = None) -> None:
        from sacrebleu.metrics import BLEU

        self.bleu = BLEU(
            smooth_method=smooth_method, smooth_value=smooth_value, effective_order=True
        )

    def sentence_cost(self, hyp: str, ref: str) -> float:
        return _clamp01(1.0 - self.bleu.sentence_score(hyp, [ref]).score / 100.0)


@register_task_loss("chrf")
class ChrfCost(TaskLoss):
    """1 - chrF / 100, sacrebleu's sentence chrF (character 6-grams, beta 2)."""

    needs_reference = True
    input_kind = "text"

    def __init__(self) -> None:
        from sacrebleu.metrics import CHRF

        self.chrf = CHRF()

    def sentence_cost(self, hyp: str, ref: str) -> float:
        return _clamp01(1.0 - self.chrf.sentence_score(hyp, [ref]).score / 100.0)


@register_task_loss("edit")
class EditCost(TaskLoss):
    """min(1, Levenshtein(ŷ, y) / |y|); for empty y: 0 if ŷ is empty else 1.

    The caller strips EOS and padding.
    """

    needs_reference = True
    input_kind = "tokens"

    def __init__(self) -> None:
        import editdistance

        self.distance = editdistance.eval

    def sentence_cost(self, hyp: list[Token], ref: list[Token]) -> float:
        if not ref:
            return 0.0 if not hyp else 1.0
        return min(1.0, self.distance(hyp, ref) / len(ref))


@register_task_loss("rep")
class RepetitionCost(TaskLoss):
    """1 - (unique n-grams of ŷ) / (n-grams of ŷ); 0 when |ŷ| < n.

    The caller strips EOS and padding.
    """

    needs_reference = False
    input_kind = "tokens"

    def __init__(self, n: int = 4) -> None:
        if n < 1:
            raise ValueError(f"rep: n must be >= 1, got {n}")
        self.n = n

    def sentence_cost(self, hyp: list[Token], ref: Optional[list[Token]]) -> float:
        return 1.0 - unique_ngram_share([hyp], self.n)


def unique_ngram_share(sequences: Sequence[Sequence[Token]], n: int, pooled: bool = True) -> float:
    """Share of unique n-grams: distinct n-grams / all n-grams, in [0, 1] (1: nothing repeats).

    The n-grams of each sequence are taken inside it (none spans two sequences).
    pooled: over the whole set, an n-gram counting once however many sequences
        hold it: the diversity of a set of samples (Deng et al., 2020, Figure 2
        right, compares sets of equal size this way). Otherwise the mean over the
        sequences of at least n tokens of their own share (1 - the ``rep`` cost):
        repetition inside a sequence only.
    Returns 1.0 when no sequence has n tokens.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [[tuple(s[i : i + n]) for i in range(len(s) - n + 1)] for s in sequences]
    grams = [g for g in grams if g]
    if not grams:
        return 1.0
    if pooled:
        return len({x for g in grams for x in g}) / sum(len(g) for g in grams)
    return sum(len(set(g)) / len(g) for g in grams) / len(grams)


@register_task_loss("nonterm")
class NonTerminationCost(TaskLoss):
    """1 if the hypothesis contains no ``eos`` token (it did not terminate), else 0."""

    needs_reference = False
    input_kind = "tokens"

    def __init__(self, eos: Token) -> None:
        self.eos = eos

    def sentence_cost(self, hyp: list[Token], ref: Optional[list[Token]]) -> float:
        return 0.0 if self.eos in hyp else 1.0


@register_task_loss("hamming")
class HammingCost(TaskLoss):
    """Weighted Hamming cost over the reference horizon.

    Δ(ŷ, y) = Σ_{i < |y|} w(y_i) [ŷ_i != y_i], where a missing ŷ_i (ŷ shorter
    than y) is a mismatch and positions past |y| are ignored. ``weights`` maps
    a label to its weight (default 1.0), e.g. {"O": 2.0}; its keys must have the
    type of the tokens (str labels or int ids). With ``normalize`` the sum is
    divided by Σ_i w(y_i), which is |y| for unit weights and keeps the cost in
    [0, 1]; an empty reference costs 0. The caller strips EOS and padding.
    """

    needs_reference = True
    input_kind = "tokens"

    def __init__(
        self, weights: Optional[dict[Token, float]] = None, normalize: bool = False
    ) -> None:
        self.weights = dict(weights or {})
        for label, w in self.weights.items():
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"hamming: weight of {label!r} must be finite and >= 0, got {w}")
        self.normalize = normalize

    def sentence_cost(self, hyp: list[Token], ref: list[Token]) -> float:
        w = [self.weights.get(label, 1.0) for label in ref]
        cost = sum(wi for i, wi in enumerate(w) if i >= len(hyp) or hyp[i] != ref[i])
        if self.normalize:
            total = sum(w)
            return cost / total if total > 0 else 0.0
        return float(cost)


def parse_label_weights(spec: str) -> dict[str, float]:
    """Parse ``"O=2.0,B-PER=1.5"`` into ``{"O": 2.0, "B-PER": 1.5}``.

    Whitespace around items is ignored; an empty or blank spec gives ``{}``. The
    label is everything before the last ``=``. Raises ``ValueError`` for an item
    without ``=``, an empty label, a weight that is not a finite number >= 0,
    or a label given twice.
    """
    weights: dict[str, float] = {}
    if not spec.strip():
        return weights
    for item in spec.split(","):
        item = item.strip()
        label, sep, value = item.rpartition("=")
        label = label.strip()
        if not sep:
            raise ValueError(
                f"label weight {item!r} in {spec!r} is not of the form LABEL=WEIGHT"
            )
        if not label:
            raise ValueError(f"label weight {item!r} in {spec!r} has an empty label")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(
                f"label weight {item!r} in {spec!r}: {value.strip()!r} is not a number"
            ) from None
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"label weight {item!r} in {spec!r}: weight must be finite and >= 0")
        if label in weights:
            raise ValueError(f"label {label!r} is given twice in {spec!r}")
        weights[label] = weight
    return weights


SUBWORD_MARKS = {
    "sentencepiece": "start with '\u2581'",  # word-initial pieces carry U+2581 (LOWER ONE EIGHTH BLOCK)
    "subword_nmt": "end with '@@'",  # word-internal pieces are followed by '@@'
}


def detect_subword_scheme(symbols: Iterable[str], min_share: float = 0.05) -> tuple[Optional[str], float]:
    """Which subword segmentation ``symbols`` look like, with the share of them marked.

    symbols: a vocabulary's symbols (special symbols left out) or the whitespace
        tokens of a text.
    Returns ``("sentencepiece", share)`` when the share of symbols starting with
    U+2581 is the larger mark and at least ``min_share``, ``("subword_nmt",
    share)`` likewise for symbols ending in ``@@``, else ``(None, larger share)``.
    Neither mark occurs in ordinary words, so a real subword vocabulary is far
    above the 5% default (sentencepiece: most words start a piece; subword-nmt:
    every split word leaves an ``@@`` piece), and a word vocabulary is at 0.
    """
    n = sp = bpe = 0
    for s in symbols:
        n += 1
        sp += s.startswith("\u2581")
        bpe += s.endswith("@@")
    if n == 0:
        return None, 0.0
    scheme, share = ("sentencepiece", sp / n) if sp >= bpe else ("subword_nmt", bpe / n)
    return (scheme if share > 0 and share >= min_share else None), share
