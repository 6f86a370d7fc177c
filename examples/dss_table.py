#!/usr/bin/env python
"""Summarise the runs of examples/dss_ner.sh, dss_multi30k.sh and soft_beam_ner.sh.

``dss_table.py WORK_DIR [--suffix S ...] [--metric KEY] [--markdown] NAME [NAME ...]``
reads WORK_DIR/NAME.sSEED/{valid,test}S.json (scripts/score_tagging.py or
scripts/score.py output) and prints, per run name, the dev and test metric as
mean [min, max] over the seeds found, and the number of seeds. Several
``--suffix`` give a dev and a test column each (e.g. one per decoding:
``--suffix .greedy --suffix .hard --suffix .soft``); seeds count runs with all
of them scored. The metric: ``--metric KEY`` (e.g. bleu, f1_macro), else F1 for
chunk-scored tagging, accuracy for token-scored tagging, BLEU for translation."""
import argparse
import glob
import json
import os
import statistics


def metric(path, key=None):
    with open(path) as f:
        scores = json.load(f)
    if key is None:
        key = {"chunk": "f1", "token": "accuracy"}.get(scores.get("scheme"), "bleu")
    return scores[key]


def cell(values):
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work")
    p.add_argument("names", nargs="+")
    p.add_argument("--suffix", action="append",
                   help="score file suffix, e.g. .beam5 for test.beam5.json; repeat for more column pairs")
    p.add_argument("--metric", default=None)
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    a = p.parse_args(argv)
    suffixes = a.suffix or [""]
    head = [f"{s.lstrip('.')} {split}".strip() for s in suffixes for split in ("dev", "test")]
    rows = [tuple(["run"] + head + ["seeds"])]
    for name in a.names:
        dirs = sorted(d for d in glob.glob(os.path.join(a.work, f"{name}.s*"))
                      if all(os.path.isfile(os.path.join(d, f"{split}{s}.json"))
                             for s in suffixes for split in ("valid", "test")))
        cells = [cell([metric(os.path.join(d, f"{split}{s}.json"), a.metric) for d in dirs])
                 for s in suffixes for split in ("valid", "test")]
        rows.append(tuple([name] + cells + [str(len(dirs))]))
    n = len(rows[0])
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    for i, r in enumerate(rows):
        if a.markdown:
            print("| " + " | ".join(r) + " |")
            if i == 0:
                print("|" + "---|" * n)
            continue
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
