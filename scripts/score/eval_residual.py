#!/usr/bin/env python
"""Perplexity of a residual EBM as a lower-upper range next to its base LM's, how
the range narrows with the number of samples, repetition of joint vs base-LM
samples vs real text, and log-likelihood histograms (Deng et al., 2020, section
3.2, Theorem 2, Table 1, Figures 2 and 3).

For every (prefix, continuation) block of ``--gen-subset``:
- log Z: n = ``--num-samples`` continuations sampled from the base LM without
  top-k (log Z is an expectation under P_LM itself) give the estimates
  (core/residual.log_z_estimates) T_n = log (1/n) sum exp(-E) (lower) and
  (2n-1) T_n - 2(n-1) T_{n-1} with leave-one-out T_{n-1} (upper). The joint
  log-likelihood of the human continuation is log P_LM - E - log Z (eq. 2), so
  the upper log Z gives the upper perplexity. Perplexities are per continuation
  token, exp(-sum log p / M).
- Figure 2 left (``--range-ns 2,4,...``): the range again from the first k of the
  same n samples for every k listed (the samples are i.i.d., so the first k are k
  fresh samples; the ranges of different k share samples and are correlated).
- Figure 2 right: one joint sample (Algorithm 1: the task's ``--residual-joint-samples``
  proposals with ``--residual-joint-topk``, one pick in proportion to exp(-E);
  generators/joint_sampler.py), one base-LM sample (the first proposal of the same
  set: the same top-k) and the real continuation; the share of unique 2/3/4-grams
  of each set (core/token_costs.unique_ngram_share: pooled over the set, and the
  mean within a continuation). With ``--residual-joint-samples`` = n and top-k 0 the joint
  sampler reuses the log-Z samples.
- Figure 3: log-likelihoods of whole continuations under the base LM (real vs
  base-LM samples) and under the joint model with the lower log Z (real vs joint
  samples), their means, and with ``--png`` their histograms.

    python scripts/score/eval_residual.py DATA --user-dir fairseq_ext --task residual_lm \
        --residual-base-lm LM.pt --path EBM.pt --gen-subset test --num-samples 64 [--range-ns 2,4,8,16,32,64] \
        [--json OUT] [--samples-out OUT.jsonl] [--png PREFIX]
"""
import json
import math
import sys
from typing import Dict, List, Sequence, Tuple

import torch
from fairseq import checkpoint_utils, options, tasks

import fairseq_ext  # noqa: F401  (registers residual_lm / residual_energy)
from fairseq_ext.core.residual_ebm import joint_log_prob, log_z_estimates, perplexity, resample
from fairseq_ext.core.token_costs import unique_ngram_share
from fairseq_ext.generators.joint_sampler import JointSampler, lm_log_prob, with_prefixes

SETS = ("real", "base_lm", "joint")  # the continuations compared (Figure 2 right, Figure 3)
NGRAM_ORDERS = (2, 3, 4)


