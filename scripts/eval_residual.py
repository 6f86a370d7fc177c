#!/usr/bin/env python
"""Perplexity of a residual EBM as a lower-upper range, next to its base LM's
(Deng et al., 2020, section 3.2, Theorem 2, Table 1).

For every (prefix, continuation) block of ``--gen-subset``: n continuations are
sampled from the base LM without top-k (log Z is an expectation under P_LM
itself), giving the estimates of log Z (core/residual.log_z_estimates):
T_n = log (1/n) sum exp(-E) (lower) and (2n-1) T_n - 2(n-1) T_{n-1} with
leave-one-out T_{n-1} (upper). The joint log-likelihood of the human continuation
is log P_LM - E - log Z (eq. 2), so the upper log Z gives the upper perplexity.
Perplexities are per continuation token, exp(-sum log p / M).

    python scripts/eval_residual.py DATA --user-dir fairseq_ext --task residual_lm \
        --base-lm LM.pt --path EBM.pt --gen-subset test --num-samples 64 [--json OUT]
"""
import json
import math
import sys

import torch
from fairseq import checkpoint_utils, options, tasks

import fairseq_ext  # noqa: F401  (registers residual_lm / residual_energy)
from fairseq_ext.core.residual import joint_log_prob, log_z_estimates, perplexity
from fairseq_ext.generators.joint_sampler import energies_in_batches, lm_log_prob, sample_continuations


@torch.no_grad()
def evaluate(task, energy_model, split: str, n: int, batch_size: int, max_prefixes: int, seed: int) -> dict:
    """Sums over the blocks of ``split``: base-LM and joint (lower/upper) log-likelihoods."""
    if n < 2:
        raise ValueError(f"--num-samples must be >= 2 (the upper estimate needs T_(n-1)), got {n}")
    lm, p = task.base_lm, task.cfg.prefix_len
    blocks = task.load_blocks(split)[: max_prefixes or None]
    g = torch.Generator().manual_seed(seed)
    sums = {"lm": 0.0, "joint_lower_ppl": 0.0, "joint_upper_ppl": 0.0, "energy": 0.0, "log_z_lower": 0.0,
            "log_z_upper": 0.0}
    for chunk in blocks.split(batch_size):
        bsz = chunk.size(0)
        lm_lp = lm_log_prob(lm, chunk, p).sum(1)
        energy = energy_model(chunk)
        conts = sample_continuations(lm, chunk[:, :p], task.cfg.continuation_len, n, topk=0, generator=g)
        seqs = torch.cat([chunk[:, None, :p].expand(-1, n, -1), conts], 2).view(bsz * n, -1)
        lower, upper = log_z_estimates(energies_in_batches(energy_model, seqs, task.cfg.energy_batch_size).view(bsz, n))
        sums["lm"] += float(lm_lp.sum())
        sums["joint_lower_ppl"] += float(joint_log_prob(lm_lp, energy, lower).sum())  # lower log Z: higher ll
        sums["joint_upper_ppl"] += float(joint_log_prob(lm_lp, energy, upper).sum())
        sums["energy"] += float(energy.sum())
        sums["log_z_lower"] += float(lower.sum())
        sums["log_z_upper"] += float(upper.sum())
    num = len(blocks)
    tokens = num * task.cfg.continuation_len
    return {
        "split": split, "prefixes": num, "tokens": tokens, "num_samples": n,
        "base_lm_ppl": perplexity(sums["lm"], tokens),
        "joint_ppl_lower": perplexity(sums["joint_lower_ppl"], tokens),
        "joint_ppl_upper": perplexity(sums["joint_upper_ppl"], tokens),
        "mean_energy": sums["energy"] / num,
        "mean_log_z_lower": sums["log_z_lower"] / num, "mean_log_z_upper": sums["log_z_upper"] / num,
    }


def main(argv=None) -> None:
    parser = options.get_generation_parser(default_task="residual_lm")
    group = parser.add_argument_group("eval_residual")
    group.add_argument("--num-samples", type=int, default=64, help="n base-LM samples per prefix for log Z")
    group.add_argument("--max-prefixes", type=int, default=0, help="evaluate the first N blocks only (0: all)")
    group.add_argument("--json", default=None, help="also write the results to this file")
    args = options.parse_args_and_arch(parser, argv)
    task = tasks.setup_task(args)
    models, _ = checkpoint_utils.load_model_ensemble(args.path.split(":"), task=task)
    if len(models) != 1:
        raise ValueError("eval_residual takes one energy model (--path)")
    model = models[0].eval()
    torch.manual_seed(args.seed)
    res = evaluate(task, model, args.gen_subset, args.num_samples, args.batch_size or 8, args.max_prefixes, args.seed)
    print(f"{res['split']}: {res['prefixes']} prefixes, {res['tokens']} continuation tokens, n = {res['num_samples']}")
    print(f"base LM ppl {res['base_lm_ppl']:.3f} | joint ppl in [{res['joint_ppl_lower']:.3f}, "
          f"{res['joint_ppl_upper']:.3f}] | mean E {res['mean_energy']:.4f} | mean log Z in "
          f"[{res['mean_log_z_lower']:.4f}, {res['mean_log_z_upper']:.4f}]")
    if not all(math.isfinite(v) for v in res.values() if isinstance(v, float)):
        print("warning: non-finite values", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
