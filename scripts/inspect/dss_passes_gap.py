"""How far ``--dss-passes P`` (P parallel passes) is from the exact left-to-right
scheduled-sampling pass of ``--criterion differentiable_scheduled_sampling``
(docs/dss.md, "--dss-passes": when the approximation is safe).

For a checkpoint and the first N sentences of a split, for each teacher-forcing
probability eps and each deterministic decision mode (``soft-argmax``,
``hard-argmax``: the sampling modes draw different noise in the two passes, so
their gap would mix approximation and noise), with the same fed-position mask
(each target position fed the model's decision with probability 1 - eps, a seed)
in both passes:

- ``loss gap``: (L_P - L_exact) / L_exact, the token-level cross-entropy;
- ``argmax differs``: the share of target positions whose highest-scoring word
  differs between the P-pass scores and the exact ones;
- ``grad cosine``: cosine between the parameter gradients of L_P and L_exact
  (eval mode: no dropout, so the only difference is the approximation).

P >= T reproduces the exact pass (pass p gets positions 1..p-1 right), so
the gap must shrink to 0 as P grows.

    python scripts/inspect/dss_passes_gap.py CKPT DATA [--subset valid] [--sentences 64]
        [--eps 0.9,0.75,0.5,0.25,0] [--passes 2,3,4,8] [--alpha 1] [--json OUT]
"""
import argparse
import json
import logging

for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch
from fairseq import checkpoint_utils

import fairseq_ext  # noqa: F401  (registers the plugin)
from fairseq_ext.core.token_losses import label_smoothed_nll
from fairseq_ext.decoding.dss_passes import run_scheduled_sampling


def pass_result(model, sample, fed, mode, alpha, passes):
    """(loss, flat parameter gradient, (N, T) highest-scoring words)."""
    model.zero_grad(set_to_none=True)
    logits, _ = run_scheduled_sampling(model, sample["net_input"], fed, mode, alpha, passes)
    lprobs = model.get_normalized_probs((logits, None), log_probs=True)
    pad = model.decoder.dictionary.pad()
    loss = label_smoothed_nll(lprobs.flatten(0, 1), sample["target"].flatten(), 0.0, pad)[0] / sample["ntokens"]
    loss.backward()
    grad = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                      for p in model.parameters()])
    return loss.item(), grad, logits.argmax(-1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("data")
    parser.add_argument("--subset", default="valid")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--eps", default="0.9,0.75,0.5,0.25,0")
    parser.add_argument("--passes", default="2,3,4,8")
    parser.add_argument("--modes", default="soft-argmax,hard-argmax")
    parser.add_argument("--alpha", type=float, default=1.0, help="alpha of the soft modes (the criterion's default)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fed-position masks")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.checkpoint],
                                                                    arg_overrides={"data": args.data})
    model = models[0].float().eval()
    task.load_dataset(args.subset)
    ds = task.dataset(args.subset)
    sample = ds.collater([ds[i] for i in range(min(args.sentences, len(ds)))])
    prev = sample["net_input"]["prev_output_tokens"]
    pad = task.target_dictionary.pad()
    T = prev.size(1)
    print(f"{prev.size(0)} sentences of {args.subset} (T = {T} target positions, {sample['ntokens']} tokens); "
          f"alpha {args.alpha}; P >= {T} is exact")
    print("| mode | eps | P | loss exact | loss gap | argmax differs | grad cosine |\n|---|---|---|---|---|---|---|")
    rows = []
    gen = torch.Generator().manual_seed(args.seed)
    for eps in [float(e) for e in args.eps.split(",")]:
        fed = torch.rand(prev.shape, generator=gen) >= eps
        fed[:, 0] = False
        fed &= prev.ne(pad)
        for mode in args.modes.split(","):
            exact_loss, exact_grad, exact_dec = pass_result(model, sample, fed, mode, args.alpha, 0)
            for P in [int(p) for p in args.passes.split(",")]:
                loss, grad, dec = pass_result(model, sample, fed, mode, args.alpha, P)
                differ = (dec != exact_dec)[sample["target"].ne(pad)]
                row = {"mode": mode, "eps": eps, "passes": P, "loss_exact": exact_loss,
                       "loss_gap": (loss - exact_loss) / exact_loss,
                       "argmax_differs": differ.float().mean().item(),
                       "grad_cosine": torch.nn.functional.cosine_similarity(grad, exact_grad, dim=0).item()}
                rows.append(row)
                print(f"| {mode} | {eps:g} | {P} | {exact_loss:.4f} | {row['loss_gap']:+.4f} | "
                      f"{row['argmax_differs']:.3f} | {row['grad_cosine']:.4f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
