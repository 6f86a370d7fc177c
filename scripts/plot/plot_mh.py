#!/usr/bin/env python
"""Summarise and plot Metropolis-Hastings chain statistics written by
``fairseq-generate --task translation_mh --mh-stats-file FILE [--mh-history]``.

For each run (one stats file) and epoch: acceptance rate and novel-transition rate
(accepted proposals that changed the state, per proposal), mean E_raw and mean
E_local of the chains' states at the end of the epoch, and with ``--mh-history``
the corpus BLEU of each chain's states (sacrebleu, averaged over chains).

Prints a markdown table of the averages over the epochs after burn-in (the layout
of the thesis's Tables 6.2-6.5: E_local, novel rate, acceptance, BLEU) and with
``--png PREFIX`` draws PREFIX_{accept,novel,e_local,e_raw,bleu}.png against epochs
(Figures 6.2-6.4 analogues; needs matplotlib: ``pip install -e '.[plot]'``);
``--curves`` picks which, ``--panels`` draws them side by side in one PREFIX.png
(the thesis's figure layout), ``--bleu-line NAME=VALUE`` adds a horizontal reference
(e.g. Mask-Predict's BLEU) to the BLEU curve.

A run given as comma-separated stats files (``s1.jsonl,s2.jsonl,s3.jsonl``: one per
sampler seed) is one row: each file is summarised on its own, and the row gives the
mean +- sample std over the files (the curves: their mean).

A stats file is large (every chain's state per epoch); ``--json`` of one run of one seed
(``plot_mh.py RUN.jsonl --json RUN.curves.json``, as examples/mh_sampler/multi30k.sh writes beside
each row) holds all that its table row and curves need, and may be given in its place
(``s1.curves.json,s2.jsonl``), so tables and figures can be drawn again from a run's scores and
curves files alone (examples/mh_sampler/results/ keeps no stats files).

usage: scripts/plot/plot_mh.py RUN.jsonl[,SEED2.jsonl|SEED2.curves.json ...] [RUN2.jsonl ...] [--labels a,b]
       [--png PREFIX [--curves e_local,bleu] [--panels] [--bleu-line NAME=VALUE ...]]
       [--json FILE] [--post-process sentencepiece|none]
"""
import argparse
import json
import os
import statistics
import sys
from typing import Dict, List

import sacrebleu

from fairseq_ext.evaluation.plotting import pyplot

KEYS = ("accept", "novel", "e_local", "e_raw", "bleu")
NAMES = {"accept": "acceptance rate", "novel": "novel-transition rate", "e_local": "mean E_local",
         "e_raw": "mean E_raw", "bleu": "BLEU (mean over chains)"}


def detok(text: str, post_process: str) -> str:
    if post_process == "sentencepiece":
        return "".join(text.split()).replace("\u2581", " ").strip()
    return text


def load(path: str) -> List[dict]:
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot_mh: cannot read stats file {path}: {e}")
    if not records or "epochs" not in records[0]:
        sys.exit(f"plot_mh: {path} holds no translation_mh statistics (written by --mh-stats-file)")
    return sorted(records, key=lambda r: r["id"])


def per_epoch(records: List[dict], post_process: str) -> Dict[str, List[float]]:
    """Curves over epochs, pooled over sentences and chains."""
    n_epochs = len(records[0]["epochs"])
    out: Dict[str, List[float]] = {k: [] for k in KEYS}
    refs = [detok(r["ref"], post_process) for r in records]
    chains = len(records[0]["epochs"][0]["proposals"])
    for e in range(n_epochs):
        eps = [r["epochs"][e] for r in records]
        proposals = sum(sum(x["proposals"]) for x in eps)
        out["accept"].append(sum(sum(x["accepted"]) for x in eps) / max(1, proposals))
        out["novel"].append(sum(sum(x["novel"]) for x in eps) / max(1, proposals))
        for key in ("e_local", "e_raw"):
            values = [v for x in eps for v in x[key]]
            out[key].append(sum(values) / len(values))
        if "hyps" in eps[0]:
            bleus = [sacrebleu.corpus_bleu([detok(x["hyps"][c], post_process) for x in eps], [refs]).score
                     for c in range(chains)]
            out["bleu"].append(sum(bleus) / chains)
    return out