@torch.no_grad()
def evaluate(task, energy_model, split: str, n: int, batch_size: int, max_prefixes: int, seed: int,
             range_ns: Sequence[int] = (), device: str = "cpu") -> Tuple[dict, List[dict]]:
    """Returns the summary (perplexities, ranges by k, repetition, mean log-likelihoods)
    and one record per block (continuations, their log-likelihoods and energies)."""
    if n < 2:
        raise ValueError(f"--num-samples must be >= 2 (the upper estimate needs T_(n-1)), got {n}")
    ks = sorted(set(range_ns) | {n})
    if ks[0] < 2 or ks[-1] > n:
        raise ValueError(f"--range-ns must lie in [2, --num-samples = {n}], got {list(range_ns)}")
    cfg = task.cfg
    lm, p, length = task.base_lm.to(device), cfg.residual_prefix_len, cfg.residual_continuation_len
    energy_model = energy_model.to(device)
    blocks = task.load_blocks(split)[: max_prefixes or None]
    g = torch.Generator(device=device).manual_seed(seed)
    log_z_sampler = JointSampler(lm, length, n, topk=0, energy_batch_size=cfg.residual_energy_batch_size, generator=g)
    joint_sampler = JointSampler(lm, length, cfg.residual_joint_samples, cfg.residual_joint_topk,
                                 energy_batch_size=cfg.residual_energy_batch_size, generator=g)
    cols: Dict[str, List[torch.Tensor]] = {k: [] for k in ("conts", "lm_lp", "energy", "lower", "upper")}
    for chunk in blocks.split(batch_size):
        chunk = chunk.to(device)
        prefixes = chunk[:, :p]
        conts, energy = log_z_sampler.propose(energy_model, prefixes)
        bounds = [log_z_estimates(energy[:, :k]) for k in ks]
        if (cfg.residual_joint_samples, cfg.residual_joint_topk) != (n, 0):
            conts, energy = joint_sampler.propose(energy_model, prefixes)
        pick = resample(energy, 1, generator=g)  # (B, 1): the joint sample; proposal 0 the base-LM one
        three = torch.cat([chunk[:, None, p:], conts[:, :1], conts.gather(1, pick[..., None].expand(-1, -1, length))],
                          dim=1)  # (B, 3, L), in the order of SETS
        cols["conts"].append(three)
        cols["lm_lp"].append(lm_log_prob(lm, with_prefixes(prefixes, three), p).sum(1).view(-1, 3))
        cols["energy"].append(torch.cat([energy_model(chunk)[:, None], energy[:, :1], energy.gather(1, pick)], 1))
        cols["lower"].append(torch.stack([b[0] for b in bounds], 1))  # (B, K)
        cols["upper"].append(torch.stack([b[1] for b in bounds], 1))
    c = {k: torch.cat(v).cpu() for k, v in cols.items()}
    joint_lp = joint_log_prob(c["lm_lp"], c["energy"], c["lower"][:, -1:])  # (N, 3), lower log Z at n
    num = len(blocks)
    tokens = num * length
    lm_real = float(c["lm_lp"][:, 0].sum())

    def ppl(log_z: torch.Tensor) -> float:
        return perplexity(float(joint_log_prob(c["lm_lp"][:, 0], c["energy"][:, 0], log_z).sum()), tokens)

    seqs = {name: c["conts"][:, i].tolist() for i, name in enumerate(SETS)}
    res = {
        "split": split, "prefixes": num, "tokens": tokens, "num_samples": n,
        "base_lm_ppl": perplexity(lm_real, tokens),
        "joint_ppl_lower": ppl(c["lower"][:, -1]),  # lower log Z: higher likelihood
        "joint_ppl_upper": ppl(c["upper"][:, -1]),
        "mean_energy": float(c["energy"][:, 0].mean()),
        "mean_log_z_lower": float(c["lower"][:, -1].mean()), "mean_log_z_upper": float(c["upper"][:, -1].mean()),
        "by_num_samples": [{"n": k, "joint_ppl_lower": ppl(c["lower"][:, i]), "joint_ppl_upper": ppl(c["upper"][:, i]),
                            "mean_log_z_lower": float(c["lower"][:, i].mean()),
                            "mean_log_z_upper": float(c["upper"][:, i].mean())} for i, k in enumerate(ks)],
        "joint_samples": cfg.residual_joint_samples, "joint_topk": cfg.residual_joint_topk,
        "unique_ngram_share": {name: {str(o): {"pooled": unique_ngram_share(s, o),
                                               "per_sequence": unique_ngram_share(s, o, pooled=False)}
                                      for o in NGRAM_ORDERS} for name, s in seqs.items()},
        "mean_log_likelihood": {"base_lm": {name: float(c["lm_lp"][:, i].mean()) for i, name in enumerate(SETS)},
                                "joint": {name: float(joint_lp[:, i].mean()) for i, name in enumerate(SETS)}},
    }
    d = task.dictionary
    records = []
    for i in range(num):  # the lists follow SETS: real, base-LM sample, joint sample
        texts = {name: d.string(c["conts"][i, j]) for j, name in enumerate(SETS)}
        records.append({"id": i, "prefix": d.string(blocks[i, :p]), **texts,
                        "base_lm_log_prob": c["lm_lp"][i].tolist(), "energy": c["energy"][i].tolist(),
                        "joint_log_prob": joint_lp[i].tolist(),
                        "log_z": [float(c["lower"][i, -1]), float(c["upper"][i, -1])]})
    return res, records


def report(res: dict) -> str:
    """The summary as text: Table 1 line, Figure 2 left and right tables, Figure 3 means."""
    lines = [f"{res['split']}: {res['prefixes']} prefixes, {res['tokens']} continuation tokens, n = {res['num_samples']}",
             f"base LM ppl {res['base_lm_ppl']:.3f} | joint ppl in [{res['joint_ppl_lower']:.3f}, "
             f"{res['joint_ppl_upper']:.3f}] | mean E {res['mean_energy']:.4f} | mean log Z in "
             f"[{res['mean_log_z_lower']:.4f}, {res['mean_log_z_upper']:.4f}]",
             "", "joint ppl range by number of samples (the first n of one set):", "| n | lower | upper |",
             "|---|---|---|"]
    lines += [f"| {r['n']} | {r['joint_ppl_lower']:.3f} | {r['joint_ppl_upper']:.3f} |" for r in res["by_num_samples"]]
    lines += ["", f"unique n-grams, pooled over the set / mean within a continuation (one continuation per prefix; "
                  f"joint: n = {res['joint_samples']}, top-k {res['joint_topk']}):",
              "| continuations | " + " | ".join(f"{o}-grams" for o in NGRAM_ORDERS) + " |",
              "|---|" + "---|" * len(NGRAM_ORDERS)]
    for name, shares in res["unique_ngram_share"].items():
        lines.append(f"| {name} | " + " | ".join(f"{shares[str(o)]['pooled']:.4f} / {shares[str(o)]['per_sequence']:.4f}"
                                                 for o in NGRAM_ORDERS) + " |")
    ll = res["mean_log_likelihood"]
    lines += ["", "mean log-likelihood of a continuation (nats; joint with the lower log Z):",
              "| scored by | real | base-LM samples | joint samples |", "|---|---|---|---|"]
    lines += [f"| {m} | " + " | ".join(f"{ll[m][s]:.3f}" for s in SETS) + " |" for m in ("base_lm", "joint")]
    return "\n".join(lines)


