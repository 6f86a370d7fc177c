#!/usr/bin/env python
"""The thesis's "(20)" evaluation sets (Goyal, section 6.7): the test pairs whose
source has at most ``--max-words`` words, as BPE text ready for fairseq-preprocess.

    python scripts/prepare/short_source_subset.py TOK_SRC BPE_PREFIX OUT_PREFIX --src de --tgt en [--max-words 20] [--limit N]

TOK_SRC: the tokenized (pre-BPE) source side of the test set, where words are
counted; BPE_PREFIX.{src,tgt}: the same lines after BPE; writes OUT_PREFIX.{src,tgt}
(the first ``--limit`` matching pairs; 0: all) and prints how many were kept.
"""
import argparse


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tok_src")
    p.add_argument("bpe_prefix")
    p.add_argument("out_prefix")
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--max-words", type=int, default=20)
    p.add_argument("--limit", type=int, default=0)
    a = p.parse_args(argv)
    with open(a.tok_src, encoding="utf-8") as f:
        keep = [i for i, line in enumerate(f) if len(line.split()) <= a.max_words]
    if a.limit > 0:
        keep = keep[: a.limit]
    for lang in (a.src, a.tgt):
        with open(f"{a.bpe_prefix}.{lang}", encoding="utf-8") as f:
            lines = f.readlines()
        with open(f"{a.out_prefix}.{lang}", "w", encoding="utf-8") as f:
            f.writelines(lines[i] for i in keep)
    print(f"{len(keep)} pairs with a source of at most {a.max_words} words")


if __name__ == "__main__":
    main()
