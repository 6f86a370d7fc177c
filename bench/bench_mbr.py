"""Utility computation of minimum Bayes risk (MBR) decoding: our costs
(``core.task_losses``, n-gram statistics cached per sentence, ``core.ngram_stats``)
against the ``mbrs`` package (naist-nlp/mbrs), on the same candidates and the same
metric, measured in the same run.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/bench_mbr.py`` (about two minutes on one
CPU core; ``--quick`` for a smoke run, ``--candidates FILE`` for real candidates,
``--json FILE`` to keep the rows). ``mbrs`` is a benchmark-only dependency:
``pip install --no-deps mbrs==0.1.8 && pip install fastchrf simple-parsing tabulate``.
mbrs installed without its neural-metric dependencies; their imports are stubbed: only
BLEU and chrF are used (``mbrs.metrics`` imports every metric module eagerly; the
modules it needs that are missing, among ``NEURAL_MODULES``, get empty stand-ins).
Without mbrs the bench prints a note and runs our rows only.

Candidates: per sentence, N strings that are both the hypotheses and the
pseudo-references (MBR with the candidates as references). ``--candidates FILE``: the
first ``--sentences`` lines of a JSON-lines file of our MBR decoder
(``--mbr-output-file``), each line's ``candidates`` repeated by its ``count`` (N is the
file's). Otherwise synthetic: per sentence a base of 5-15 words drawn from ``WORDS``,
and N variants of it (0-3 word substitutions, deletions or insertions), a quarter of
them copies of an earlier variant (a sample repeats itself); fixed seed. Duplicates are
scored like any string, in every row.

Metrics, configured alike on both sides: ``chrf`` (sacrebleu chrF: character order 6,
word order 0, beta 2; our cost is 1 - chrF / 100) and ``sbleu`` (sacrebleu sentence
BLEU, exp smoothing, effective order, 13a tokenisation; mbrs's ``MetricBLEU``).

Rows, per metric:
- ``ours, full matrix``: per sentence, the N x N costs in one call of the cost
  (hypotheses: each string N times; references: the strings tiled), then
  ``core.mbr.bayes_risk`` and ``core.mbr.ranking``; a fresh cost per row call, so its
  n-gram cache starts empty.
- ``ours, reference aggregation``: ``cost.aggregated_cost(strings, strings)``, ranked.
- ``mbrs, full matrix``: ``DecoderMBR`` with ``MetricChrF`` / ``MetricBLEU``
  (``num_workers=1``), ``decode(strings, strings, nbest=1)``. mbrs scores pairs in a
  ``ProcessPoolExecutor`` even with one worker: one process started per sentence,
  the pairs computed there.
- ``mbrs, full matrix, no pool``: the same metric with the pool bypassed (its
  ``pairwise_scores`` replaced by the base ``Metric.pairwise_scores``, a loop over its
  ``score``): mbrs's arithmetic without the process start.
- ``mbrs, full matrix, fastchrf`` (chrf only): ``fastchrf=True``, mbrs's Rust path.
- ``mbrs, reference aggregation``: ``DecoderAggregateMBR`` with the same metric (and
  ``, fastchrf`` for chrf).

Columns: utility evaluations per second (pairs scored / seconds; an aggregation row
counts N per sentence), ms per sentence, time / ours full (the row's time over ``ours,
full matrix`` of the same metric), and agreement: the share of sentences whose chosen
candidate string equals ``ours, full matrix``'s (and, in the last column, that of our
row of the same method). mbrs maximises utility and we minimise 1 - utility / 100, so
the choices agree except at (near-)ties, broken by each side's float32 rounding; a
reference aggregation row optimises another objective and may differ from the full
matrix. ``max |ours - mbrs|`` below the table compares the utilities of the first
sentence's full matrix (ours: 100 x (1 - cost)).

Time: wall clock (mbrs's pool computes in a child process, invisible to the process
clock), ``--warmup`` untimed rounds then ``--repeats`` interleaved rounds (the order
alternates), median; single-threaded. Memory: for one synthetic sentence of N strings
(N in 16, 32, 64, 128), the tracemalloc peak of one full matrix (Python allocations:
the n-gram caches and lists; torch's tensors and fastchrf's Rust heap are not seen):
ours, mbrs with its pool (the parent process only: the worker's memory is not
counted), mbrs without the pool. Printed, never asserted.
"""
import argparse
import json
import logging
import random
import sys
import tracemalloc
import types
from importlib.metadata import version
from typing import Callable, Dict, List, Optional, Tuple

