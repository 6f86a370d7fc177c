"""How noisy and how rough the soft beam's training gradient is (examples/soft_beam/README.md,
"Dropout in the search pass and gradient noise").

Spread: for each ``--soft-beam-dropout`` mode and alpha, the gradient of the
criterion (train mode, the checkpoint's dropout) on the first N sentences of a
split, for ``--draws`` dropout draws (seeds 0..draws-1): the range of its norm,
the range of the cosine between two draws, and the relative variance
sum_i ||g_i - mean||^2 / (draws ||mean||^2). Rows ``ce`` (cross-entropy, train
mode) and ``eval`` (the criterion with the model in eval mode) for reference.

Roughness (``--roughness``): in float64, for each mode with masks fixed by a seed,
the slope of the loss along its normalised gradient by central differences at
steps 1e-9 .. 1e-3 (parameter-norm units), against the gradient norm.

    python scripts/inspect/soft_beam_gradients.py CKPT DATA --sentences 8 --draws 6 --alphas 3.7,30 [--roughness]
"""
import argparse
import itertools
import logging

for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch
from fairseq import checkpoint_utils

import fairseq_ext  # noqa: F401  (registers the criteria)
from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion, SoftBeamHingeCriterion
from fairseq_ext.decoding.beam_search import DROPOUT_MODES


def flat_grad(model, loss) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype)
                      for p in model.parameters()])


def spread(grads):
    norms = [float(g.norm()) for g in grads]
    cos = [float(torch.nn.functional.cosine_similarity(a, b, dim=0)) for a, b in itertools.combinations(grads, 2)]
    mean = torch.stack(grads).mean(0)
    rel_var = float(sum(((g - mean) ** 2).sum() for g in grads) / (len(grads) * (mean ** 2).sum()))
    return norms, cos, rel_var


def row(name, grads):
    norms, cos, rel_var = spread(grads)
    cos_text = f"{min(cos):.3f}..{max(cos):.3f}" if cos else "-"
    print(f"| {name} | {min(norms):,.4g}-{max(norms):,.4g} | {cos_text} | {rel_var:.4g} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("data")
    parser.add_argument("--subset", default="valid")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--alphas", default="3.7,30")
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--normalization", default="local")
    parser.add_argument("--hinge", action="store_true", help="soft_beam_hinge instead of the direct loss")
    parser.add_argument("--roughness", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.checkpoint],
                                                                    arg_overrides={"data": args.data})
    model = models[0]
    task.load_dataset(args.subset)
    ds = task.dataset(args.subset)
    sample = ds.collater([ds[i] for i in range(args.sentences)])
    criterion_class = SoftBeamHingeCriterion if args.hinge else SoftBeamDirectLossCriterion
    print(f"{args.sentences} sentences of {args.subset}, {args.draws} draws, k = {args.beam}, "
          f"{criterion_class.__name__}, {args.normalization} scores")
    print("| row | gradient norm | cosine between draws | relative variance |\n|---|---|---|---|")
    model.train()
    grads = []
    for seed in range(args.draws):
        torch.manual_seed(seed)
        out = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(out, log_probs=True)
        target = sample["target"]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        nll = nll.masked_fill(target.eq(task.target_dictionary.pad()), 0)
        grads.append(flat_grad(model, nll.sum()))
    row("ce (train mode)", grads)
    for alpha in [float(a) for a in args.alphas.split(",")]:
        for mode in ["eval", *DROPOUT_MODES]:
            criterion = criterion_class(task, soft_beam_size=args.beam, soft_beam_alpha=alpha,
                                        soft_beam_normalization=args.normalization,
                                        soft_beam_dropout="none" if mode == "eval" else mode)
            model.train(mode != "eval")
            grads = []
            for seed in range(args.draws if mode in ("shared", "independent") or args.hinge else 2):
                torch.manual_seed(seed)
                grads.append(flat_grad(model, criterion(model, sample)[0]))
            row(f"alpha {alpha:g}, {mode}", grads)
    if not args.roughness:
        return
    model.double()
    params = [p for p in model.parameters()]
    print("\nroughness (float64): slope of L along g/|g| by central differences vs |g|")
    for alpha in [float(a) for a in args.alphas.split(",")]:
        for mode in DROPOUT_MODES:
            criterion = criterion_class(task, soft_beam_size=args.beam, soft_beam_alpha=alpha,
                                        soft_beam_normalization=args.normalization, soft_beam_dropout=mode)
            model.train()

            def loss():
                torch.manual_seed(0)
                return criterion(model, sample)[0]

            g = flat_grad(model, loss())
            u = g / g.norm()
            slopes = []
            with torch.no_grad():
                for eps in (1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3):
                    values = []
                    for sign in (1, -1):
                        offset = 0
                        for p in params:
                            p.add_(sign * eps * u[offset: offset + p.numel()].view_as(p))
                            offset += p.numel()
                        values.append(float(loss()))
                        offset = 0
                        for p in params:
                            p.sub_(sign * eps * u[offset: offset + p.numel()].view_as(p))
                            offset += p.numel()
                    slopes.append(f"{eps:g}: {(values[0] - values[1]) / (2 * eps):,.4g}")
            print(f"alpha {alpha:g}, {mode}: |g| = {float(g.norm()):,.4g}; " + ", ".join(slopes), flush=True)


if __name__ == "__main__":
    main()