def summary(curves: Dict[str, List[float]], burn_in: int) -> Dict[str, float]:
    return {k: sum(v[burn_in:]) / len(v[burn_in:]) for k, v in curves.items() if v[burn_in:]}


def load_curves(path: str) -> dict:
    """A seed's curves and shape from ``--json`` of one run of one seed."""
    try:
        with open(path) as f:
            runs = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot_mh: cannot read curves file {path}: {e}")
    run = next(iter(runs.values()), None) if isinstance(runs, dict) and len(runs) == 1 else None
    if not isinstance(run, dict) or not {"curves", "burn_in", "sentences", "chains"} <= set(run):
        sys.exit(f"plot_mh: {path} is not plot_mh.py --json output of one run")
    if run.get("seeds", 1) != 1:
        sys.exit(f"plot_mh: {path} holds a run pooled over {run['seeds']} seeds; give each seed's own file")
    return seed_record({k: run["curves"].get(k, []) for k in KEYS}, run["burn_in"], run["sentences"], run["chains"])


def seed_record(curves: Dict[str, List[float]], burn_in: int, sentences: int, chains: int) -> dict:
    """One seed of a run: its curves, their averages after burn-in, and its shape."""
    return {"curves": curves, "summary": summary(curves, burn_in), "sentences": sentences,
            "burn_in": burn_in, "chains": chains}


def load_run(paths: List[str], post_process: str) -> dict:
    """One run over its seeds' stats files (or curves files): per-seed summaries, their mean
    and std, mean curves."""
    seeds = []
    for path in paths:
        if path.endswith(".json"):
            seeds.append(load_curves(path))
            continue
        records = load(path)
        seeds.append(seed_record(per_epoch(records, post_process), records[0].get("burn_in", 0), len(records),
                                 len(records[0]["epochs"][0]["proposals"])))
    shapes = {(r["sentences"], r["chains"], r["burn_in"], len(r["curves"]["accept"])) for r in seeds}
    if len(shapes) > 1:
        sys.exit(f"plot_mh: the seeds of one run differ in sentences, chains, burn-in or epochs: {', '.join(paths)}")
    keys = [k for k in KEYS if all(k in r["summary"] for r in seeds)]
    run = dict(seeds[0])
    run["curves"] = {k: [sum(v) / len(v) for v in zip(*(r["curves"][k] for r in seeds))] for k in KEYS}
    run["summary"] = {k: sum(r["summary"][k] for r in seeds) / len(seeds) for k in keys}
    run["seeds"] = len(seeds)
    if len(seeds) > 1:
        run["summary_std"] = {k: statistics.stdev(r["summary"][k] for r in seeds) for k in keys}
        run["per_seed"] = [r["summary"] for r in seeds]
    return run


def run_name(path: str) -> str:
    """RUN of RUN.jsonl or RUN.curves.json."""
    name = os.path.basename(path).rsplit(".", 1)[0]
    return name[:-len(".curves")] if name.endswith(".curves") else name


def cell(run: dict, key: str, digits: int) -> str:
    if key not in run["summary"]:
        return "-"
    text = f"{run['summary'][key]:.{digits}f}"
    if "summary_std" in run:
        text += f" +- {run['summary_std'][key]:.{digits}f}"
    return text


def reference_line(spec: str):
    """``NAME=VALUE`` of --bleu-line as (name, value); exit naming the option otherwise."""
    name, _, value = spec.rpartition("=")
    try:
        if name:
            return name, float(value)
    except ValueError:
        pass
    sys.exit(f"plot_mh: --bleu-line: expected NAME=VALUE, got {spec!r}")


