#!/usr/bin/env python
"""Summarise the runs of examples/dss/ner.sh, dss_multi30k.sh and soft_beam_ner.sh.

``dss_table.py WORK_DIR [--suffix S ...] [--metric KEY] [--markdown] NAME [NAME ...]``
reads WORK_DIR/NAME.sSEED/{valid,test}S.json (scripts/score/score_tagging.py or
scripts/score/score.py output) and prints, per run name, the dev and test metric as
mean [min, max] (``--std``: mean +- sample std) over the seeds found, and the
number of seeds; ``--control NAME`` adds each run's test difference of means
against NAME and the two-sided p of Welch's t-test over the seeds. Several
``--suffix`` give a dev and a test column each (e.g. one per decoding:
``--suffix .greedy --suffix .hard --suffix .soft``); seeds count runs with all
of them scored. The metric: ``--metric KEY`` (e.g. bleu, f1_macro), else F1 for
chunk-scored tagging, accuracy for token-scored tagging, BLEU for translation.

Protocol runs (Goyal thesis section 3.3.3: hyper-parameters tuned on dev, random
restarts, the best-on-dev restart reported on test) are named
NAME.CONFIG.sSEED, CONFIG without dots (e.g. ``soft_greedy_fixed.k10_a1.s2``):

- ``--select NAME`` prints the CONFIG of NAME whose ``--tune-seed`` run (1) has the
  best dev metric (ties: the first in sorted order); ``--prefix P`` only considers
  configs starting with P (e.g. ``k100_``: the best alpha at k = 100);
- ``--protocol NAME [NAME ...]`` prints, per NAME, the selected CONFIG and, over the
  seeds of that CONFIG, the best-on-dev restart's dev and test metric (what the thesis
  reports), the mean +- std of all restarts, and the seed count; ``--grid`` adds the
  tuning grid (every CONFIG's tune-seed dev and test metric)."""
import argparse
import glob
import json
import os
import re
import statistics
import sys

from fairseq_ext.evaluation.comparison import format_mean_std, format_table, welch


def metric(path, key=None):
    with open(path) as f:
        scores = json.load(f)
    if key is None:
        key = {"chunk": "f1", "token": "accuracy"}.get(scores.get("scheme"), "bleu")
    return scores[key]


def cell(values, std=False):
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    if std:
        return format_mean_std(values)
    return f"{statistics.mean(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def protocol_runs(work, name, suffix=""):
    """{config: {seed: (dev, test)}} for the scored runs WORK/NAME.CONFIG.sSEED."""
    runs = {}
    pat = re.compile(re.escape(name) + r"\.([^./]+)\.s(\d+)$")
    for d in sorted(glob.glob(os.path.join(work, f"{name}.*.s*"))):
        m = pat.match(os.path.basename(d))
        files = [os.path.join(d, f"{split}{suffix}.json") for split in ("valid", "test")]
        if m and all(os.path.isfile(f) for f in files):
            runs.setdefault(m.group(1), {})[int(m.group(2))] = tuple(files)
    return runs


def select(runs, key, tune_seed=1, prefix=""):
    """The config whose tune-seed run has the best dev metric, or None."""
    scored = [(metric(seeds[tune_seed][0], key), cfg) for cfg, seeds in sorted(runs.items())
              if tune_seed in seeds and cfg.startswith(prefix)]
    if not scored:
        return None
    best = max(v for v, _ in scored)
    return next(cfg for v, cfg in scored if v == best)


def best_seed(dev):
    """The seed with the best dev metric in {seed: dev} (ties: the lowest seed)."""
    return max(sorted(dev), key=lambda s: dev[s])


