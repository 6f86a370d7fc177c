#!/usr/bin/env python
"""Summarise examples/dss_ner.sh runs: ``dss_table.py WORK_DIR NAME [NAME ...]``.

Reads WORK_DIR/NAME.sSEED/{valid,test}.json (scripts/score_tagging.py output) and
prints, per run name, the dev and test F1 (chunk scheme) or accuracy (token
scheme) as mean [min, max] over the seeds found, and the number of seeds."""
import glob
import json
import os
import statistics
import sys


def metric(path):
    with open(path) as f:
        scores = json.load(f)
    return scores["f1"] if scores["scheme"] == "chunk" else scores["accuracy"]


def cell(values):
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    work, names = argv[0], argv[1:]
    rows = [("run", "dev", "test", "seeds")]
    for name in names:
        dirs = sorted(d for d in glob.glob(os.path.join(work, f"{name}.s*")) if os.path.isfile(os.path.join(d, "test.json")))
        dev = [metric(os.path.join(d, "valid.json")) for d in dirs]
        test = [metric(os.path.join(d, "test.json")) for d in dirs]
        rows.append((name, cell(dev), cell(test), str(len(dirs))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main(sys.argv[1:])
