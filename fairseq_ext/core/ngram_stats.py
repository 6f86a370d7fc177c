"""Sentence BLEU and chrF from n-gram statistics extracted once per sentence, and both
against an aggregate of references.

Scoring many pairs of the same sentences (the cost matrix of MBR decoding: every
candidate against every pseudo-reference; MRT: the candidates of an input against its
reference) spends most of sacrebleu's ``sentence_score`` on tokenising and counting the
same strings again. ``BleuStats`` and ``ChrfStats`` keep each sentence's n-gram counts
(a bounded cache keyed by the string) and compute the score from them with sacrebleu's
own statistics and formula (its tokenisation, smoothing, effective order and brevity
penalty), so the value is sacrebleu's, to the last bit
(tests/test_mbr.py checks it on random pairs).

Reference aggregation (DeNero et al., 2009; Vamvas & Sennrich, 2024, "Linear-time MBR
decoding with reference aggregation"): the references of one input, with weights w_r
summing to 1, become one bag of expected n-gram counts sum_r w_r count_r(g) (BLEU: and
the expected reference length sum_r w_r |r|); a hypothesis is scored against that bag
as against a reference whose counts are fractional (matches min(count_h(g), E[count(g)])).
One score per hypothesis instead of one per pair: O(H + R) instead of O(H R).
"""
import math
from collections import Counter
from typing import Callable, List, Optional, Sequence, Tuple

CACHE_SIZE = 100_000  # sentences whose statistics are kept (cleared when full)


class _Cache:
    """``get(text)``: ``extract(text)``, computed once while the cache holds it."""

    def __init__(self, extract: Callable, size: int = CACHE_SIZE):
        self.extract, self.size, self.items = extract, size, {}

    def get(self, text: str):
        found = self.items.get(text)
        if found is None:
            if len(self.items) >= self.size:
                self.items.clear()
            found = self.items[text] = self.extract(text)
        return found


def _normalised(weights: Optional[Sequence[float]], n: int) -> List[float]:
    if weights is None:
        return [1.0 / n] * n
    if len(weights) != n:
        raise ValueError(f"{n} references but {len(weights)} weights")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"the reference weights must sum to > 0, got {total}")
    return [float(w) / total for w in weights]


def _expected_counts(bags: Sequence[Counter], weights: Sequence[float]) -> Counter:
    out: Counter = Counter()
    for bag, w in zip(bags, weights):
        for gram, count in bag.items():
            out[gram] += w * count
    return out


def bleu_from_stats(correct: List[float], total: List[float], sys_len: float, ref_len: float, bleu) -> float:
    """BLEU (0-100) from its statistics with the smoothing of ``bleu`` (a ``sacrebleu.metrics.BLEU``),
    the operations of sacrebleu's ``BLEU.compute_bleu`` in its order, so integer statistics give
    its value bit for bit; fractional ones (an aggregate's) are taken as they are (sacrebleu's
    score object formats lengths as integers)."""
    method, value, order = bleu.smooth_method, bleu.smooth_value, bleu.max_ngram_order
    if value is None:
        value = bleu.SMOOTH_DEFAULTS[method]
    bp = 1.0
    if sys_len < ref_len:
        bp = math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0
    if not any(correct):
        return 0.0
    correct, total = list(correct), list(total)
    precisions = [0.0] * order
    smooth_mteval, eff_order = 1.0, order
    for n in range(1, order + 1):
        if method == "add-k" and n > 1:
            correct[n - 1] += value
            total[n - 1] += value
        if total[n - 1] == 0:
            break
        if bleu.effective_order:
            eff_order = n
        if correct[n - 1] == 0:
            if method == "exp":
                smooth_mteval *= 2
                precisions[n - 1] = 100.0 / (smooth_mteval * total[n - 1])
            elif method == "floor":
                precisions[n - 1] = 100.0 * value / total[n - 1]
        else:
            precisions[n - 1] = 100.0 * correct[n - 1] / total[n - 1]
    return bp * math.exp(sum([math.log(p) if p > 0 else -9999999999 for p in precisions[:eff_order]]) / eff_order)


