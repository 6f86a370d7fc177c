"""Proposals per second of the Metropolis-Hastings sampler for conditional masked LMs
(``fairseq_ext/core/mcmc.py``), against a straightforward Algorithm 4, on the same
``cmlm_transformer`` and the same states, measured in the same run.

Run: ``.venv/bin/python bench/bench_mh.py`` (a minute or two on one CPU core;
``--quick`` for a smoke run, ``--json FILE`` to keep the rows).

Model: ``cmlm_transformer`` (2+2 layers, embed 192, ffn 512, 4 heads: the
Multi30k recipe's shape), random weights, eval mode, on the toy translation corpus
(about 80 target types, 6-12 tokens). States: the gold targets of the first B
sentences, K chains each. One epoch of single-site MH with E_raw.

Rows:
- ``algorithm 4``: the thesis's pseudo-code as written: per chain and position,
  E(y) recomputed (one decoder pass per masked position), one proposal pass, E(y')
  (one pass per position): 2T + 1 single-row passes per proposal. Timed on the first
  ``--baseline-chains`` chains only (it is slow); the rate is per proposal.
- ``ours, one chain at a time``: our kernel (the T single-masked copies of y' in one
  batched pass, E(y) carried over: T + 1 rows in 2 passes per proposal), called
  per chain.
- ``ours, all chains``: the same with all B x K chains advanced together (what
  fairseq-generate runs).

Time: ``--warmup`` untimed rounds, ``--repeats`` interleaved rounds, median wall
clock. Printed, never asserted.
"""
import logging
import os
import tempfile

for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch

from fairseq_ext.synthetic import tiny_models, toy
from fairseq_ext.core import mcmc
from fairseq_ext.generators.mh_sampler import cmlm_logits_fn, forbidden_symbols

import timing  # bench/timing.py, beside this script

SHAPE = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "192", "--decoder-embed-dim", "192",
         "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4"]


def algorithm4(logits_fn, tokens, free, owner, mask_idx, forbidden, generator):
    """One epoch of Algorithm 4 as written, one chain and one position at a time;
    returns the number of proposals made."""
    def energy(y, o, positions):
        e = 0.0
        for t in positions:
            masked = y.clone()
            masked[t] = mask_idx
            e -= logits_fn(masked[None], o, t.view(1, 1))[0, 0, y[t]].item()
        return e

    proposals = 0
    for c in range(tokens.size(0)):
        y, o = tokens[c].clone(), owner[c:c + 1]
        positions = free[c].nonzero().flatten()
        for t in positions:
            e_old = energy(y, o, positions)
            masked = y.clone()
            masked[t] = mask_idx
            log_q = mcmc.proposal_log_probs(logits_fn(masked[None], o, t.view(1, 1))[0, 0], forbidden=forbidden)
            new = mcmc.gumbel_draw(log_q, generator)
            y_new = y.clone()
            y_new[t] = new
            log_a = min(0.0, e_old - energy(y_new, o, positions) + (log_q[y[t]] - log_q[new]).item())
            if torch.rand((), generator=generator).log().item() < log_a:
                y = y_new
            proposals += 1
    return proposals


def main():
    p = timing.step_bench_parser(__doc__)
    p.add_argument("--chains", type=int, default=4, help="chains per sentence")
    p.add_argument("--baseline-chains", type=int, default=2, help="chains timed for algorithm 4")
    args = timing.quick_settings(p.parse_args())
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        raw = toy.write_toy_data(os.path.join(tmp, "raw"), sizes=(max(64, args.batch_size), 10, 10), seed=1)
        data = toy.binarize_translation(raw, os.path.join(tmp, "bin"))
        shape = [] if args.quick else SHAPE
        task, model, _ = tiny_models.build_task_and_model(data, "translation_mh", "cmlm_transformer", shape)
        task.load_dataset("train")
    model = model.to(device).eval()
    ds = task.dataset("train")
    sample = ds.collater([ds[i] for i in range(args.batch_size)])
    d = task.target_dictionary
    src = sample["net_input"]["src_tokens"].to(device)
    owner = torch.arange(src.size(0), device=device).repeat_interleave(args.chains)
    tokens = sample["target"].to(device)[owner]
    free = tokens.ne(d.pad()) & tokens.ne(d.bos()) & tokens.ne(d.eos())
    forbidden = forbidden_symbols(d, device)
    cfg = mcmc.MHConfig(energy="raw", burn_in=0, epochs=1)
    nb = min(args.baseline_chains, tokens.size(0))

    with torch.no_grad():
        enc = model.forward_encoder([src, sample["net_input"]["src_lengths"].to(device)])
        fn = cmlm_logits_fn(model, enc)

        def ours_all():
            mcmc.run_chains(fn, tokens, free, owner, d.unk(), cfg, forbidden=forbidden,
                            generator=torch.Generator().manual_seed(0))
            return int(free.sum())

        def ours_each():
            for c in range(tokens.size(0)):
                mcmc.run_chains(fn, tokens[c:c + 1], free[c:c + 1], owner[c:c + 1], d.unk(), cfg,
                                forbidden=forbidden, generator=torch.Generator().manual_seed(0))
            return int(free.sum())

        def alg4():
            return algorithm4(fn, tokens[:nb], free[:nb], owner[:nb], d.unk(), forbidden,
                              torch.Generator().manual_seed(0))

        rows_fns = {"algorithm 4": alg4, "ours, one chain at a time": ours_each, "ours, all chains": ours_all}
        ms, counts = timing.interleaved(rows_fns, args.warmup, args.repeats, device)

    base = counts["algorithm 4"] / ms["algorithm 4"]
    rows = []
    for name in rows_fns:
        rate = counts[name] / ms[name] * 1000
        rows.append({"row": name, "proposals": counts[name], "ms": ms[name], "proposals_per_s": rate,
                     "speedup": rate / (base * 1000)})
    timing.report(f"cmlm_transformer ({'tiny' if args.quick else '2+2 layers, 192'}), {src.size(0)} sentences x "
                  f"{args.chains} chains, mean target length {free.sum(1).float().mean():.1f}, device {device}, "
                  f"{args.threads} thread(s)",
                  timing.table(["row", "proposals", "ms", "proposals/s", "vs algorithm 4"],
                               [[r["row"], str(r["proposals"]), f"{r['ms']:.1f}", f"{r['proposals_per_s']:.1f}",
                                 f"{r['speedup']:.1f}x"] for r in rows]), rows, args.json, indent=1)


if __name__ == "__main__":
    main()
