#!/usr/bin/env python
"""Print score.py JSON results side by side: ``print_table.py LABEL=FILE.json ...``."""
import json
import sys

COLUMNS = [("bleu", "BLEU", "{:.2f}"), ("sentence_bleu", "sBLEU", "{:.2f}"), ("edit", "edit", "{:.3f}"),
           ("rep4", "rep-4", "{:.3f}"), ("nonterm", "nonterm", "{:.3f}"), ("avg_hyp_len", "len", "{:.2f}"),
           ("n_sentences", "n", "{}")]


def main(argv):
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
    header = ["model"] + [h for _, h, _ in COLUMNS]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


if __name__ == "__main__":
    main(sys.argv[1:])
