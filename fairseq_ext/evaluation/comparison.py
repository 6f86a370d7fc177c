"""Comparing systems trained with several seeds: mean +- std over seeds, paired tests
against a control, and the tables every experiment prints. The one module for these;
``scripts/score/compare_runs.py`` and every experiment's table use it.

Tests:
- ``paired_bootstrap_mean``: per-sentence values of two systems on the same sentences
  (Koehn 2004's paired bootstrap of the mean difference, shifted to the null);
- ``paired_bootstrap_corpus``: a corpus metric (BLEU, chrF), sacrebleu's ``--paired-bs``;
- ``welch``: two independent samples of run-level values (e.g. one F1 per seed).
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    from sacrebleu.metrics.base import Metric


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def format_mean_std(values: Sequence[float], digits: int = 2, scale: float = 1.0) -> str:
    """``"m +- s"`` of ``scale * values`` with ``digits`` decimals; the value alone for
    one value, ``"n/a"`` for none."""
    if not values:
        return "n/a"
    scaled = [scale * v for v in values]
    if len(scaled) == 1:
        return f"{scaled[0]:.{digits}f}"
    m, s = mean_std(scaled)
    return f"{m:.{digits}f} +- {s:.{digits}f}"


def paired_bootstrap_mean(sys_values: np.ndarray, base_values: np.ndarray, n_samples: int, seed: int) -> float:
    """Two-sided paired bootstrap p-value of the difference of the means of
    per-sentence values: the resampled differences d* are shifted to the null
    (d* - mean d*) and p = (#{|d* - mean d*| >= |d|} + 1) / (n + 1). (sacrebleu
    centres |d*| instead, which gives small p-values to nearly identical systems.)"""
    sys_values, base_values = np.asarray(sys_values, dtype=float), np.asarray(base_values, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(sys_values), size=(n_samples, len(sys_values)), replace=True)
    diff = sys_values - base_values
    observed = abs(diff.mean())
    if observed == 0:
        return 1.0
    resampled = diff[idx].mean(1)
    return (int(np.sum(np.abs(resampled - resampled.mean()) >= observed)) + 1) / (n_samples + 1)


def paired_bootstrap_corpus(hyps: Sequence[str], base: Sequence[str], refs: Sequence[str], n_samples: int,
                            metric: Metric) -> float:
    """sacrebleu's --paired-bs p-value of the corpus score of ``metric`` (a sacrebleu
    metric, e.g. ``BLEU()`` or ``CHRF()``; one reference a sentence), with its own seed,
    12345. Each sentence's sufficient statistics (BLEU: n-gram matches and lengths;
    chrF: hypothesis, reference and matched character and word n-gram counts per
    order) are extracted once, and a resample's corpus score is computed from the sum
    of its sentences' statistics. sacrebleu sums them in float32 (exact for counts
    below 2^24) and scores the float32 sum: a resample's chrF differs from the corpus
    chrF of its sentences by float32 rounding (about 1e-5). The resamples depend only
    on the seed, ``n_samples`` and the number of sentences, so every metric of a
    comparison is tested on the same resamples."""
    from sacrebleu.significance import PairedTest

    _, res = PairedTest([("baseline", list(base)), ("system", list(hyps))], {type(metric).__name__: metric},
                        [list(refs)], test_type="bs", n_samples=n_samples)()
    (scores,) = [v for k, v in res.items() if k != "System"]  # keyed by the score's name: BLEU, chrF2, ...
    return float(scores[1].p_value)


def _betacf(a: float, b: float, x: float, iters: int = 300, eps: float = 1e-15) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, iters + 1):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def welch(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, Optional[float]]:
    """(mean(xs) - mean(ys), two-sided p of Welch's t-test); p is None with fewer than
    2 values a side or no variance."""
    diff = sum(xs) / len(xs) - sum(ys) / len(ys)
    if len(xs) < 2 or len(ys) < 2:
        return diff, None
    vx, vy = mean_std(xs)[1] ** 2 / len(xs), mean_std(ys)[1] ** 2 / len(ys)
    if vx + vy == 0:
        return diff, None
    t = diff / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(xs) - 1) + vy ** 2 / (len(ys) - 1))
    return diff, betainc(df / 2.0, 0.5, df / (df + t * t))


def format_table(rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    """``rows[0]`` is the header. Markdown: ``| a | b |`` lines with a ``|---|`` rule
    under the header. Text: columns two spaces apart, the first left-aligned, the
    others right-aligned, a dashed rule under the header."""
    rows = [[str(c) for c in r] for r in rows]
    n = len(rows[0])
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines[:1] + ["|" + "---|" * n] + lines[1:])
    widths = [max(len(r[i]) for r in rows) for i in range(n)]

    def line(r: List[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return "\n".join([line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]])


def print_scores(results: dict, table: str, json_path: Optional[str]) -> None:
    """The score scripts' output: ``table`` on stdout, and ``results`` as JSON in
    ``json_path`` too; with ``json_path`` ``-`` the JSON on stdout instead of the table."""
    if json_path == "-":
        print(json.dumps(results, indent=2))
        return
    print(table)
    if json_path is not None:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