class BleuStats:
    """sacrebleu sentence BLEU of ``bleu`` (a ``sacrebleu.metrics.BLEU``) from cached
    word n-gram counts: ``score(hyp, ref)`` equals ``bleu.sentence_score(hyp, [ref]).score``."""

    def __init__(self, bleu):
        self.bleu = bleu
        self.order = bleu.max_ngram_order
        self.cache = _Cache(self._extract)

    def _extract(self, text: str) -> Tuple[Counter, int]:
        from sacrebleu.metrics.helpers import extract_all_word_ngrams

        return extract_all_word_ngrams(self.bleu._preprocess_segment(text), 1, self.order)

    def _score(self, hyp: str, ref_counts, ref_len: float) -> float:
        counts, hyp_len = self.cache.get(hyp)
        correct, total = [0] * self.order, [0] * self.order
        for gram, count in counts.items():
            n = len(gram) - 1
            total[n] += count
            if gram in ref_counts:
                correct[n] += min(count, ref_counts[gram])
        return bleu_from_stats(correct, total, hyp_len, ref_len, self.bleu)

    def score(self, hyp: str, ref: str) -> float:
        counts, length = self.cache.get(ref)
        return self._score(hyp, counts, length)

    def aggregate(self, refs: Sequence[str], weights: Optional[Sequence[float]] = None) -> Tuple[Counter, float]:
        """(expected n-gram counts, expected length) of ``refs`` under ``weights`` (uniform: None)."""
        w = _normalised(weights, len(refs))
        stats = [self.cache.get(r) for r in refs]
        return _expected_counts([s[0] for s in stats], w), sum(wi * s[1] for wi, s in zip(w, stats))

    def score_aggregate(self, hyp: str, aggregate: Tuple[Counter, float]) -> float:
        return self._score(hyp, *aggregate)


class ChrfStats:
    """sacrebleu sentence chrF of ``chrf`` (a ``sacrebleu.metrics.CHRF``, any beta, char and
    word order) from cached character (and word) n-gram counts: ``score(hyp, ref)`` equals
    ``chrf.sentence_score(hyp, [ref]).score``."""

    def __init__(self, chrf):
        self.chrf = chrf
        self.cache = _Cache(self._extract)

    def _extract(self, text: str) -> List[Counter]:
        from sacrebleu.metrics.helpers import extract_all_char_ngrams, extract_word_ngrams

        chrf = self.chrf
        text = chrf._preprocess_segment(text)
        bags = extract_all_char_ngrams(text, chrf.char_order, chrf.whitespace)
        if chrf.word_order > 0:
            words = chrf._remove_punctuation(text)
            bags.extend(extract_word_ngrams(words, n) for n in range(1, chrf.word_order + 1))
        return bags

    def _score(self, hyp: str, ref_bags: Sequence[Counter]) -> float:
        stats: List[float] = []
        for h, r in zip(self.cache.get(hyp), ref_bags):
            stats.extend(self.chrf._get_match_statistics(h, r))
        return self.chrf._compute_score_from_stats(stats).score

    def score(self, hyp: str, ref: str) -> float:
        return self._score(hyp, self.cache.get(ref))

    def aggregate(self, refs: Sequence[str], weights: Optional[Sequence[float]] = None) -> List[Counter]:
        """Per order, the expected n-gram counts of ``refs`` under ``weights`` (uniform: None)."""
        w = _normalised(weights, len(refs))
        bags = [self.cache.get(r) for r in refs]
        return [_expected_counts([b[i] for b in bags], w) for i in range(len(bags[0]))] if bags else []

    def score_aggregate(self, hyp: str, aggregate: List[Counter]) -> float:
        return self._score(hyp, aggregate)

