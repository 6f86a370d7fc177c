#!/usr/bin/env python
"""Tables over seeds for examples/residual_ebm/wikitext.sh (Deng et al. 2020, Table 1 and Figures 2-3 layouts).

Reads, in WORK: ``lm.log`` (the base LM's validation lines), ``{variant}.s{seed}.log`` (an
energy's training log, ``--log-format json``) and ``eval_{variant}.s{seed}_k{k}.json`` /
``.samples.jsonl`` (scripts/score/eval_residual.py). Writes markdown to stdout:

- Table 1 layout: base-LM and joint perplexity [lower, upper] per continuation token, mean +- std
  over seeds; the gain, mean over test prefixes of the joint minus the base-LM log-likelihood
  of the real continuation (nats per continuation, lower log Z), with its standard error over
  prefixes and a paired t statistic (gain / s.e.) per seed; the energy's best valid NCE
  accuracy and the epoch it came from.
- Figure 2 left: the range against n, mean over seeds.
- Figure 2 right: share of unique n-grams (pooled / within a continuation) of real, base-LM and
  joint continuations.
- Figure 3: mean log-likelihood of real, base-LM and joint continuations under the base LM and
  the joint model.

usage: python examples/residual_ebm/table.py WORK --seeds 1 2 3 --variants bit unit --topks 0 10
"""
import argparse
import json
import math
import os
import re
import statistics
import sys
from typing import Dict, List, Optional

from fairseq_ext.evaluation.comparison import format_mean_std
from fairseq_ext.evaluation.train_log import read_log


def valid_lines(path: str) -> List[Dict[str, float]]:
    """The validation records of a fairseq --log-format json training log (none if it is absent)."""
    if not os.path.exists(path):
        return []
    return [stats for tag, stats in read_log(path) if tag == "valid"]


def lm_valid_loss(path: str) -> Optional[float]:
    """Best valid loss (base 2, fairseq's) of a --log-format simple log."""
    best = None
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = re.search(r"valid on 'valid' subset \| loss ([0-9.]+)", line)
                if m:
                    best = float(m.group(1)) if best is None else min(best, float(m.group(1)))
    return best


