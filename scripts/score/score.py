#!/usr/bin/env python
"""Score translations: corpus BLEU, mean sentence BLEU, edit cost, rep-4, non-termination.

Also the breakdowns of the Goyal thesis's Tables 5.5-5.6: BLEU's n-gram
precisions and length ratio, and corpus BLEU by source-length bucket
(``--length-buckets``).

Input is either ``fairseq-generate`` output (a file, or stdin) or two text files
with one sentence a line (``--hyp FILE --ref FILE``). Per-sentence costs come
from ``fairseq_ext/core/task_losses.py`` (through
``fairseq_ext/evaluation/translation.py``); corpus BLEU from sacrebleu.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

import torch

from fairseq_ext.core import subwords, task_losses
from fairseq_ext.evaluation.comparison import print_scores
from fairseq_ext.evaluation.generate_output import (add_system_output_arguments, check_system_output_arguments,
                                                    read_generate_file, read_lines)
from fairseq_ext.evaluation.translation import bleu_by_source_length, format_table, remove_bpe, score
from fairseq_ext.runtime.cli import ConfigError

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
  task_loss      with --task-loss SPEC: the mean weighted task loss, and
                 cost_NAME, each cost's mean
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


def parse_buckets(text: str) -> list[int]:
    """'20,30,40' -> [20, 30, 40] (strictly increasing positive integers)."""
    try:
        edges = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--length-buckets: expected integers like 20,30,40, got {text!r}") from None
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(f"--length-buckets: edges must be positive and increasing, got {text!r}")
    return edges


def task_loss_costs(spec: str, where: str, have_sources: bool) -> dict:
    """{name: (weight, cost)} of a --task-loss spec; a cost this script cannot feed (token ids; a
    source it does not have) is refused, naming the option."""
    refusal = task_losses.TASK_LOSS_SPEC.refusal(spec)
    if refusal is not None:
        raise ConfigError(f"--task-loss {refusal}")
    out = {}
    for term in task_losses.parse_task_loss_spec(spec):
        name, cls = term.name, term.cls
        if cls.input_kind == "ids" or (cls.needs_source and (cls.source_kind or cls.input_kind) == "ids"):
            raise ConfigError(f"--task-loss: {name!r} takes token ids, which text output does not have; score it "
                              "with the criteria's validation instead")
        if cls.needs_source and not have_sources:
            raise ConfigError(f"--task-loss: {name!r} reads the source, and {where} has none "
                              "(S- lines, or --src with --hyp)")
        try:
            cost = term.build()
        except (TypeError, ValueError) as err:
            raise ConfigError(f"--task-loss: {name!r} cannot be built without options: {err}") from None
        cost.setup(torch.device(cost.device or "cpu"))
        out[name] = (term.weight, cost)
    return out


def mean_task_losses(costs: dict, hyps: list[str], refs: list[str], srcs: list[str]) -> dict:
    """{"cost_NAME": mean cost, "task_loss": mean weighted sum}; token costs get whitespace tokens."""
    results, total = {}, 0.0
    for name, (weight, cost) in costs.items():
        def kind(texts, k):
            return texts if k == "text" else [t.split() for t in texts]
        r = kind(refs, cost.input_kind) if cost.needs_reference else None
        x = kind(srcs, cost.source_kind or cost.input_kind) if cost.needs_source else None
        mean = float(cost(kind(hyps, cost.input_kind), r, x, cost.prepare(r, x)).double().mean())
        results[f"cost_{name}"] = mean
        total += weight * mean
    results["task_loss"] = total
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_system_output_arguments(parser, "hypotheses", "references")
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
        "--task-loss", metavar="SPEC", default=None,
        help="also the mean of these task losses, as the criteria's --*-task-loss takes them: a registered "
             "text or token cost, your own as module:Class (importable from PYTHONPATH; a source-aware one reads "
             "the S- lines or --src), or a weighted sum, e.g. 'chrf=1,my_costs:LengthGap=0.5'",
    )
    parser.add_argument(
        "--json", metavar="FILE", default=None,
        help="also write the results as JSON to FILE ('-': stdout, instead of the table)",
    )
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_system_output_arguments(parser, args)
    if args.max_len is not None and args.max_len < 1:
        parser.error("--max-len must be >= 1")
    if args.src is not None and args.hyp is None:
        parser.error("--src goes with --hyp/--ref (generate output has S- lines)")
    try:
        edges = parse_buckets(args.length_buckets) if args.length_buckets is not None else None
        if args.hyp is not None:
            hyps, refs = read_lines(args.hyp), read_lines(args.ref)
            if len(hyps) != len(refs):
                raise ConfigError(
                    f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}"
                )
            if not hyps:
                raise ConfigError(f"{args.hyp}: no lines")
            raw_hyps = hyps
            srcs = read_lines(args.src) if args.src is not None else [""] * len(hyps)
            if len(srcs) != len(hyps):
                raise ConfigError(f"{args.src} has {len(srcs)} lines but {args.hyp} has {len(hyps)}")
            where = args.src or args.hyp
        else:
            g = read_generate_file(args.generate_output)
            hyps, refs, raw_hyps, srcs = g.hypotheses, g.references, g.raw, g.sources
            where = args.generate_output if args.generate_output not in (None, "-") else "<stdin>"
        if edges is not None and not any(srcs):
            raise ConfigError(f"--length-buckets needs sources: {where} has none (S- lines, or --src with --hyp)")
        costs = task_loss_costs(args.task_loss, where, any(srcs)) if args.task_loss is not None else None
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    hyps = [remove_bpe(h, args.bpe_symbol) for h in hyps]
    refs = [remove_bpe(r, args.bpe_symbol) for r in refs]
    scheme, share = subwords.detect_subword_scheme(t for r in refs for t in r.split())
    if scheme is not None:
        print(f"{parser.prog}: warning: {share:.0%} of the reference tokens {subwords.SUBWORD_MARKS[scheme]}: "
              f"scoring {scheme} pieces, not words; pass --bpe-symbol {scheme} (or generate with --post-process "
              f"{scheme})", file=sys.stderr)
    results = score(hyps, refs, raw_hyps, args.max_len)
    if edges is not None:
        srcs = [remove_bpe(x, args.bpe_symbol) for x in srcs]
        results["bleu_by_source_length"] = bleu_by_source_length(hyps, refs, srcs, edges)
    if costs is not None:
        srcs = [remove_bpe(x, args.bpe_symbol) for x in srcs]
        results.update(mean_task_losses(costs, hyps, refs, srcs))
    print_scores(results, format_table(results), args.json)


if __name__ == "__main__":
    main()
