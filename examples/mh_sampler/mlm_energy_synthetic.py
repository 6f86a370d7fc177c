#!/usr/bin/env python
"""Table 6.1 (Goyal thesis), CPU scale: exact held-out NLL (nats) of BiLSTM E_raw
models trained by exact log-likelihood (LL), exact pseudo-likelihood (PLL) and the
MLM objective on enumerable synthetic data (see synthetic.py).

usage: examples/mh_sampler/mlm_energy_synthetic.py [--settings palindrome-1k,hmm-10k,...]
       [--seeds 1,2] [--steps 300] [--dim 32] [--lr 0.01] [--json FILE]
A setting is GENERATOR-SIZE with GENERATOR in palindrome, hmm, hmm-high and SIZE
like 1k or 10k (training sequences drawn from the true distribution).
"""
import argparse
import json
import sys

import torch

from fairseq_ext.synthetic import mlm_energy as synthetic

DEFAULT = "palindrome-1k,palindrome-10k,hmm-1k,hmm-10k,hmm-high-1k,hmm-high-10k"


def parse_setting(s: str):
    kind, _, size = s.rpartition("-")
    if kind not in synthetic.GENERATORS or not size.endswith("k") or not size[:-1].isdigit():
        sys.exit(f"run.py: bad setting {s!r}: expected GENERATOR-SIZE, GENERATOR in {synthetic.GENERATORS}, SIZE like 1k")
    return kind, int(size[:-1]) * 1000


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default=DEFAULT)
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = {}
    print("| setting | True | LL | PLL | MLM |")
    print("|---|---|---|---|---|")
    for setting in args.settings.split(","):
        kind, n = parse_setting(setting)
        runs = [synthetic.table_row(kind, n, seed, synthetic.TrainConfig(steps=args.steps, lr=args.lr, batch=args.batch,
                                                                         dim=args.dim, seed=seed)) for seed in seeds]
        mean = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
        rows[setting] = {"mean": mean, "runs": runs}
        print(f"| {setting} | " + " | ".join(f"{mean[k]:.2f}" for k in ("true", "ll", "pll", "mlm")) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