def gain_stats(samples_path: str):
    """Mean joint - base-LM log-likelihood of the real continuation and its standard error."""
    gains = []
    with open(samples_path) as f:
        for line in f:
            r = json.loads(line)
            gains.append(r["joint_log_prob"][0] - r["base_lm_log_prob"][0])
    m = statistics.mean(gains)
    se = statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else float("nan")
    return m, se


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work")
    ap.add_argument("--seeds", nargs="+", required=True)
    ap.add_argument("--variants", nargs="+", default=["bit", "unit"])
    ap.add_argument("--topks", nargs="+", default=["0"])
    args = ap.parse_args(argv)
    w = args.work

    evals: Dict[tuple, dict] = {}
    for v in args.variants:
        for s in args.seeds:
            for k in args.topks:
                path = os.path.join(w, f"eval_{v}.s{s}_k{k}.json")
                if os.path.exists(path):
                    with open(path) as f:
                        evals[v, s, k] = json.load(f)
    if not evals:
        sys.exit(f"residual_table: no eval_*.json in {w}")
    any_res = next(iter(evals.values()))
    print(f"WikiText-2 test: {any_res['prefixes']} prefixes, {any_res['tokens']} continuation tokens, "
          f"n = {any_res['num_samples']} base-LM samples per prefix for log Z; seeds {' '.join(args.seeds)}")
    lm_loss = lm_valid_loss(os.path.join(w, "lm.log"))
    if lm_loss is not None:
        print(f"base LM: best valid loss {lm_loss:.3f} bits per token (valid perplexity {2 ** lm_loss:.1f})")
    print()
    print("Table 1 layout (perplexity per continuation token; joint: [lower, upper] log Z; gain: joint minus "
          "base-LM log-likelihood of the real continuation, nats per continuation, mean +- s.e. over prefixes, "
          "t = gain / s.e.):")
    print()
    print("| model | seeds | test ppl | gain per seed (t) | best valid NCE acc (epoch) |")
    print("|---|---|---|---|---|")
    base = [r["base_lm_ppl"] for (v, s, k), r in evals.items() if k == args.topks[0] and v == args.variants[0]]
    print(f"| base LM | | {format_mean_std(base, 3)} | | |")
    for v in args.variants:
        seeds = [s for s in args.seeds if (v, s, args.topks[0]) in evals]
        if not seeds:
            continue
        rs = [evals[v, s, args.topks[0]] for s in seeds]
        lo = format_mean_std([r["joint_ppl_lower"] for r in rs], 3)
        hi = format_mean_std([r["joint_ppl_upper"] for r in rs], 3)
        gains, accs = [], []
        for s in seeds:
            m, se = gain_stats(os.path.join(w, f"eval_{v}.s{s}_k{args.topks[0]}.samples.jsonl"))
            gains.append(f"{m:+.3f} +- {se:.3f} ({m / se:+.1f})")
            vl = valid_lines(os.path.join(w, f"{v}.s{s}.log"))
            if vl:
                best = max(vl, key=lambda r: r["valid_acc"])
                accs.append(f"{best['valid_acc']:.3f} ({int(best['epoch'])} of {int(vl[-1]['epoch'])})")
        print(f"| joint {v} | {len(seeds)} | [{lo}, {hi}] | {'; '.join(gains)} | {'; '.join(accs)} |")

    print()
    print("Figure 2 left: the joint perplexity range against n (mean over seeds):")
    print()
    ns = [b["n"] for b in any_res["by_num_samples"]]
    print("| model | " + " | ".join(f"n = {n}" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for v in args.variants:
        rs = [evals[v, s, args.topks[0]] for s in args.seeds if (v, s, args.topks[0]) in evals]
        if not rs:
            continue
        cells = []
        for i in range(len(ns)):
            lo = statistics.mean(r["by_num_samples"][i]["joint_ppl_lower"] for r in rs)
            hi = statistics.mean(r["by_num_samples"][i]["joint_ppl_upper"] for r in rs)
            cells.append(f"[{lo:.2f}, {hi:.2f}]")
        print(f"| {v} | " + " | ".join(cells) + " |")

    orders = sorted(any_res["unique_ngram_share"]["real"], key=int)
    print()
    print("Figure 2 right: share of unique n-grams, pooled over the set / mean within a continuation "
          "(mean over seeds):")
    print()
    print("| joint top-k | model | continuations | " + " | ".join(f"{o}-grams" for o in orders) + " |")
    print("|---|---|---|" + "---|" * len(orders))
    for k in args.topks:
        for v in args.variants:
            rs = [evals[v, s, k] for s in args.seeds if (v, s, k) in evals]
            if not rs:
                continue
            for name in ("real", "base_lm", "joint"):
                cells = []
                for o in orders:
                    pooled = statistics.mean(r["unique_ngram_share"][name][o]["pooled"] for r in rs)
                    within = statistics.mean(r["unique_ngram_share"][name][o]["per_sequence"] for r in rs)
                    cells.append(f"{pooled:.4f} / {within:.4f}")
                print(f"| {k} | {v} | {name} | " + " | ".join(cells) + " |")

    print()
    print("Figure 3: mean log-likelihood of a continuation (nats), mean over seeds:")
    print()
    print("| joint top-k | model | scored by | real | base-LM samples | joint samples |")
    print("|---|---|---|---|---|---|")
    for k in args.topks:
        for v in args.variants:
            rs = [evals[v, s, k] for s in args.seeds if (v, s, k) in evals]
            if not rs:
                continue
            for scorer in ("base_lm", "joint"):
                cells = [f"{statistics.mean(r['mean_log_likelihood'][scorer][name] for r in rs):.2f}"
                         for name in ("real", "base_lm", "joint")]
                print(f"| {k} | {v} | {scorer} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
