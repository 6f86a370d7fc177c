#!/usr/bin/env python
"""How sharp MRT's q is on a checkpoint: sample S candidates per source sentence, as
``--criterion mrt`` does, and report for each alpha the mean largest q, the share of
inputs whose largest q exceeds 0.9, the entropy of q (against log of the number of
distinct candidates, its maximum), and the expected length under q relative to the
candidates' mean length (below 1: q favours short candidates); plus how often a
candidate repeats.

usage: mrt_candidates.py DATA CHECKPOINT [--subset valid] [--sentences 500]
       [--candidates 8] [--alphas 1 0.005] [--seed 1]
"""
import argparse

import torch
from fairseq import checkpoint_utils

from fairseq_ext.core.risk import distinct_mask, mrt_distribution
from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("checkpoint")
    p.add_argument("--subset", default="valid")
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--alphas", type=float, nargs="+", default=[1.0, 0.005])
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    import fairseq_ext  # noqa: F401  (registers the plugin; checkpoints load under torch >= 2.6)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([a.checkpoint], arg_overrides={"data": a.data})
    model = models[0].eval()
    task.load_dataset(a.subset)
    ds = task.dataset(a.subset)
    cfg = DecodeConfig(strategy="sample", num_candidates=a.candidates, max_len_ref_ratio=1.3)
    gen = torch.Generator().manual_seed(a.seed)
    log_p, lengths, masks = [], [], []
    n = min(a.sentences, len(ds))
    for start in range(0, n, 50):
        batch = ds.collater([ds[i] for i in range(start, min(start + 50, n))])
        cand = decode_candidates(model, batch, cfg, generator=gen)
        log_p.append(cand.scores.view(-1, a.candidates).double())
        lengths.append(cand.lengths.view(-1, a.candidates).double())
        masks.append(distinct_mask(cand.as_list(), a.candidates))
    log_p, lengths, mask = torch.cat(log_p), torch.cat(lengths), torch.cat(masks)
    distinct = mask.sum(1).double()
    print(f"{n} sentences of {a.subset}, {a.candidates} samples each: {distinct.mean():.2f} distinct on average, "
          f"{(distinct < a.candidates).double().mean():.1%} of the inputs with a repeat")
    print("alpha   | mean max q | max q > 0.9 | entropy (max) | E_q[len] / mean len")
    for alpha in a.alphas:
        q = mrt_distribution(log_p, alpha, mask)
        entropy = -(q * torch.log(q.clamp_min(1e-300))).sum(1)
        mean_len = (lengths * mask).sum(1) / distinct
        print(f"{alpha:<7g} | {q.max(1).values.mean():10.3f} | {(q.max(1).values > 0.9).double().mean():11.1%} | "
              f"{entropy.mean():.3f} ({torch.log(distinct).mean():.3f}) | {((q * lengths).sum(1) / mean_len).mean():.2f}")


if __name__ == "__main__":
    main()
