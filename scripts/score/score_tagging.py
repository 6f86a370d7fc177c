#!/usr/bin/env python
"""Score tagging output: span-level NER precision / recall / F1 (conlleval
semantics) or token accuracy (POS), overall and per label.

Input is either ``fairseq-generate`` output of the ``sequence_tagging`` task (a
file, or stdin: the H- line against the T- line of every sentence id, the first
H- line when there are several) or two files with one sentence of
space-separated labels a line (``--hyp FILE --ref FILE``). The metrics come from
``fairseq_ext/core/tagging_metrics.py``.
"""
from __future__ import annotations

import argparse
from typing import List, Optional

from fairseq_ext.evaluation.comparison import print_scores
from fairseq_ext.evaluation.generate_output import (add_system_output_arguments, check_system_output_arguments,
                                                    read_generate_file, read_lines)
from fairseq_ext.evaluation.tagging import format_table, score
from fairseq_ext.runtime.cli import ConfigError

DESCRIPTION = __doc__.split("\n\n")[0]
EPILOG = """\
schemes (--scheme, default auto: chunk when every reference label is O or
B-/I-/E-/S- + type, else token):
  chunk  conlleval: a chunk starts at B-, at I- after O or after another type
         (broken BIO starts a chunk), ends before B-, O or a type change; a
         predicted chunk is correct when its span and type equal a gold chunk's.
         precision, recall, F1 (percent) overall (micro) and per entity type,
         f1_macro (mean of the per-type F1s), and token accuracy.
  token  token accuracy (percent) overall, and per label precision / recall / F1
         of the label as a token class.

Every hypothesis must have as many labels as its reference (the tagger's
forced length guarantees it); a mismatch is an error.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_system_output_arguments(parser, "predicted labels", "reference labels")
    parser.add_argument("--scheme", choices=("auto", "chunk", "token"), default="auto",
                        help="chunk (NER F1) or token (accuracy) scoring; auto decides from the reference labels")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the results as JSON to FILE ('-': stdout, instead of the table)")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_system_output_arguments(parser, args)
    try:
        if args.hyp is not None:
            hyps, refs = [x.split() for x in read_lines(args.hyp)], [x.split() for x in read_lines(args.ref)]
            if len(hyps) != len(refs):
                raise ConfigError(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}")
            if not refs:
                raise ConfigError(f"{args.ref}: no lines")
        else:
            g = read_generate_file(args.generate_output)
            hyps, refs = [h.split() for h in g.raw], [r.split() for r in g.references]
        results = score(hyps, refs, args.scheme)
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print_scores(results, format_table(results), args.json)


if __name__ == "__main__":
    main()