def protocol_table(a):
    suffix = (a.suffix or [""])[0]
    rows = [("run", "config", "best-on-dev restart: dev", "test", "all restarts: dev", "test", "seeds")]
    grid = [("run", "config", f"seed {a.tune_seed} dev", f"seed {a.tune_seed} test")]
    for name in a.names:
        runs = protocol_runs(a.work, name, suffix)
        cfg = select(runs, a.metric, a.tune_seed, a.prefix)
        for c, seeds in sorted(runs.items()):
            if a.tune_seed in seeds and c.startswith(a.prefix):
                grid.append((name, c) + tuple(f"{metric(f, a.metric):.2f}" for f in seeds[a.tune_seed]))
        if cfg is None:
            rows.append((name, "n/a", "n/a", "n/a", "n/a", "n/a", "0"))
            continue
        seeds = runs[cfg]
        dev = {s: metric(f[0], a.metric) for s, f in seeds.items()}
        test = {s: metric(f[1], a.metric) for s, f in seeds.items()}
        best = best_seed(dev)
        rows.append((name, cfg, f"{dev[best]:.2f}", f"{test[best]:.2f}", format_mean_std(list(dev.values())),
                     format_mean_std(list(test.values())), str(len(seeds))))
    print(format_table(rows, a.markdown))
    if a.grid:
        print()
        print(format_table(grid, a.markdown))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work")
    p.add_argument("names", nargs="+")
    p.add_argument("--suffix", action="append",
                   help="score file suffix, e.g. .beam5 for test.beam5.json; repeat for more column pairs")
    p.add_argument("--metric", default=None)
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--std", action="store_true", help="mean +- sample std over seeds instead of mean [min, max]")
    p.add_argument("--control", default=None,
                   help="add, per suffix, the test difference of means against this run name and Welch's "
                        "t-test p over seeds (two-sided)")
    p.add_argument("--select", action="store_true", help="print the best-on-dev config of the one NAME")
    p.add_argument("--best", action="store_true",
                   help="print the selected config of the one NAME and the seed of its best-on-dev restart")
    p.add_argument("--protocol", action="store_true", help="selected config, best-on-dev restart, all restarts")
    p.add_argument("--grid", action="store_true", help="with --protocol: also the tuning grid")
    p.add_argument("--tune-seed", type=int, default=1, help="the seed whose dev metric selects the config")
    p.add_argument("--prefix", default="", help="only configs starting with this")
    a = p.parse_args(argv)
    if a.select or a.best:
        if len(a.names) != 1:
            p.error(f"--{'select' if a.select else 'best'} takes one NAME")
        runs = protocol_runs(a.work, a.names[0], (a.suffix or [""])[0])
        cfg = select(runs, a.metric, a.tune_seed, a.prefix)
        if cfg is None:
            sys.exit(f"dss_table.py: no scored {a.names[0]}.CONFIG.s{a.tune_seed} run in {a.work}")
        if a.select:
            print(cfg)
        else:
            print(cfg, best_seed({s: metric(f[0], a.metric) for s, f in runs[cfg].items()}))
        return
    if a.protocol:
        protocol_table(a)
        return
    suffixes = a.suffix or [""]
    head = [f"{s.lstrip('.')} {split}".strip() for s in suffixes for split in ("dev", "test")]
    if a.control:
        head += [f"{s.lstrip('.')} test vs {a.control}".strip() for s in suffixes]
    rows = [tuple(["run"] + head + ["seeds"])]

    def scored(name):
        dirs = sorted(d for d in glob.glob(os.path.join(a.work, f"{name}.s*"))
                      if all(os.path.isfile(os.path.join(d, f"{split}{s}.json"))
                             for s in suffixes for split in ("valid", "test")))
        return dirs, {s: {split: [metric(os.path.join(d, f"{split}{s}.json"), a.metric) for d in dirs]
                          for split in ("valid", "test")} for s in suffixes}
    control = scored(a.control)[1] if a.control else None
    for name in a.names:
        dirs, values = scored(name)
        cells = [cell(values[s][split], a.std) for s in suffixes for split in ("valid", "test")]
        if a.control:
            for s in suffixes:
                if name == a.control or not values[s]["test"] or not control[s]["test"]:
                    cells.append("")
                    continue
                diff, pval = welch(values[s]["test"], control[s]["test"])
                cells.append(f"{diff:+.2f}" + ("" if pval is None else f", p = {pval:.2f}"))
        rows.append(tuple([name] + cells + [str(len(dirs))]))
    print(format_table(rows, a.markdown))


if __name__ == "__main__":
    main()