import torch

from fairseq_ext.core.mbr import bayes_risk, ranking
from fairseq_ext.core.task_losses import build_task_loss

import timing  # bench/timing.py, beside this script

logging.getLogger("simple_parsing").setLevel(logging.WARNING)  # imported by mbrs; its debug lines are noise

WORDS = ("a", "the", "man", "woman", "child", "dog", "girl", "boy", "people", "group", "in", "on", "with", "of",
         "at", "is", "are", "sitting", "standing", "walking", "playing", "running", "holding", "wearing", "red",
         "blue", "white", "black", "green", "young", "old", "small", "large", "street", "water", "ball", "shirt",
         "hat", "front", "building", "field", "beach", "snow", "grass", "table", "bike", "car", "two", "three",
         "while", "and", "near", "down", "up", "an", "orange", "jacket", "crowd", "stage", "guitar")

# mbrs.metrics imports these for its neural metrics (BERTScore, BLEURT, COMET, MetricX); stand-ins when missing
NEURAL_MODULES = ("bert_score", "bleurt_pytorch", "comet", "huggingface_hub", "transformers")
METRICS = ("chrf", "sbleu")


class _Anything(type):
    """A stand-in class: any attribute is itself, calling it returns itself, it can be subclassed."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args, **kwargs):
        return cls


class _StandIn(types.ModuleType):
    """An empty module whose every name is a stand-in class (``from m import X`` works)."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})


def import_mbrs() -> Tuple[Optional[types.ModuleType], List[str], Optional[str]]:
    """(mbrs with ``metrics`` and ``decoders`` imported, the modules stubbed, why not: None when imported).
    Imports ``mbrs.metrics`` until it succeeds, giving each missing module of ``NEURAL_MODULES`` (and
    its parents) a stand-in; any other missing module: mbrs is unavailable."""
    stubbed: List[str] = []
    while True:
        try:
            import mbrs.decoders
            import mbrs.metrics
            return mbrs, stubbed, None
        except ModuleNotFoundError as err:
            missing = err.name or ""
            if missing.split(".")[0] not in NEURAL_MODULES or missing in sys.modules:
                return None, stubbed, f"{err}"
            for name in [n for n in sys.modules if n == "mbrs" or n.startswith("mbrs.")]:
                del sys.modules[name]  # a partial import: retried from scratch
            parts = missing.split(".")
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                if name not in sys.modules:
                    sys.modules[name] = _StandIn(name)
                    if i > 1:
                        setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[name])
                    stubbed.append(name)


def synthetic(sentences: int, n: int, seed: int = 0) -> List[List[str]]:
    """``sentences`` lists of ``n`` strings: variants of a random base sentence, some repeated."""
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        base = rng.choices(WORDS, k=rng.randint(5, 15))
        strings: List[str] = []
        while len(strings) < n:
            if strings and rng.random() < 0.25:
                strings.append(rng.choice(strings))
                continue
            words = list(base)
            for _ in range(rng.randint(0, 3)):
                i, op = rng.randrange(len(words)), rng.choice(("sub", "del", "ins"))
                if op == "sub":
                    words[i] = rng.choice(WORDS)
                elif op == "del" and len(words) > 5:
                    del words[i]
                elif op == "ins" and len(words) < 15:
                    words.insert(i, rng.choice(WORDS))
            strings.append(" ".join(words))
        out.append(strings)
    return out


