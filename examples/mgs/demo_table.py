#!/usr/bin/env python
"""The table of ``make demo`` (examples/mgs/demo.sh): one row per model from its
``scripts/score/score.py`` JSON and its ``scripts/inspect/validate_criterion.py`` log.

usage: demo_table.py [--refs TEST.txt --context-size K] [--json OUT] LABEL=SCORES.json,VALIDATE.log ...
       demo_table.py --seeds WORK_DIR ...   (mean +- std over demo runs, from each WORK_DIR/table.json)

Columns: nonterm and rep-4 (score.py, greedy, at most 40 tokens), len (mean
continuation length in tokens, '.' included), edit (score.py: edit distance to the
reference continuation over its length), LM cost (the validation
``task_loss`` of the MGS-LM criterion: negative log-probability of the greedy
continuation under the MLE model) and ppl (test perplexity of the continuations).
"""
import argparse
import json
import re
import sys

from fairseq_ext.evaluation.comparison import format_table

# display names of the demo's rows (the JSON keeps the short ones)
NAMES = {"mle": "MLE", "mle_continued": "MLE continued (control)", "mgs": "MGS-LM",
         # examples/mgs/completion_tables.sh (Tables 1 and 7)
         "mle_cont": "MLE continued (control)", "mgs_lm": "MGS-LM", "mgs_lm_zero": "MGS-LM, zero-mean only",
         "mgs_lm_mle": "MGS-LM, MLE only", "mgs_edit": "MGS-edit"}
COLUMNS = [("nonterm", "nonterm", "{:.3f}"), ("rep4", "rep-4", "{:.3f}"), ("len", "len", "{:.2f}"),
           ("edit", "edit", "{:.3f}"), ("lm_cost", "LM cost", "{:.2f}"), ("ppl", "ppl", "{:.2f}")]


def read_validate(path: str) -> dict:
    """task_loss and ppl from the 'valid on' line of a fairseq-validate log."""
    with open(path) as f:
        lines = [line for line in f if "valid on" in line]
    if not lines:
        sys.exit(f"demo_table.py: no 'valid on' line in {path}")
    fields = dict(re.findall(r"\| (\w+) ([-0-9.e]+)", lines[-1]))
    return {"lm_cost": float(fields["task_loss"]), "ppl": float(fields["ppl"])}


def row(spec: str) -> tuple:
    label, sep, paths = spec.partition("=")
    scores_path, comma, validate_path = paths.partition(",")
    if not sep or not comma:
        sys.exit(f"demo_table.py: expected LABEL=SCORES.json,VALIDATE.log, got {spec!r}")
    with open(scores_path) as f:
        scores = json.load(f)
    values = {"nonterm": scores["nonterm"], "rep4": scores["rep4"], "len": scores["avg_hyp_len"],
              "edit": scores["edit"]}
    values.update(read_validate(validate_path))
    return label, values


def print_table(rows: list) -> None:
    """rows: (label, [cell strings]) in COLUMNS order."""
    header = ["model"] + [h for _, h, _ in COLUMNS]
    print(format_table([header] + [[NAMES.get(label, label)] + cells for label, cells in rows]))


def seed_summary(work_dirs: list) -> None:
    """Mean +- std (population) of every cell over the demo runs in ``work_dirs``."""
    tables = []
    for d in work_dirs:
        with open(f"{d}/table.json") as f:
            tables.append(json.load(f))
    n = len(tables)
    rows = []
    for label in tables[0]:
        cells = []
        for k, _, fmt in COLUMNS:
            vals = [t[label][k] for t in tables]
            mean = sum(vals) / n
            std = (sum((v - mean) ** 2 for v in vals) / n) ** 0.5
            cells.append(f"{fmt.format(mean)} ± {fmt.format(std)}")
        rows.append((label, cells))
    print(f"mean ± std over {n} runs: {' '.join(work_dirs)}")
    print_table(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", nargs="+", metavar="LABEL=SCORES.json,VALIDATE.log")
    p.add_argument("--seeds", action="store_true", help="the arguments are demo work directories: mean +- std")
    p.add_argument("--refs", help="the test lines, to print the reference continuations' mean length")
    p.add_argument("--context-size", type=int, default=3)
    p.add_argument("--json", help="also write {label: {column: value}} here")
    a = p.parse_args(argv)
    if a.seeds:
        seed_summary(a.rows)
        return
    rows = [row(spec) for spec in a.rows]
    print_table([(label, [fmt.format(v[k]) for k, _, fmt in COLUMNS]) for label, v in rows])
    if a.refs:
        with open(a.refs) as f:
            lengths = [len(ln.split()) - a.context_size for ln in f if ln.strip()]
        print(f"(reference continuations: {sum(lengths) / len(lengths):.2f} tokens on average; every one ends)")
    print("greedy continuations: nonterm = share without an end within 40 tokens, rep-4 = repeated 4-grams, "
          "len = tokens;\nLM cost = their NLL under the MLE model (MGS-LM's task loss); ppl = test perplexity")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(rows), f, indent=1)


if __name__ == "__main__":
    main()
