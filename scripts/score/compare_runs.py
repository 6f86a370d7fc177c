#!/usr/bin/env python
r"""Compare systems trained with several seeds against a control: mean +- std over
seeds of each metric, and paired bootstrap tests against the control.

    python scripts/score/compare_runs.py --control mle_cont \
        mle_cont=c1.out,c2.out,c3.out mgs=m1.out,m2.out,m3.out mrt=r1.out,r2.out,r3.out

Each ``LABEL=FILE[,FILE...]`` gives one fairseq-generate output (or, with
``--text``, a file of detokenized hypotheses, one a line, then ``--ref`` is
required) per seed; the i-th file of a system is paired with the i-th file of the
control (same seed, same test set). Metrics: corpus BLEU (sacrebleu's ``BLEU()``,
13a tokenization) and corpus chrF (sacrebleu's ``CHRF()``: character n-grams up to
6, no word n-grams, beta 2, i.e. chrF2, not chrF++), and scripts/score/score.py's
mean sentence BLEU, edit cost, rep-4 and hypothesis length; with ``--max-len``
(text completion) also non-termination. The printed table is headed by a line per
corpus metric shown: its sacrebleu name, settings and signature (also under
``signatures`` in ``--json``).

Significance: for the corpus metrics (BLEU, chrF), sacrebleu's paired bootstrap
resampling (``--paired-bs``: Koehn 2004 as sacrebleu implements it, two-sided,
``--bootstrap`` resamples drawn with seed 12345, the same resamples for BLEU and
chrF, each resample's corpus score computed from its sentences' summed sufficient
statistics; p = (c + 1) / (n + 1) with c the resamples whose centred absolute
difference exceeds the observed one, at least 1 / (n + 1); for identical systems it
is that floor, and for nearly identical ones it can be small although the
difference is negligible: read it with the difference); for the sentence-level
metrics, a paired bootstrap of the mean per-sentence difference, shifted to the
null. Reported per seed pair, and pooled: the seeds' test sets concatenated (each
system's seed i against the control's seed i).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

from fairseq_ext.core.task_losses import build_task_loss
from fairseq_ext.evaluation.comparison import format_table, mean_std, paired_bootstrap_corpus, paired_bootstrap_mean
from fairseq_ext.evaluation.generate_output import read_generate_file, read_lines
from fairseq_ext.evaluation.translation import nonterm_costs

CORPUS_METRICS = {"bleu": BLEU, "chrf": CHRF}  # name -> sacrebleu metric, built with its defaults
SENTENCE_METRICS = {  # name -> per-sentence values of (hyps, refs)
    "sentence_bleu": lambda h, r: 100.0 * (1.0 - build_task_loss("sbleu")(h, r).double()),
    "edit": lambda h, r: build_task_loss("edit")([x.split() for x in h],
                                                                          [x.split() for x in r]).double(),
    "rep4": lambda h, r: build_task_loss("rep", n=4)([x.split() for x in h]).double(),
    "avg_hyp_len": lambda h, r: np.array([len(x.split()) for x in h], dtype=float),
}
METRICS = list(CORPUS_METRICS) + list(SENTENCE_METRICS)
LOWER_IS_BETTER = {"edit", "rep4", "nonterm"}


def read_system(path: str, text: bool, refs: Optional[List[str]]) -> tuple[List[str], List[str], List[str]]:
    """(hypotheses, references, raw hypotheses) of one run: a fairseq-generate output
    (raw: the H- texts, in the decoder's tokens), or with ``text`` one hypothesis a
    line against ``refs`` (raw: the hypotheses)."""
    if text:
        hyps = read_lines(path)
        if refs is None or len(hyps) != len(refs):
            raise SystemExit(f"compare_runs: {path}: {len(hyps)} lines, --ref has {len(refs or [])}")
        return hyps, refs, hyps
    g = read_generate_file(path)  # PATH, or PATH.gz where PATH is absent
    if refs is None:
        return g.hypotheses, g.references, g.raw
    if max(g.ids) >= len(refs):
        raise SystemExit(f"compare_runs: {path}: sentence id {max(g.ids)}, --ref has {len(refs)} lines")
    return g.hypotheses, [refs[i] for i in g.ids], g.raw


def sentence_values(hyps: List[str], refs: List[str], raw: List[str],
                    max_len: Optional[int] = None) -> Dict[str, np.ndarray]:
    """The per-sentence values of every sentence-level metric of one run; with
    ``max_len``, also ``nonterm`` (scripts/score/score.py's, on the raw hypotheses)."""
    out = {k: np.asarray(f(hyps, refs), dtype=float) for k, f in SENTENCE_METRICS.items()}
    if max_len is not None:
        out["nonterm"] = nonterm_costs(raw, max_len).double().numpy()
    return out


def describe(metric: Metric, name: str) -> str:
    """Which corpus score ``metric`` computed (after scoring): sacrebleu's score name,
    chrF's orders and beta spelled out, and sacrebleu's signature."""
    settings = (f" (char order {metric.char_order}, word order {metric.word_order}, beta {metric.beta})"
                if isinstance(metric, CHRF) else "")
    return f"sacrebleu {name}{settings}, {metric.get_signature().format()}"


def compare(systems: Dict[str, List[tuple[List[str], List[str], List[str]]]], control: str, n_samples: int,
            max_len: Optional[int] = None) -> dict:
    """Per system: per-seed metrics, mean and std, the corpus metrics' descriptions
    (``describe``), and, against ``control``, the difference of the means and the
    paired p-values (per seed pair and pooled)."""
    ctrl = systems[control]
    values = {label: [sentence_values(h, r, raw, max_len) for h, r, raw in runs] for label, runs in systems.items()}
    sentence_metrics = list(values[control][0])
    metrics = list(CORPUS_METRICS) + sentence_metrics
    out = {}
    for label, runs in systems.items():
        corpus, signatures = {}, {}
        for k, metric_class in CORPUS_METRICS.items():
            metric = metric_class()
            corpus[k] = [metric.corpus_score(h, [r]) for h, r, _ in runs]
            signatures[k] = describe(metric, corpus[k][0].name)
        per_seed = [{**{k: scores[i].score for k, scores in corpus.items()},
                     **{k: float(v.mean()) for k, v in vals.items()}} for i, vals in enumerate(values[label])]
        stats = {k: mean_std([row[k] for row in per_seed]) for k in metrics}
        details = [{"bp": b.bp, "len_ratio": b.sys_len / b.ref_len,
                    **{f"prec{n + 1}": b.precisions[n] for n in range(4)}} for b in corpus["bleu"]]
        out[label] = {"seeds": len(runs), "per_seed": per_seed, "mean": {k: v[0] for k, v in stats.items()},
                      "std": {k: v[1] for k, v in stats.items()}, "signatures": signatures,
                      "bleu_details": {k: mean_std([d[k] for d in details])[0] for k in details[0]}}
    for label, runs in systems.items():
        if label == control:
            continue
        if len(runs) != len(ctrl):
            raise SystemExit(f"compare_runs: {label} has {len(runs)} runs, the control {control} {len(ctrl)}: "
                             f"runs are paired by position (seed)")
        if any(r != br for (_, r, _), (_, br, _) in zip(runs, ctrl)):
            raise SystemExit(f"compare_runs: {label} and {control} were not scored on the same references")
        pooled_h, pooled_b = [x for h, _, _ in runs for x in h], [x for b, _, _ in ctrl for x in b]
        pooled_r = [x for _, r, _ in runs for x in r]
        p, pooled = {}, {}
        for k, metric_class in CORPUS_METRICS.items():
            p[k] = [paired_bootstrap_corpus(h, b, r, n_samples, metric_class())
                    for (h, r, _), (b, _, _) in zip(runs, ctrl)]
            pooled[k] = paired_bootstrap_corpus(pooled_h, pooled_b, pooled_r, n_samples, metric_class())
        for k in sentence_metrics:
            sys_vals, base_vals = [v[k] for v in values[label]], [v[k] for v in values[control]]
            p[k] = [paired_bootstrap_mean(sv, bv, n_samples, 12345) for sv, bv in zip(sys_vals, base_vals)]
            pooled[k] = paired_bootstrap_mean(np.concatenate(sys_vals), np.concatenate(base_vals), n_samples, 12345)
        out[label].update(p_value=p, p_value_pooled=pooled,
                          diff={k: out[label]["mean"][k] - out[control]["mean"][k] for k in metrics})
    return out


def markdown(result: dict, control: str, metrics: Sequence[str]) -> str:
    """A line per corpus metric shown (which sacrebleu score it is, ``describe``), then
    the table: one row per system, mean +- std per metric; for the others, the
    difference to the control and the pooled p-value (per-seed p-values in brackets)."""
    header = [f"{m}: {result[control]['signatures'][m]}" for m in metrics if m in CORPUS_METRICS]
    rows = [["system", "seeds"] + list(metrics)]
    for label, e in result.items():
        cells = [label + (" (control)" if label == control else ""), str(e["seeds"])]
        for m in metrics:
            d = 3 if m in LOWER_IS_BETTER else 2  # edit, rep-4 and nonterm are fractions
            cell = f"{e['mean'][m]:.{d}f} +- {e['std'][m]:.{d}f}"
            if label != control:
                seeds = ", ".join(f"{p:.3f}" for p in e["p_value"][m])
                cell += f" ({e['diff'][m]:+.{d}f}; p = {e['p_value_pooled'][m]:.3f} [{seeds}])"
            cells.append(cell)
        rows.append(cells)
    table = format_table(rows, markdown=True)
    return "\n".join(header + ["", table]) if header else table


def markdown_bleu_details(result: dict) -> str:
    """Corpus BLEU's parts, mean over seeds: brevity penalty, hypothesis / reference
    length ratio and the 1- to 4-gram precisions (where a BLEU difference comes
    from: length or n-gram matches)."""
    keys = ["bp", "len_ratio", "prec1", "prec2", "prec3", "prec4"]
    rows = [["system", "BP", "length ratio", "1-gram prec", "2-gram", "3-gram", "4-gram"]]
    for label, e in result.items():
        d = e["bleu_details"]
        rows.append([label] + [f"{d[k]:.3f}" if k in ("bp", "len_ratio") else f"{d[k]:.2f}" for k in keys])
    return format_table(rows, markdown=True)


def main(argv: Optional[List[str]] = None) -> None:
    from fairseq_ext.runtime import cli

    cli.install()  # a ConfigError ends the command with one line, exit 2
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("systems", nargs="+", metavar="LABEL=FILE[,FILE...]", help="one file per seed")
    parser.add_argument("--control", required=True, help="label of the control system")
    parser.add_argument("--metrics", default="bleu,chrf,sentence_bleu,edit,avg_hyp_len",
                        help=f"comma-separated, from {','.join(METRICS)}")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (sacrebleu's default 1000)")
    parser.add_argument("--text", action="store_true", help="files hold plain hypotheses (needs --ref)")
    parser.add_argument("--ref", default=None,
                        help="the raw references, one a line in the test set's order: required with --text; with "
                             "fairseq-generate outputs, scored instead of their T- lines (which fairseq rebuilt from "
                             "the binarized data: control characters dropped, spaces collapsed)")
    parser.add_argument("--max-len", type=int, default=None,
                        help="text completion: the decoding limit; adds the metric nonterm (hypotheses of this "
                             "many tokens did not end)")
    parser.add_argument("--bleu-details", action="store_true",
                        help="also a table of corpus BLEU's parts: brevity penalty, length ratio, n-gram precisions")
    parser.add_argument("--json", default=None, help="write the full result here")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # its INFO lines are not the table's
    metrics = args.metrics.split(",")
    known = METRICS + (["nonterm"] if args.max_len is not None else [])
    bad = [m for m in metrics if m not in known]
    if bad:
        parser.error(f"--metrics: unknown {bad}; choose from {known}" + ("" if args.max_len else
                     " (nonterm needs --max-len)"))
    if args.text and not args.ref:
        parser.error("--text needs --ref")
    refs = read_lines(args.ref) if args.ref else None
    systems: Dict[str, list] = {}
    for spec in args.systems:
        label, sep, files = spec.partition("=")
        if not sep or not files:
            parser.error(f"expected LABEL=FILE[,FILE...], got {spec!r}")
        systems[label] = [read_system(f, args.text, refs) for f in files.split(",")]
    if args.control not in systems:
        parser.error(f"--control {args.control!r} is not one of {list(systems)}")
    result = compare(systems, args.control, args.bootstrap, args.max_len)
    print(markdown(result, args.control, metrics))
    if args.bleu_details:
        print()
        print(markdown_bleu_details(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