def read_candidates(path: str, sentences: int) -> List[List[str]]:
    """The first ``sentences`` lines of an ``--mbr-output-file``, each line's candidates repeated by count."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if len(out) == sentences:
                break
            if line.strip():
                record = json.loads(line)
                out.append([c for c, k in zip(record["candidates"], record["count"]) for _ in range(k)])
    return out


def distinct(strings: List[str]) -> Dict[str, List]:
    """The candidates-file form of a list of strings: distinct strings in order, and their counts."""
    counts: Dict[str, int] = {}
    for s in strings:
        counts[s] = counts.get(s, 0) + 1
    return {"candidates": list(counts), "count": list(counts.values())}


def ours_cost(metric: str):
    return build_task_loss("chrf", beta=2, word_order=0) if metric == "chrf" else build_task_loss("sbleu")


def ours_full(metric: str, data: List[List[str]]) -> Tuple[int, List[str]]:
    cost, pairs, chosen = ours_cost(metric), 0, []
    for strings in data:
        n = len(strings)
        costs = cost([h for h in strings for _ in range(n)], strings * n).view(n, n)
        chosen.append(strings[int(ranking(bayes_risk(costs))[0])])
        pairs += n * n
    return pairs, chosen


def ours_aggregated(metric: str, data: List[List[str]]) -> Tuple[int, List[str]]:
    cost, chosen = ours_cost(metric), []
    for strings in data:
        chosen.append(strings[int(ranking(cost.aggregated_cost(strings, strings))[0])])
    return sum(len(s) for s in data), chosen


def mbrs_metric(mbrs, metric: str, fastchrf: bool = False, pool: bool = True):
    """mbrs's chrF (character order 6, word order 0, beta 2) or sentence BLEU (exp smoothing, effective
    order), one worker; ``pool=False``: its pairs scored in this process, one ``score`` call each."""
    m = mbrs.metrics
    if metric == "chrf":
        cls, cfg = m.MetricChrF, m.MetricChrF.Config(char_order=6, word_order=0, beta=2, num_workers=1,
                                                     fastchrf=fastchrf)
    else:
        cls, cfg = m.MetricBLEU, m.MetricBLEU.Config(smooth_method="exp", effective_order=True, num_workers=1)
    if not pool:
        cls = type(cls.__name__ + "InProcess", (cls,), {"pairwise_scores": m.Metric.pairwise_scores})
    return cls(cfg)


def mbrs_row(mbrs, metric: str, aggregate: bool, **options) -> Callable[[List[List[str]]], Tuple[int, List[str]]]:
    def run(data):
        decoders = mbrs.decoders
        decoder_cls = decoders.DecoderAggregateMBR if aggregate else decoders.DecoderMBR
        decoder = decoder_cls(decoder_cls.Config(), mbrs_metric(mbrs, metric, **options))
        chosen = [decoder.decode(strings, strings, nbest=1).sentence[0] for strings in data]
        return sum(len(s) if aggregate else len(s) ** 2 for s in data), chosen

    return run


def rows_of(mbrs, metric: str) -> Dict[str, Callable[[List[List[str]]], Tuple[int, List[str]]]]:
    """The benchmark's rows for ``metric``: name -> fn(data) -> (utility evaluations, chosen strings)."""
    rows = {"ours, full matrix": lambda data: ours_full(metric, data),
            "ours, reference aggregation": lambda data: ours_aggregated(metric, data)}
    if mbrs is not None:
        rows["mbrs, full matrix"] = mbrs_row(mbrs, metric, False)
        rows["mbrs, full matrix, no pool"] = mbrs_row(mbrs, metric, False, pool=False)
        if metric == "chrf":
            rows["mbrs, full matrix, fastchrf"] = mbrs_row(mbrs, metric, False, fastchrf=True)
        rows["mbrs, reference aggregation"] = mbrs_row(mbrs, metric, True)
        if metric == "chrf":
            rows["mbrs, reference aggregation, fastchrf"] = mbrs_row(mbrs, metric, True, fastchrf=True)
    return rows


def score_differences(mbrs, metric: str, strings: List[str]) -> Dict[str, float]:
    """max |ours - mbrs| over the utilities (0-100) of one sentence's full matrix, per mbrs variant."""
    n = len(strings)
    ours = 100 * (1 - ours_cost(metric)([h for h in strings for _ in range(n)], strings * n).view(n, n).double())
    variants = {"mbrs": {"pool": False}}
    if metric == "chrf":
        variants["mbrs, fastchrf"] = {"fastchrf": True}
    return {name: float((mbrs_metric(mbrs, metric, **opt).pairwise_scores(strings, strings).double() - ours)
                        .abs().max()) for name, opt in variants.items()}