def main():
    from fairseq_ext.runtime import cli

    cli.install()  # a ConfigError ends the command with one line, exit 2
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="stats files (--mh-stats-file), or a seed's --json in its place (*.json); "
                   "one run's seeds joined by commas")
    p.add_argument("--labels", help="comma-separated run names (default: file names)")
    p.add_argument("--png", help="write PREFIX_<curve>.png (with --panels: PREFIX.png)")
    p.add_argument("--curves", default=",".join(KEYS), help=f"curves to draw, comma-separated, of {','.join(KEYS)}")
    p.add_argument("--panels", action="store_true", help="one figure, the curves side by side")
    p.add_argument("--bleu-line", action="append", default=[], metavar="NAME=VALUE",
                   help="a horizontal reference line on the BLEU curve (repeatable)")
    p.add_argument("--json", help="write the curves and summaries here")
    p.add_argument("--post-process", default="sentencepiece", choices=["sentencepiece", "none"],
                   help="how to detokenize hypotheses and references for BLEU")
    args = p.parse_args()
    curves = args.curves.split(",")
    bad = [c for c in curves if c not in KEYS]
    if bad:
        sys.exit(f"plot_mh: --curves: unknown curve {bad[0]!r} (choose from {','.join(KEYS)})")
    lines = [reference_line(spec) for spec in args.bleu_line]
    try:
        plt = pyplot() if args.png else None  # fail before any work
    except ImportError as e:
        sys.exit(f"plot_mh: --png: {e}")
    labels = (args.labels.split(",") if args.labels
              else [run_name(r.split(",")[0]) for r in args.runs])
    if len(labels) != len(args.runs):
        sys.exit(f"plot_mh: {len(labels)} --labels for {len(args.runs)} runs")
    results = {}
    for label, paths in zip(labels, args.runs):
        results[label] = load_run(paths.split(","), args.post_process)
    print("| run | sentences x chains | seeds | E_local | E_raw | accept | novel | BLEU |")
    print("|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['sentences']} x {r['chains']} | {r['seeds']} | {cell(r, 'e_local', 2)} | "
              f"{cell(r, 'e_raw', 2)} | {cell(r, 'accept', 3)} | {cell(r, 'novel', 3)} | {cell(r, 'bleu', 2)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.png:
        drawn = [k for k in curves if any(r["curves"][k] for r in results.values())]
        if args.panels and drawn:
            fig, axes = plt.subplots(1, len(drawn), figsize=(4 * len(drawn), 3.2), squeeze=False)
            for key, ax in zip(drawn, axes[0]):
                draw_curve(ax, key, results, lines)
            fig.tight_layout()
            fig.savefig(f"{args.png}.png", dpi=110)
            plt.close(fig)
        else:
            for key in drawn:
                fig, ax = plt.subplots(figsize=(5, 3.5))
                draw_curve(ax, key, results, lines)
                fig.tight_layout()
                fig.savefig(f"{args.png}_{key}.png", dpi=110)
                plt.close(fig)


def draw_curve(ax, key: str, results: Dict[str, dict], bleu_lines) -> None:
    """One curve of every run against epochs, the end of burn-in dotted; on the BLEU
    curve, the reference lines (dashed, labelled)."""
    for label, r in results.items():
        if r["curves"][key]:
            ax.plot(range(len(r["curves"][key])), r["curves"][key], label=label)
    burn = max(r["burn_in"] for r in results.values())
    if burn:
        ax.axvline(burn - 0.5, color="grey", linestyle=":", linewidth=1)
    if key == "bleu":
        greys = ("black", "dimgrey", "silver")
        for i, (name, value) in enumerate(bleu_lines):  # every line drawn, the greys repeating
            color = greys[i % len(greys)]
            ax.axhline(value, color=color, linestyle="--", linewidth=1, label=f"{name} ({value:g})")
    ax.set_xlabel("epoch")
    ax.set_ylabel(NAMES[key])
    ax.legend(fontsize=7)


if __name__ == "__main__":
    main()
