#!/usr/bin/env python
"""Score translations: corpus BLEU, mean sentence BLEU, edit cost, rep-4, non-termination.

Also the breakdowns of the Goyal thesis's Tables 5.5-5.6: BLEU's n-gram
precisions and length ratio, and corpus BLEU by source-length bucket
(``--length-buckets``).

Input is either ``fairseq-generate`` output (a file, or stdin) or two text files
with one sentence a line (``--hyp FILE --ref FILE``). Per-sentence costs come
from ``fairseq_ext/core/task_losses.py``; corpus BLEU from sacrebleu.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Optional, TextIO

import sacrebleu

# Load the core module by file path rather than ``import fairseq_ext.core...``:
# the package import runs fairseq_ext/__init__.py, which imports fairseq (slow,
# and not needed to score text). task_losses.py imports nothing from the package,
# so it loads stand-alone.
_CORE = Path(__file__).resolve().parent.parent / "fairseq_ext" / "core" / "task_losses.py"
_spec = importlib.util.spec_from_file_location("_fairseq_ext_task_losses", _CORE)
task_losses = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = task_losses
_spec.loader.exec_module(task_losses)

_EOS = "</s>"
DESCRIPTION = __doc__.split("\n\n")[0]
EPILOG = f"""\
which text is scored:
  generate output: the D- line (detokenized hypothesis) when present, else the
  H- line, against the T- line; sentences are sorted by id, and with --nbest > 1
  the first hypothesis of each id is used. --bpe-symbol is applied to both the
  hypothesis and the reference, so pass it only if fairseq-generate was run
  without --post-process/--remove-bpe/--bpe. When the references still look
  like sentencepiece or subword-nmt pieces, a warning says so on stderr.

metrics (edit, rep-4 and lengths use whitespace tokens of the scored text):
  bleu           sacrebleu corpus BLEU (13a tokenization)
  sentence_bleu  mean smoothed sentence BLEU (exp smoothing), 0-100
  edit           mean min(1, Levenshtein distance / reference length)
  rep4           mean of 1 - unique 4-grams / 4-grams of the hypothesis
  nonterm        fraction of non-terminating hypotheses (see --max-len), or n/a
  avg_hyp_len    mean hypothesis length in tokens
  n_sentences    number of scored sentences
  precisions     BLEU's 1- to 4-gram precisions (Table 5.5), JSON only
  length_ratio   hypothesis / reference length in BLEU's tokens (Table 5.5)
  bleu_by_source_length
                 with --length-buckets 20,30,40: corpus BLEU of the sentences
                 whose source has [0, 20), [20, 30), [30, 40), >= 40 whitespace
                 tokens (Table 5.6; the S- lines of generate output, or --src)

non-termination:
  fairseq-generate strips EOS from H- lines, and a hypothesis that hits the
  length limit is cut there (EOS forced). A hypothesis counts as non-terminating
  when its number of whitespace tokens in the H- line (with --hyp: in the line as
  given, before --bpe-symbol) is >= --max-len; use the generator's limit, i.e.
  fairseq-generate's --max-len-b when --max-len-a is 0. Count subword tokens by
  running fairseq-generate without --post-process. Without --max-len: n/a.
