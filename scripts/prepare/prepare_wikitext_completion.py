#!/usr/bin/env python
"""WikiText -> (prefix, continuation) text-completion data for ``--task text_completion``.

As in the MGS paper, section 5.1: the corpus is split at its newline boundaries,
every non-empty line (paragraph) is one sequence, and lines of k tokens or fewer
are discarded (k = ``--context-size``, 10). The task itself splits each kept line
into its k-token prefix and the continuation (+ <eos>) at load time, so the same
binarized data serves any k >= the one used here.

WikiText is already tokenized (space-separated, ``<unk>`` present), so tokens are
whitespace tokens. Splits: ``train.txt`` / ``valid.txt`` / ``test.txt`` from the
input directory; when ``train.txt`` is absent (the WikiText-2 copy in
``$FAIRSEQ_EXT_DATA`` has only valid and test), ``valid.txt`` is split at article
boundaries (`` = Title = `` headings) into train and valid, the last
``--valid-fraction`` of articles going to valid.

Output: ``OUT/raw/{train,valid,test}.txt`` (kept lines), ``OUT/bin`` (fairseq
binarized, ``dict.txt``), ``OUT/stats.json`` (pairs per split).

usage: python scripts/prepare/prepare_wikitext_completion.py INPUT_DIR OUTPUT_DIR [--context-size 10]
"""
import argparse
import json
import os
import re
import subprocess
import sys
from typing import List

HEADING = re.compile(r"^ = [^=].* = $")


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def split_articles(lines: List[str], valid_fraction: float):
    """Split at top-level headings; the last ``valid_fraction`` of articles -> valid."""
    starts = [i for i, line in enumerate(lines) if HEADING.match(line)] or [0]
    if starts[0] != 0:
        starts = [0] + starts
    n_valid = max(1, int(round(len(starts) * valid_fraction)))
    if n_valid >= len(starts):
        raise ValueError(f"--valid-fraction {valid_fraction} leaves no training articles ({len(starts)} articles)")
    cut = starts[len(starts) - n_valid]
    return lines[:cut], lines[cut:]


def keep_lines(lines: List[str], context_size: int, max_tokens: int) -> List[str]:
    """Non-empty lines with more than ``context_size`` tokens (and at most ``max_tokens`` if > 0)."""
    out = []
    for line in lines:
        toks = line.split()
        if len(toks) > context_size and (max_tokens <= 0 or len(toks) <= max_tokens):
            out.append(" ".join(toks))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input_dir", help="WikiText directory with valid.txt, test.txt (and train.txt if available)")
    p.add_argument("output_dir")
    p.add_argument("--context-size", type=int, default=10, help="prefix length k; lines of <= k tokens are dropped")
    p.add_argument("--valid-fraction", type=float, default=0.1, help="share of valid.txt articles kept for validation when there is no train.txt")
    p.add_argument("--max-tokens-per-line", type=int, default=0, help="drop longer lines (0: keep all)")
    p.add_argument("--vocab-size", type=int, default=0, help="keep the N most frequent training words, map the rest to <unk> (0: all)")
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args(argv)

    if a.context_size < 1:
        p.error(f"--context-size must be >= 1, got {a.context_size}")
    if not 0.0 < a.valid_fraction < 1.0:
        p.error(f"--valid-fraction must be in (0, 1), got {a.valid_fraction}")
    for name in ("valid.txt", "test.txt"):
        if not os.path.isfile(os.path.join(a.input_dir, name)):
            p.error(f"missing input file {os.path.join(a.input_dir, name)}")

    valid_lines = read_lines(os.path.join(a.input_dir, "valid.txt"))
    train_path = os.path.join(a.input_dir, "train.txt")
    if os.path.isfile(train_path):
        splits = {"train": read_lines(train_path), "valid": valid_lines}
    else:
        train, valid = split_articles(valid_lines, a.valid_fraction)
        splits = {"train": train, "valid": valid}
    splits["test"] = read_lines(os.path.join(a.input_dir, "test.txt"))

    raw = os.path.join(a.output_dir, "raw")
    os.makedirs(raw, exist_ok=True)
    stats = {}
    for split, lines in splits.items():
        kept = keep_lines(lines, a.context_size, a.max_tokens_per_line)
        if not kept:
            p.error(f"{split}: no line has more than {a.context_size} tokens")
        with open(os.path.join(raw, f"{split}.txt"), "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in kept)
        stats[split] = len(kept)
        print(f"{split}: {len(kept)} (prefix, continuation) pairs from {len(lines)} lines")

    dest = os.path.join(a.output_dir, "bin")
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--workers", str(a.workers),
           "--trainpref", f"{raw}/train.txt", "--validpref", f"{raw}/valid.txt", "--testpref", f"{raw}/test.txt",
           "--destdir", dest]
    if a.vocab_size > 0:
        cmd += ["--nwordssrc", str(a.vocab_size)]
    log = os.path.join(a.output_dir, "preprocess.log")
    with open(log, "w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"prepare_wikitext_completion: fairseq-preprocess failed, see {log}")
    stats["context_size"] = a.context_size
    with open(os.path.join(a.output_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(f"done: {dest}")


if __name__ == "__main__":
    main()
