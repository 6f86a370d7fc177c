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

usage: scripts/plot/plot_log.py LOG [LOG ...] (--metric NAME[+NAME...] [...] | --mgs) --out FIG.png
       [--x num_updates] [--labels a,b] [--json FILE]
"""
import argparse
import json
import os

from fairseq_ext.evaluation.plotting import pyplot
from fairseq_ext.evaluation.train_log import MGS_PANELS, plot, read_log, series
from fairseq_ext.runtime.cli import ConfigError


def main(argv=None) -> None:
    from fairseq_ext.runtime import cli

    cli.install()  # a ConfigError ends the command with one line, exit 2
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
        raise ConfigError(f"--labels needs {len(args.logs)} distinct names, got {args.labels!r}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise ConfigError(f"--out {args.out}: no such directory")
    try:
        pyplot()
    except ImportError as e:
        raise ConfigError(str(e)) from None
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