"""


class ScoreError(Exception):
    """An input problem, reported as one line on stderr."""


def remove_bpe(line: str, bpe_symbol: Optional[str]) -> str:
    """Undo subword segmentation as fairseq's ``--post-process`` does.

    ``sentencepiece``: drop spaces, then "▁" becomes a space; ``subword_nmt``
    means "@@ "; any other symbol is deleted together with a following space.
    """
    if bpe_symbol is None:
        return line
    if bpe_symbol == "sentencepiece":
        return line.replace(" ", "").replace("\u2581", " ").strip()
    if bpe_symbol == "subword_nmt":
        bpe_symbol = "@@ "
    return (line + " ").replace(bpe_symbol, "").rstrip()


def read_generate_output(stream: TextIO, name: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """Hypotheses (D- else H-), references (T-), raw H- texts and sources (S-; ""
    where absent), sorted by id."""
    fields: dict[str, dict[int, str]] = {"T": {}, "H": {}, "D": {}, "S": {}}
    for line in stream:
        kind, sep, rest = line.rstrip("\n").partition("-")
        if kind not in fields or not sep:
            continue
        sid, _, text = rest.partition("\t")
        if not sid.isdigit():
            continue
        if kind in ("H", "D"):
            text = text.partition("\t")[2]  # drop the score column
        fields[kind].setdefault(int(sid), text)
    raw, refs = fields["H"], fields["T"]
    if not raw:
        raise ScoreError(f"{name}: no H- lines; is this fairseq-generate output?")
    hyps = fields["D"] or raw
    ids = sorted(raw)
    for kind, lines in (("T", refs), ("D", hyps)):
        missing = [i for i in ids if i not in lines]
        if missing:
            raise ScoreError(f"{name}: no {kind}- line for sentence id(s) {missing[:10]}")
    srcs = fields["S"]
    return [hyps[i] for i in ids], [refs[i] for i in ids], [raw[i] for i in ids], [srcs.get(i, "") for i in ids]


def open_text(path: str) -> TextIO:
    """Open a text file for reading; ``PATH.gz`` (scripts/keep_results.py --gen keeps generated text
    gzipped) is read when PATH itself is absent. FileNotFoundError names PATH."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_lines(path: str) -> list[str]:
    """Lines of a text file without newlines; ScoreError naming it if missing."""
    try:
        with open_text(path) as f:
            return [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        raise ScoreError(f"{path}: no such file") from None


def mean_cost(name: str, hyps: list, refs: Optional[list] = None, **options) -> float:
    """Mean over sentences of the registered task loss ``name``."""
    costs = task_losses.build_task_loss(name, **options)(hyps, refs)
    return costs.double().mean().item()


def nonterm_costs(raw_hyps: list[str], max_len: int):
    """Per hypothesis (raw H- text, in the tokens the decoder counted), 1 where it
    reached ``max_len`` tokens without ending, else 0 (the ``nonterm`` task loss)."""
    # Restore the EOS fairseq stripped from every hypothesis that ended before the limit.
    with_eos = [t if len(t) >= max_len else t + [_EOS] for t in map(str.split, raw_hyps)]
    return task_losses.build_task_loss("nonterm", eos=_EOS)(with_eos, None)


def parse_buckets(text: str) -> list[int]:
    """'20,30,40' -> [20, 30, 40] (strictly increasing positive integers)."""
    try:
        edges = [int(x) for x in text.split(",")]
    except ValueError:
        raise ScoreError(f"--length-buckets: expected integers like 20,30,40, got {text!r}") from None
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ScoreError(f"--length-buckets: edges must be positive and increasing, got {text!r}")
    return edges


def bleu_by_source_length(hyps: list[str], refs: list[str], srcs: list[str], edges: list[int]) -> dict:
    """Corpus BLEU per source-length bucket [0, e1), [e1, e2), ..., >= e_last
    (whitespace tokens of the source); None for an empty bucket."""
    names = [f"{lo}-{hi}" for lo, hi in zip([0] + edges[:-1], edges)] + [f"{edges[-1]}+"]
    groups: list[list[int]] = [[] for _ in names]
    for i, src in enumerate(srcs):
        n = len(src.split())
        groups[sum(n >= e for e in edges)].append(i)
    return {name: (sacrebleu.corpus_bleu([hyps[i] for i in g], [[refs[i] for i in g]]).score if g else None)
            for name, g in zip(names, groups)}


def score(
    hyps: list[str], refs: list[str], raw_hyps: list[str], max_len: Optional[int]
) -> dict[str, Optional[float]]:
    """Corpus and mean per-sentence metrics of B hypotheses against B references."""
    hyp_tokens = [h.split() for h in hyps]
    ref_tokens = [r.split() for r in refs]
    sbleu_cost = mean_cost("sbleu", hyps, refs)
    nonterm = None if max_len is None else nonterm_costs(raw_hyps, max_len).double().mean().item()
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    return {
        "bleu": bleu.score,
        "precisions": [float(p) for p in bleu.precisions],
        "length_ratio": bleu.sys_len / max(bleu.ref_len, 1),
        "sentence_bleu": 100.0 * (1.0 - sbleu_cost),
        "edit": mean_cost("edit", hyp_tokens, ref_tokens),
        "rep4": mean_cost("rep", hyp_tokens, n=4),
        "nonterm": nonterm,
        "avg_hyp_len": sum(map(len, hyp_tokens)) / len(hyp_tokens),
        "n_sentences": len(hyps),
    }


def format_table(results: dict[str, Optional[float]]) -> str:
    """Two aligned columns: metric name and value."""
    labels = {
        "bleu": "corpus BLEU",
        "sentence_bleu": "mean sentence BLEU",
        "edit": "mean edit cost",
        "rep4": "rep-4",
        "nonterm": "non-termination",
        "avg_hyp_len": "avg hypothesis length",
        "length_ratio": "length ratio (BLEU)",
        "n_sentences": "sentences",
    }
    width = max(map(len, labels.values()))
    rows = []
    for key, label in labels.items():
        value = results[key]
        if value is None:
            text = "n/a"
        elif key == "n_sentences":
            text = str(value)
        elif key in ("bleu", "sentence_bleu", "avg_hyp_len"):
            text = f"{value:.2f}"
        elif key == "length_ratio":
            text = f"{value:.3f}"
        else:
            text = f"{value:.4f}"
        rows.append(f"{label:<{width}}  {text:>8}")
    if results.get("precisions") is not None:
        rows.append(f"{'n-gram precisions':<{width}}  " + "/".join(f"{p:.1f}" for p in results["precisions"]))
    for bucket, value in (results.get("bleu_by_source_length") or {}).items():
        text = "n/a" if value is None else f"{value:.2f}"
        rows.append(f"{'BLEU, source ' + bucket:<{width}}  {text:>8}")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "generate_output", nargs="?", default=None,
        help="fairseq-generate output file ('-' or omitted: stdin); not with --hyp/--ref",
    )
    parser.add_argument("--hyp", metavar="FILE", help="hypotheses, one sentence a line")
    parser.add_argument("--ref", metavar="FILE", help="references, one sentence a line")
    parser.add_argument(
        "--bpe-symbol", default=None,
        help="subword marker to remove from hypotheses and references: 'sentencepiece', "
        "'subword_nmt' (= '@@ '), or a literal symbol such as '@@ ' (default: none)",
    )
    parser.add_argument(
        "--max-len", type=int, default=None,
        help="generation length limit in tokens; enables the non-termination rate",
    )
    parser.add_argument("--src", metavar="FILE", help="sources, one a line (with --hyp/--ref, for --length-buckets)")
    parser.add_argument(
        "--length-buckets", metavar="EDGES", default=None,
        help="also corpus BLEU by source length, e.g. 20,30,40 (the thesis's Table 5.6 buckets)",
    )
    parser.add_argument(
        "--json", metavar="FILE", default=None,
        help="also write the results as JSON to FILE ('-': stdout, instead of the table)",
    )
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.hyp is None) != (args.ref is None):
        parser.error("--hyp and --ref go together")
    if args.hyp is not None and args.generate_output is not None:
        parser.error("give either generate output or --hyp/--ref, not both")
    if args.max_len is not None and args.max_len < 1:
        parser.error("--max-len must be >= 1")
    if args.src is not None and args.hyp is None:
        parser.error("--src goes with --hyp/--ref (generate output has S- lines)")
    try:
        edges = parse_buckets(args.length_buckets) if args.length_buckets is not None else None
        if args.hyp is not None:
            hyps, refs = read_lines(args.hyp), read_lines(args.ref)
            if len(hyps) != len(refs):
                raise ScoreError(
                    f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}"
                )
            if not hyps:
                raise ScoreError(f"{args.hyp}: no lines")
            raw_hyps = hyps
            srcs = read_lines(args.src) if args.src is not None else [""] * len(hyps)
            if len(srcs) != len(hyps):
                raise ScoreError(f"{args.src} has {len(srcs)} lines but {args.hyp} has {len(hyps)}")
            where = args.src or args.hyp
        elif args.generate_output in (None, "-"):
            hyps, refs, raw_hyps, srcs = read_generate_output(sys.stdin, "<stdin>")
            where = "<stdin>"
        else:
            try:
                with open_text(args.generate_output) as f:
                    hyps, refs, raw_hyps, srcs = read_generate_output(f, args.generate_output)
            except FileNotFoundError:
                raise ScoreError(f"{args.generate_output}: no such file") from None
            where = args.generate_output
        if edges is not None and not any(srcs):
            raise ScoreError(f"--length-buckets needs sources: {where} has none (S- lines, or --src with --hyp)")
    except ScoreError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    hyps = [remove_bpe(h, args.bpe_symbol) for h in hyps]
    refs = [remove_bpe(r, args.bpe_symbol) for r in refs]
    scheme, share = task_losses.detect_subword_scheme(t for r in refs for t in r.split())
    if scheme is not None:
        print(f"{parser.prog}: warning: {share:.0%} of the reference tokens {task_losses.SUBWORD_MARKS[scheme]}: "
              f"scoring {scheme} pieces, not words; pass --bpe-symbol {scheme} (or generate with --post-process "
              f"{scheme})", file=sys.stderr)
    results = score(hyps, refs, raw_hyps, args.max_len)
    if edges is not None:
        srcs = [remove_bpe(x, args.bpe_symbol) for x in srcs]
        results["bleu_by_source_length"] = bleu_by_source_length(hyps, refs, srcs, edges)
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
