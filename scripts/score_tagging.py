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
import importlib.util
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, TextIO, Tuple

# Loaded by file path, not ``import fairseq_ext...``: the package import runs
# fairseq_ext/__init__.py, which imports fairseq (slow, not needed to score).
_CORE = Path(__file__).resolve().parent.parent / "fairseq_ext" / "core" / "tagging_metrics.py"
_spec = importlib.util.spec_from_file_location("_fairseq_ext_tagging_metrics", _CORE)
tagging_metrics = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tagging_metrics
_spec.loader.exec_module(tagging_metrics)

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


class ScoreError(Exception):
    """An input problem, reported as one line on stderr."""


def read_generate_output(stream: TextIO, name: str) -> Tuple[List[List[str]], List[List[str]]]:
    """Hypothesis (H-) and reference (T-) label sequences, sorted by sentence id."""
    fields: Dict[str, Dict[int, str]] = {"T": {}, "H": {}}
    for line in stream:
        kind, sep, rest = line.rstrip("\n").partition("-")
        if kind not in fields or not sep:
            continue
        sid, _, text = rest.partition("\t")
        if not sid.isdigit():
            continue
        if kind == "H":
            text = text.partition("\t")[2]  # drop the score column
        fields[kind].setdefault(int(sid), text)
    hyps, refs = fields["H"], fields["T"]
    if not hyps:
        raise ScoreError(f"{name}: no H- lines; is this fairseq-generate output?")
    missing = [i for i in sorted(hyps) if i not in refs]
    if missing:
        raise ScoreError(f"{name}: no T- line for sentence id(s) {missing[:10]}")
    ids = sorted(hyps)
    return [hyps[i].split() for i in ids], [refs[i].split() for i in ids]


def read_label_file(path: str) -> List[List[str]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [line.split() for line in f]
    except FileNotFoundError:
        raise ScoreError(f"{path}: no such file") from None


def score(hyps: List[List[str]], refs: List[List[str]], scheme: str = "auto") -> Dict:
    """Metrics of B hypothesis label sequences against B references (see EPILOG)."""
    for i, (h, r) in enumerate(zip(hyps, refs)):
        if len(h) != len(r):
            raise ScoreError(f"sentence {i}: {len(h)} predicted labels for {len(r)} reference labels")
    if scheme == "auto":
        scheme = "chunk" if tagging_metrics.is_chunk_tagset({lab for r in refs for lab in r}) else "token"
    if scheme == "chunk":
        results = tagging_metrics.chunk_scores(refs, hyps)
    else:
        results = tagging_metrics.token_scores(refs, hyps)
    return {"scheme": scheme, "sentences": len(refs), **results}


def format_table(results: Dict) -> str:
    """Overall metrics, then one row per entity type (chunk) or label (token)."""
    lines = [f"{'sentences':<14}{results['sentences']:>10}", f"{'tokens':<14}{results['tokens']:>10}",
             f"{'accuracy':<14}{results['accuracy']:>10.2f}"]
    if results["scheme"] == "chunk":
        lines += [f"{name:<14}{results[name]:>10.2f}" for name in ("precision", "recall", "f1", "f1_macro")]
        rows, head = results["per_type"], "type"
    else:
        rows, head = results["per_label"], "label"
    width = max([len(head)] + [len(k) for k in rows])
    lines.append("")
    lines.append(f"{head:<{width}}  {'precision':>9}  {'recall':>7}  {'f1':>7}  {'gold':>7}  {'predicted':>9}  "
                 f"{'correct':>7}")
    for key, row in rows.items():
        lines.append(f"{key:<{width}}  {row['precision']:>9.2f}  {row['recall']:>7.2f}  {row['f1']:>7.2f}  "
                     f"{row['gold']:>7}  {row['predicted']:>9}  {row['correct']:>7}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "generate_output", nargs="?", default=None,
        help="fairseq-generate output file ('-' or omitted: stdin); not with --hyp/--ref",
    )
    parser.add_argument("--hyp", metavar="FILE", help="predicted labels, one sentence a line")
    parser.add_argument("--ref", metavar="FILE", help="reference labels, one sentence a line")
    parser.add_argument("--scheme", choices=("auto", "chunk", "token"), default="auto",
                        help="chunk (NER F1) or token (accuracy) scoring; auto decides from the reference labels")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the results as JSON to FILE ('-': stdout, instead of the table)")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.hyp is None) != (args.ref is None):
        parser.error("--hyp and --ref go together")
    if args.hyp is not None and args.generate_output is not None:
        parser.error("give either generate output or --hyp/--ref, not both")
    try:
        if args.hyp is not None:
            hyps, refs = read_label_file(args.hyp), read_label_file(args.ref)
            if len(hyps) != len(refs):
                raise ScoreError(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}")
            if not refs:
                raise ScoreError(f"{args.ref}: no lines")
        elif args.generate_output in (None, "-"):
            hyps, refs = read_generate_output(sys.stdin, "<stdin>")
        else:
            try:
                with open(args.generate_output, encoding="utf-8") as f:
                    hyps, refs = read_generate_output(f, args.generate_output)
            except FileNotFoundError:
                raise ScoreError(f"{args.generate_output}: no such file") from None
        results = score(hyps, refs, args.scheme)
    except ScoreError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if args.json == "-":
        print(json.dumps(results, indent=2))
        return
    print(format_table(results))
    if args.json is not None:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
