#!/usr/bin/env python
"""Sample the negatives of a residual EBM once, offline (Deng et al., 2020, section 4.1).

For every (prefix, continuation) block of each split (task ``residual_lm``), draw
``--num-samples`` n continuations from the base LM (``--residual-base-lm``, top-k when
``--topk`` > 0) and write ``{out-dir}/{split}.negatives.pt``: ``tokens`` (N, n, L)
aligned with the blocks, ``lm_log_prob`` (N, n) their untruncated base-LM
log-probabilities, ``pos_lm_log_prob`` (N,) that of the human continuation, and
the settings (prefix_len, continuation_len, topk, base_lm, seed). Runs on the GPU
when one is visible (``--cpu`` to stay on the CPU; the random stream differs).

    python scripts/prepare/sample_negatives.py DATA --residual-base-lm LM.pt --splits train,valid \
        --num-samples 8 --topk 0 [--residual-prefix-len 24 --residual-continuation-len 8 --out-dir DIR]
"""
import os
import sys
import time

import torch
from fairseq import options, tasks

import fairseq_ext  # noqa: F401  (registers residual_lm)
from fairseq_ext.generators.joint_sampler import lm_log_prob, sample_continuations, with_prefixes


def main(argv=None) -> None:
    parser = options.get_generation_parser(default_task="residual_lm")
    group = parser.add_argument_group("sample_negatives")
    group.add_argument("--splits", default="train,valid", help="comma-separated splits")
    group.add_argument("--num-samples", type=int, default=16,
                       help="n negatives per prefix (Deng et al. store 16 or 128; training draws "
                            "--residual-num-negatives of them anew every epoch, so n must be well above it)")
    group.add_argument("--topk", type=int, default=0,
                       help="top-k of the base-LM sampling (0: none; > 0 is refused by residual_lm training unless "
                            "--residual-allow-topk-negatives: NCE's noise must be P_LM)")
    group.add_argument("--out-dir", default=None, help="where to write {split}.negatives.pt (default: the data dir)")
    group.add_argument("--sample-batch-size", type=int, default=16, help="prefixes per sampling call")
    args = options.parse_args_and_arch(parser, argv)
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
    task = tasks.setup_task(args)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"  # GPU unless --cpu
    lm = task.base_lm.to(device)
    out_dir = args.out_dir or task.cfg.residual_negatives_dir or args.data.split(":")[0]
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator(device=device).manual_seed(args.seed)
    torch.manual_seed(args.seed)
    p, length = task.cfg.residual_prefix_len, task.cfg.residual_continuation_len
    for split in args.splits.split(","):
        blocks = task.load_blocks(split)
        start = time.time()
        tokens, lps, pos_lps = [], [], []
        for chunk in blocks.split(args.sample_batch_size):
            chunk = chunk.to(device)
            conts = sample_continuations(lm, chunk[:, :p], length, args.num_samples, args.topk, generator=g)
            tokens.append(conts.int().cpu())
            lps.append(lm_log_prob(lm, with_prefixes(chunk[:, :p], conts), p).sum(1).view(-1, args.num_samples).cpu())
            pos_lps.append(lm_log_prob(lm, chunk, p).sum(1).cpu())
        path = os.path.join(out_dir, f"{split}.negatives.pt")
        torch.save({"tokens": torch.cat(tokens), "lm_log_prob": torch.cat(lps), "pos_lm_log_prob": torch.cat(pos_lps),
                    "prefix_len": p, "continuation_len": length, "topk": args.topk,
                    "base_lm": os.path.abspath(task.cfg.residual_base_lm), "seed": args.seed}, path)
        print(f"{split}: {len(blocks)} prefixes x {args.num_samples} negatives -> {path} "
              f"({time.time() - start:.1f}s)", file=sys.stderr)


if __name__ == "__main__":
    main()
