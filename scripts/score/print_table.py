#!/usr/bin/env python
"""Print score.py JSON results side by side: ``print_table.py LABEL=FILE.json ...``."""
import json
import sys

from fairseq_ext.evaluation.comparison import format_table

COLUMNS = [("bleu", "BLEU", "{:.2f}"), ("sentence_bleu", "sBLEU", "{:.2f}"), ("edit", "edit", "{:.3f}"),
           ("rep4", "rep-4", "{:.3f}"), ("nonterm", "nonterm", "{:.3f}"), ("avg_hyp_len", "len", "{:.2f}"),
           ("n_sentences", "n", "{}")]


def main(argv):
    from fairseq_ext.runtime import cli

    cli.install()  # a ConfigError ends the command with one line, exit 2
    if not argv:
        sys.exit("usage: print_table.py LABEL=FILE.json [LABEL=FILE.json ...]")
    rows = []
    for arg in argv:
        label, sep, path = arg.partition("=")
        if not sep:
            sys.exit(f"print_table.py: expected LABEL=FILE.json, got {arg!r}")
        with open(path) as f:
            scores = json.load(f)
        rows.append([label] + [("n/a" if scores.get(k) is None else fmt.format(scores[k])) for k, _, fmt in COLUMNS])
    print(format_table([["model"] + [h for _, h, _ in COLUMNS]] + rows))


if __name__ == "__main__":
    main(sys.argv[1:])
