"""The task losses on token sequences: ``edit`` (Levenshtein distance over the reference's
length), ``rep`` (repeated n-grams, with ``unique_ngram_share``, which the logs and the
residual EBM's evaluation use too), ``nonterm`` (no EOS) and ``hamming`` (per-label
weighted mismatches). Registered by name when the package ``fairseq_ext.core`` is imported."""
from __future__ import annotations

import math
from typing import Optional, Sequence

from fairseq_ext.core.task_losses import TaskLoss, Token, register_task_loss


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
