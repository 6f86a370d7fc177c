#!/usr/bin/env python
"""The table of a fine-tuning selection run (examples/mgs/selection.sh): per run, the validation
BLEU of the start, the best validation (and its update), the last validation, what
``checkpoint_best.pt`` is, and the test BLEU / chrF of ``checkpoint_best.pt`` against continued
MLE (paired bootstrap p, pooled over seeds), from the kept records in RESULTS_DIR
(``*.selection.json`` written by ``python -m fairseq_ext.finetune``, ``compare.test.json``
written by scripts/score/compare_runs.py).

    python scripts/report/selection_table.py examples/mgs/results/selection
"""
import argparse
import glob
import json
import os
import re
from collections import defaultdict


def rows(results_dir: str):
    with open(os.path.join(results_dir, "compare.test.json")) as f:
        test = json.load(f)
    runs = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(results_dir, "*.selection.json"))):
        label, seed = re.match(r"(.+)\.s(\d+)\.selection\.json$", os.path.basename(path)).groups()
        with open(path) as f:
            runs[label].append((int(seed), json.load(f)))
    control = next(label for label, e in test.items() if "diff" not in e and label != "start")
    out = [["run", "seeds", "valid BLEU: start", "best (update)", "last", "checkpoint_best.pt", "test BLEU",
            "test chrF"]]
    for label in [control] + sorted(k for k in runs if k != control):
        records = [r for _, r in sorted(runs[label])]
        e = test[label]
        cells = [label.replace("_lr", ", lr "), str(len(records)),
                 " / ".join(f"{r['start']:.2f}" for r in records),
                 " / ".join(f"{r['best']:.2f} ({r['best_update']})" for r in records),
                 " / ".join(f"{r['last']:.2f}" if r["last"] is not None else "none" for r in records),
                 " / ".join(r["selected"] for r in records)]
        for metric in ("bleu", "chrf"):
            cell = f"{e['mean'][metric]:.2f}"
            if "diff" in e:
                cell += f" ({e['diff'][metric]:+.2f}, p {e['p_value_pooled'][metric]:.3f})"
            cells.append(cell + (" (control)" if label == control and metric == "bleu" else ""))
        out.append(cells)
    if "start" in test:
        e = test["start"]
        out.append(["start (MLE, best validation loss)", "", "", "", "", "",
                    f"{e['mean']['bleu']:.2f} ({e['diff']['bleu']:+.2f}, p {e['p_value_pooled']['bleu']:.3f})",
                    f"{e['mean']['chrf']:.2f} ({e['diff']['chrf']:+.2f}, p {e['p_value_pooled']['chrf']:.3f})"])
    return out


def markdown(table) -> str:
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table[1:]])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results_dir")
    a = p.parse_args(argv)
    if not os.path.isfile(os.path.join(a.results_dir, "compare.test.json")):
        p.error(f"{a.results_dir}: no compare.test.json (run examples/mgs/selection.sh first)")
    print(markdown(rows(a.results_dir)))


if __name__ == "__main__":
    main()