def plot(res: dict, records: List[dict], prefix: str) -> List[str]:
    """PREFIX_ppl_vs_n.png (Figure 2 left), PREFIX_unique_ngrams.png (Figure 2 right),
    PREFIX_loglik.png (Figure 3). Returns the paths."""
    from fairseq_ext.evaluation.plotting import pyplot

    plt = pyplot()
    paths = [f"{prefix}_ppl_vs_n.png", f"{prefix}_unique_ngrams.png", f"{prefix}_loglik.png"]
    by_n = res["by_num_samples"]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ns = [r["n"] for r in by_n]
    ax.plot(ns, [r["joint_ppl_upper"] for r in by_n], "o-", label="joint, upper")
    ax.plot(ns, [r["joint_ppl_lower"] for r in by_n], "o-", label="joint, lower")
    ax.axhline(res["base_lm_ppl"], color="grey", linestyle=":", label="base LM")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("samples per prefix n")
    ax.set_ylabel("perplexity")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=80)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    colors = {"real": "tab:red", "base_lm": "black", "joint": "tab:green"}
    for i, name in enumerate(SETS):
        shares = [100 * res["unique_ngram_share"][name][str(o)]["pooled"] for o in NGRAM_ORDERS]
        ax.bar([o + (i - 1) * 0.27 for o in NGRAM_ORDERS], shares, width=0.27, color=colors[name], label=name)
    ax.set_xticks(list(NGRAM_ORDERS))
    ax.set_xlabel("n-gram order")
    ax.set_ylabel("unique n-grams, pooled (%)")
    low = min(100 * v["pooled"] for s in res["unique_ngram_share"].values() for v in s.values())
    ax.set_ylim(max(0.0, low - 5), 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=80)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), sharey=True)
    for ax, scorer, title in ((axes[0], "base_lm", "base LM"), (axes[1], "joint", "joint model")):
        values = {name: [r[f"{scorer}_log_prob"][SETS.index(name)] for r in records] for name in ("real", scorer)}
        lo, hi = min(map(min, values.values())), max(map(max, values.values()))
        for name, v in values.items():  # each model scores the real continuations and its own samples
            ax.hist(v, bins=[lo + (hi - lo) * i / 30 for i in range(31)], histtype="step", density=True,
                    color=colors[name], label=f"{name} (mean {res['mean_log_likelihood'][scorer][name]:.2f})")
        ax.set_title(f"scored by the {title}", fontsize=9)
        ax.set_xlabel("log-likelihood of a continuation (nats)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("density")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=80)
    plt.close(fig)
    return paths


def main(argv=None) -> None:
    from fairseq_ext.runtime import cli

    cli.install()  # a ConfigError ends the command with one line, exit 2
    parser = options.get_generation_parser(default_task="residual_lm")
    group = parser.add_argument_group("eval_residual")
    group.add_argument("--num-samples", type=int, default=64, help="n base-LM samples per prefix for log Z")
    group.add_argument("--range-ns", default="", help="comma-separated k <= n: the range also from the first k "
                                                      "samples (Figure 2 left)")
    group.add_argument("--max-prefixes", type=int, default=0, help="evaluate the first N blocks only (0: all)")
    group.add_argument("--json", default=None, help="also write the results to this file")
    group.add_argument("--samples-out", default=None, help="write one JSON line per prefix: the real, base-LM "
                       "and joint continuations; their base-LM and joint log-likelihoods and energies as lists in "
                       "that order; the lower and upper log Z")
    group.add_argument("--png", default=None, help="write PREFIX_{ppl_vs_n,unique_ngrams,loglik}.png "
                                                   "(needs matplotlib)")
    args = options.parse_args_and_arch(parser, argv)
    range_ns = [int(k) for k in args.range_ns.split(",") if k.strip()]
    if args.png:
        from fairseq_ext.evaluation.plotting import pyplot
        pyplot()  # fail before any work when matplotlib is missing
    task = tasks.setup_task(args)
    models, _ = checkpoint_utils.load_model_ensemble(args.path.split(":"), task=task)
    if len(models) != 1:
        raise ValueError("eval_residual takes one energy model (--path)")
    model = models[0].eval()
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    res, records = evaluate(task, model, args.gen_subset, args.num_samples, args.batch_size or 8, args.max_prefixes,
                            args.seed, range_ns, device)
    print(report(res))
    if not all(math.isfinite(v) for v in res.values() if isinstance(v, float)):
        print("warning: non-finite values", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.samples_out:
        with open(args.samples_out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    if args.png:
        print("wrote " + " ".join(plot(res, records, args.png)))


if __name__ == "__main__":
    main()
