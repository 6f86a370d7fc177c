#!/usr/bin/env python
"""Summarise the runs of examples/dss_ner.sh and examples/dss_multi30k.sh.

``dss_table.py WORK_DIR [--suffix S] [--metric KEY] NAME [NAME ...]`` reads
WORK_DIR/NAME.sSEED/{valid,test}S.json (scripts/score_tagging.py or
scripts/score.py output) and prints, per run name, the dev and test metric as
mean [min, max] over the seeds found, and the number of seeds. The metric:
``--metric KEY`` (e.g. bleu), else F1 for chunk-scored tagging, accuracy for
token-scored tagging, BLEU for translation."""
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
    p.add_argument("--suffix", default="", help="score file suffix, e.g. .beam5 for test.beam5.json")
    p.add_argument("--metric", default=None)
    a = p.parse_args(argv)
    rows = [("run", "dev", "test", "seeds")]
    for name in a.names:
        dirs = sorted(d for d in glob.glob(os.path.join(a.work, f"{name}.s*"))
                      if os.path.isfile(os.path.join(d, f"test{a.suffix}.json")))
        dev = [metric(os.path.join(d, f"valid{a.suffix}.json"), a.metric) for d in dirs]
        test = [metric(os.path.join(d, f"test{a.suffix}.json"), a.metric) for d in dirs]
        rows.append((name, cell(dev), cell(test), str(len(dirs))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