def peak_kib(fn: Callable[[], object]) -> float:
    """tracemalloc's peak of one call of ``fn`` above what was allocated before it (KiB)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return (tracemalloc.get_traced_memory()[1] - base) / 1024
    finally:
        tracemalloc.stop()


def memory(mbrs, sizes) -> List[Dict]:
    out = []
    for n in sizes:
        data = synthetic(1, n, seed=n)
        for metric in METRICS:
            row = {"n": n, "metric": metric, "ours_kib": peak_kib(lambda: ours_full(metric, data))}
            if mbrs is not None:
                row["mbrs_pool_parent_kib"] = peak_kib(lambda: mbrs_row(mbrs, metric, False)(data))
                row["mbrs_no_pool_kib"] = peak_kib(lambda: mbrs_row(mbrs, metric, False, pool=False)(data))
            out.append(row)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidates", help="JSON lines of --mbr-output-file (default: synthetic candidates)")
    p.add_argument("--sentences", type=int, default=20)
    p.add_argument("--n", type=int, default=32, help="candidates per sentence (synthetic only)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="3 sentences x 8 candidates, 1 repeat (smoke test)")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args()
    if args.quick:
        args.sentences, args.n, args.warmup, args.repeats = 3, 8, 0, 1
    sizes = (16, 32) if args.quick else (16, 32, 64, 128)
    torch.set_num_threads(1)

    mbrs, stubbed, why = import_mbrs()
    if mbrs is None:
        print(f"mbrs not importable ({why}): our rows only")
    elif stubbed:
        print(f"mbrs {version('mbrs')}: stand-ins for {', '.join(sorted(stubbed))}")
    data = read_candidates(args.candidates, args.sentences) if args.candidates else synthetic(args.sentences, args.n)

    fns, names = {}, {}
    for metric in METRICS:
        for row, fn in rows_of(mbrs, metric).items():
            fns[f"{metric}: {row}"] = (lambda f: lambda: f(data))(fn)
            names[f"{metric}: {row}"] = (metric, row)
    ms, last = timing.interleaved(fns, args.warmup, args.repeats, torch.device("cpu"))

    rows = []
    for key, (metric, row) in names.items():
        pairs, chosen = last[key]
        same = "ours, reference aggregation" if "aggregation" in row else "ours, full matrix"
        ref, ref_same = last[f"{metric}: ours, full matrix"][1], last[f"{metric}: {same}"][1]
        rows.append({"metric": metric, "row": row, "evaluations": pairs, "ms": ms[key],
                     "evaluations_per_s": pairs / ms[key] * 1000, "ms_per_sentence": ms[key] / len(data),
                     "time_vs_ours_full": ms[key] / ms[f"{metric}: ours, full matrix"],
                     "agreement": sum(a == b for a, b in zip(chosen, ref)) / len(data),
                     "agreement_same_method": sum(a == b for a, b in zip(chosen, ref_same)) / len(data),
                     "chosen": chosen})
    diffs = {m: score_differences(mbrs, m, data[0]) for m in METRICS} if mbrs is not None else {}
    mem = memory(mbrs, sizes)

    n_mean = sum(len(s) for s in data) / len(data)
    source = args.candidates or "synthetic, seed 0"
    title = (f"MBR utilities: {len(data)} sentences x {n_mean:g} candidates ({source}), mean "
             f"{sum(len(c.split()) for s in data for c in s) / sum(len(s) for s in data):.1f} words, "
             f"1 thread, wall clock, median of {args.repeats}")
    text = timing.table(["metric", "row", "utility evals/s", "ms/sentence", "time / ours full", "agreement",
                         "agreement, same method"],
                        [[r["metric"], r["row"], f"{r['evaluations_per_s']:.0f}", f"{r['ms_per_sentence']:.2f}",
                          f"{r['time_vs_ours_full']:.2f}x", f"{r['agreement']:.2f}",
                          f"{r['agreement_same_method']:.2f}"] for r in rows], left=2)
    for metric, d in diffs.items():
        text += "\n" + f"{metric}: max |ours - mbrs| utility (0-100), first sentence: " + ", ".join(
            f"{k} {v:.2g}" for k, v in d.items())
    head = ["N", "metric", "ours KiB"] + (["mbrs KiB (parent only)", "mbrs no pool KiB"] if mbrs else [])
    text += "\n\nPeak Python memory (tracemalloc) of one sentence's full matrix, synthetic:\n" + timing.table(
        head, [[str(r["n"]), r["metric"], f"{r['ours_kib']:.0f}"]
               + ([f"{r['mbrs_pool_parent_kib']:.0f}", f"{r['mbrs_no_pool_kib']:.0f}"] if mbrs else [])
               for r in mem], left=2)
    settings = {"sentences": len(data), "candidates": args.candidates, "n_mean": n_mean, "warmup": args.warmup,
                "repeats": args.repeats, "quick": args.quick, "clock": "wall", "threads": 1,
                "mbrs": version("mbrs") if mbrs else None, "sacrebleu": version("sacrebleu"), "mbrs_unavailable": why,
                "stubbed": sorted(stubbed), "torch": torch.__version__}
    timing.report(title, text, {"settings": settings, "rows": rows, "score_differences": diffs, "memory": mem,
                                "inputs": [distinct(s) for s in data]}, args.json, indent=1)


if __name__ == "__main__":
    main()
