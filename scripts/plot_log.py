#!/usr/bin/env python
"""Draw metrics of one or more fairseq-train runs, read from their JSON logs, as one PNG.

A log is what ``fairseq-train --log-format json`` prints (``2>&1 | tee FILE``):
lines ``... | TAG | {json}`` with TAG ``train_inner`` (every ``--log-interval``
updates), ``train`` (end of epoch) or the validation subset (``valid``); or the
file ``--log-file FILE`` writes, the JSON alone (the tag is then read from the keys:
``valid_*`` and ``train_*`` keys, else train_inner; repeated lines, which fairseq
writes there from the second epoch on, count once). A metric is named as in the JSON: ``loss``,
``mgs_weight_entropy`` (train_inner lines), ``valid_loss``, ``valid_task_loss``
(valid lines), ``train_loss`` (train lines). ``--x`` (default ``num_updates``; or
``epoch``, ``update``, ...) is read from the same line, with the line's prefix where
fairseq adds one (``valid_num_updates``). One panel per metric, one line per run;
``NAME+NAME`` draws several metrics in one panel (one line per metric and run).

``--mgs`` draws the diagnostics of an MGS run (``--criterion mgs``; the MGS paper's
Figures 2, 3, 6 and 7), i.e. ``--metric`` with the panels of ``MGS_PANELS``: the
candidate weights' entropy and standard deviation; the total weight of the
MLE-component candidates and the share of updates whose best-weighted candidate
is an MLE one; the pooled cost C(theta) (the logged ``loss``) with the best and
mean candidate cost C(theta + Delta_k).

usage: scripts/plot_log.py LOG [LOG ...] (--metric NAME[+NAME...] [...] | --mgs) --out FIG.png
       [--x num_updates] [--labels a,b] [--json FILE]
"""
import argparse
import json
import os
import re
import sys
from typing import Dict, List, Sequence, Tuple

from fairseq_ext.evaluation.plotting import pyplot

STATS_LINE = re.compile(r"\| ([\w-]+) \| (\{.*\})\s*$")

Series = Dict[str, Dict[str, Tuple[List[float], List[float]]]]  # panel -> line label -> (xs, ys)

# --mgs: the MGS criterion's per-update diagnostics (docs/mgs.md, "Logged every update")
MGS_PANELS = ["mgs_weight_entropy+mgs_weight_std", "mgs_mle_weight+mgs_top_is_mle", "loss+mgs_cand_best+mgs_cand_mean"]
# y-axis labels of several-metric panels (otherwise the panel's name)
PANEL_LABELS = dict(zip(MGS_PANELS, ["candidate weights", "MLE component", "task loss C"]))


def _tag(stats: dict) -> str:
    """The tag of a bare JSON line (``--log-file``): ``valid`` / ``train`` for
    end-of-epoch lines (their keys carry it: ``valid_num_updates``), else train_inner."""
    for key in stats:
        if key.endswith("_num_updates"):
            return key[: -len("_num_updates")]
    return "train_inner"


def read_log(path: str) -> List[Tuple[str, Dict[str, float]]]:
    """(tag, numeric stats) of each JSON stats line of a fairseq log, in order."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"plot_log: cannot read log {path}: {e.strerror}")
    records, previous = [], None
    for line in text.splitlines():
        m = STATS_LINE.search(line)
        tag, body = (m.group(1), m.group(2)) if m else (None, line.strip())
        if not body.startswith("{") or line == previous:
            continue
        previous = line
        try:
            stats = json.loads(body)
        except json.JSONDecodeError:
            continue
        numeric = {}
        for key, value in stats.items():
            try:
                numeric[key] = float(value)
            except (TypeError, ValueError):
                pass
        records.append((tag or _tag(stats), numeric))
    if not records:
        sys.exit(f"plot_log: {path} has no JSON stats lines (train with --log-format json)")
    return records


def series(runs: Dict[str, List[Tuple[str, Dict[str, float]]]], panels: Sequence[str], x: str) -> Series:
    """For each panel (a metric, or metrics joined by '+') and run, the (x, value) pairs
    of the lines that log the metric (x read as ``TAG_X`` or ``X`` in the same line;
    lines without it are left out). A one-metric panel's lines are named after the
    runs; a several-metric panel's after the metrics (``RUN: METRIC`` with several runs)."""
    out: Series = {}
    for panel in panels:
        out[panel] = {}
        metrics = panel.split("+")
        for metric in metrics:
            found = False
            for label, records in runs.items():
                xs, ys = [], []
                for tag, stats in records:
                    x_value = stats.get(f"{tag}_{x}", stats.get(x))
                    if metric in stats and x_value is not None:
                        xs.append(x_value)
                        ys.append(stats[metric])
                if xs:
                    found = True
                    line = label if len(metrics) == 1 else metric if len(runs) == 1 else f"{label}: {metric}"
                    out[panel][line] = (xs, ys)
            if not found:
                logged = sorted({k for records in runs.values() for _, stats in records for k in stats})
                sys.exit(f"plot_log: --metric {metric} (with --x {x}) is in none of the logs; logged: {', '.join(logged)}")
    return out


def plot(data: Series, x: str):
    """A matplotlib figure: one panel per metric, one line per run."""
    plt = pyplot()
    fig, axes = plt.subplots(len(data), 1, figsize=(6, 2.6 * len(data)), squeeze=False)
    for ax, (metric, by_run) in zip(axes[:, 0], data.items()):
        for label, (xs, ys) in by_run.items():
            ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
        ax.set_ylabel(PANEL_LABELS.get(metric, metric))
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel(x)
    fig.tight_layout()
    return fig


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", help="fairseq-train logs written with --log-format json")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--metric", nargs="+", help="metric names as in the logs' JSON (loss, valid_loss, ...); "
                                                  "a+b: both in one panel")
    what.add_argument("--mgs", action="store_true", help="the MGS diagnostics: --metric " + " ".join(MGS_PANELS))
    p.add_argument("--x", default="num_updates", help="x axis: num_updates (default), epoch, update, ...")
    p.add_argument("--labels", help="comma-separated run names (default: the log file names)")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--json", help="also write the plotted points here ({metric: {run: [xs, ys]}})")
    args = p.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(path) for path in args.logs]
    if not args.labels and len(set(labels)) != len(labels):
        labels = list(args.logs)
    if len(labels) != len(args.logs) or len(set(labels)) != len(labels):
        sys.exit(f"plot_log: --labels needs {len(args.logs)} distinct names, got {args.labels!r}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        sys.exit(f"plot_log: --out {args.out}: no such directory")
    try:
        pyplot()
    except ImportError as e:
        sys.exit(f"plot_log: {e}")
    panels = MGS_PANELS if args.mgs else args.metric
    data = series({label: read_log(path) for label, path in zip(labels, args.logs)}, panels, args.x)
    fig = plot(data, args.x)
    fig.savefig(args.out, dpi=110)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print(f"wrote {args.out}: " + "; ".join(f"{m} ({', '.join(runs)})" for m, runs in data.items()))


if __name__ == "__main__":
    main()
