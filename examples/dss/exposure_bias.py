#!/usr/bin/env python
"""Exposure bias where it must show: (differentiable) scheduled sampling against
teacher forcing on running sums mod m (``fairseq_ext/synthetic/running_sums.py``).

Every run goes through ``fairseq-train`` and ``fairseq-generate``: a tiny LSTM
or transformer, the same data, optimizer, batch size and number of epochs for
every system; cross-entropy (``--criterion cross_entropy``) or
``--criterion differentiable_scheduled_sampling`` with the thesis's schedule
(teacher forcing in epoch 1, then eps = k / (k + exp(t / k)) per epoch, t =
epochs after the first; alpha fixed at 1 or multiplied by ALPHA_GROWTH per
epoch). Every system is scored on its last checkpoint (the same selection rule
for all: the validation loss fairseq computes is teacher-forced and would favour
teacher forcing). k is chosen on dev from K_GRID with DSS soft-argmax (fixed
alpha), seed 1, per architecture, and then used for every scheduled-sampling
system of that architecture.

Scores (greedy decoding, ``--beam 1``): token accuracy, whole-sequence accuracy
and accuracy by target position; beside them the teacher-forced accuracy by
position (argmax given the gold prefix) and the compounding gap, teacher-forced
minus greedy accuracy: how much of the greedy loss comes from the model's own
earlier mistakes; and on test, recovery from one wrong token in the gold history
(``running_sums.corrupted_history``: the share of next answers that take the sum
from the source, "recovered", or carry the error forward, "followed").

Resumable: every stage skips what its output file says is done.

``--dss-passes P`` trains the scheduled-sampling systems with the P-pass
approximation instead of the exact sequential pass (runs named SYSTEM_pP, beside
the exact ones; CE is unaffected): what the approximation does to the result.

``--lr-decay`` lets the learning rate fall linearly to 0 over the run (fairseq's
``polynomial_decay``, power 1) instead of keeping it constant. ``--epochs N
--select-every E`` trains N epochs instead of 20 and scores, for every system, the checkpoint of epochs E, 2E, ... with the best greedy dev sequence accuracy (the thesis's
protocol: trained to convergence, selected on dev); the dev curve is kept in each run's
``select.json``. Use a new WORK_DIR for another budget (k is chosen again there).

usage: python examples/dss/exposure_bias.py WORK_DIR [--archs lstm transformer]
       [--seeds 1 2 3] [--systems ...] [--k K] [--dss-passes P] [--epochs N --select-every E] [--lr-decay] [--table]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from fairseq_ext.evaluation.comparison import format_mean_std, paired_bootstrap_mean
from fairseq_ext.evaluation.generate_output import read_generate_file
from fairseq_ext.synthetic import running_sums, toy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def percent(values):
    """Mean +- std over seeds of shares in [0, 1], in percent."""
    return format_mean_std(values, digits=1, scale=100.0)

DATA = dict(sizes=(4000, 300, 300), modulus=10, max_step=2, min_len=4, max_len=16, seed=1)
EPOCHS = 20
BATCH = ["--batch-size", "64"]
OPTIM = ["--optimizer", "adam", "--lr", "0.005", "--clip-norm", "1"]
UPDATES_PER_EPOCH = -(-DATA["sizes"][0] // int(BATCH[1]))  # batches of 64 pairs: 63
ALPHA_GROWTH = 1.25
K_GRID = (1, 3, 10)
ARCHS = {
    "lstm": ["--arch", "lstm", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
             "--decoder-embed-dim", "32", "--encoder-hidden-size", "64", "--decoder-hidden-size", "64",
             "--decoder-out-embed-dim", "32", "--dropout", "0"],
    "transformer": ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
                    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
                    "--decoder-attention-heads", "2", "--dropout", "0"],
}
DSS = ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule", "inverse_sigmoid",
       "--dss-schedule-unit", "epoch", "--dss-warmup", "1"]
SYSTEMS = {  # name: criterion options (K is replaced by the k chosen on dev)
    "ce": ["--criterion", "cross_entropy"],
    "ss_greedy": DSS + ["--dss-mode", "hard-argmax", "--dss-decay-k", "K"],
    "ss_sample": DSS + ["--dss-mode", "hard-sample", "--dss-decay-k", "K"],
    "soft_greedy_fixed": DSS + ["--dss-mode", "soft-argmax", "--dss-decay-k", "K", "--dss-alpha", "1"],
    "soft_greedy_annealed": DSS + ["--dss-mode", "soft-argmax", "--dss-decay-k", "K", "--dss-alpha", "1",
                                   "--dss-alpha-growth", str(ALPHA_GROWTH)],
    "soft_sample_fixed": DSS + ["--dss-mode", "soft-sample", "--dss-decay-k", "K", "--dss-alpha", "1"],
    "soft_sample_annealed": DSS + ["--dss-mode", "soft-sample", "--dss-decay-k", "K", "--dss-alpha", "1",
                                   "--dss-alpha-growth", str(ALPHA_GROWTH)],
}
LABELS = {
    "ce": "CE (teacher forcing)",
    "ss_greedy": "scheduled sampling, greedy (hard-argmax)",
    "ss_sample": "scheduled sampling, sample (hard-sample)",
    "soft_greedy_fixed": "DSS soft-argmax, alpha 1 fixed",
    "soft_greedy_annealed": f"DSS soft-argmax, alpha 1 x{ALPHA_GROWTH}/epoch",
    "soft_sample_fixed": "DSS soft-sample, alpha 1 fixed",
    "soft_sample_annealed": f"DSS soft-sample, alpha 1 x{ALPHA_GROWTH}/epoch",
}
BUCKETS = ((1, 4), (5, 8), (9, 12), (13, 16))


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    return e


def sh(args, log, append=False):
    with open(log, "a" if append else "w") as f:
        proc = subprocess.run(args, cwd=REPO, env=env(), stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}), see {log}: {' '.join(args)}")


def prepare(work):
    """Generate and binarize the data once; processes started side by side on one WORK_DIR each
    build it in a directory of their own and the first rename wins."""
    bin_dir = os.path.join(work, "bin")
    if not os.path.isfile(os.path.join(bin_dir, "test.src-tgt.tgt.idx")):
        tmp = os.path.join(work, f".prepare.{os.getpid()}")
        raw = running_sums.write_prefix_sum_data(os.path.join(tmp, "raw"), **DATA)
        toy.binarize_translation(raw, os.path.join(tmp, "bin"))
        try:
            os.rename(os.path.join(tmp, "bin"), bin_dir)
        except OSError:  # another process renamed its copy first (same seed, same data)
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    return bin_dir


def run(work, bin_dir, arch, system, seed, k, splits=("valid", "test"), tag=None, passes=None,
        epochs=EPOCHS, select_every=None, lr_decay=False):
    """Train, decode and score one system (with ``--dss-passes passes`` if given) for ``epochs``
    epochs; scored on the last checkpoint, or with ``select_every`` E on the checkpoint of epochs
    E, 2E, ... with the best greedy dev sequence accuracy; ``lr_decay``: the learning rate falls
    linearly to 0 over the run. Returns the run directory."""
    name = tag or run_name(system, passes)
    d = os.path.join(work, arch, f"{name}.s{seed}")
    os.makedirs(d, exist_ok=True)
    done = os.path.join(d, "train.done")
    if not os.path.isfile(done):
        crit = [str(k) if a == "K" else a for a in SYSTEMS[system]]
        if passes is not None and system != "ce":
            crit += ["--dss-passes", str(passes)]
        saving = ["--no-epoch-checkpoints"] if select_every is None else ["--save-interval", str(select_every)]
        if lr_decay:
            saving += ["--lr-scheduler", "polynomial_decay", "--power", "1", "--end-learning-rate", "0",
                       "--total-num-update", str(epochs * UPDATES_PER_EPOCH)]
        # an interrupted run resumes from checkpoint_last.pt (optimizer state included) when rerun
        sh(["fairseq-train", bin_dir, "--user-dir", "fairseq_ext", "--task", "translation"] + ARCHS[arch] + crit
           + OPTIM + BATCH + saving + ["--max-epoch", str(epochs), "--save-dir", d, "--num-workers", "0",
                                       "--seed", str(seed), "--log-format", "simple", "--log-interval", "20"],
           os.path.join(d, "train.log"), append=True)
        open(done, "w").close()
    if select_every is None:
        ckpt, epoch = os.path.join(d, "checkpoint_last.pt"), None
    else:
        epoch = select(d, bin_dir, epochs, select_every)
        ckpt = os.path.join(d, f"checkpoint{epoch}.pt")
    for split in splits:
        js = os.path.join(d, f"{split}.json")
        if os.path.isfile(js):
            add_recovery(js, ckpt, bin_dir, split)
            add_seq_correct(js, os.path.join(d, f"{split}.gen"))
            continue
        scores = greedy_scores(ckpt, bin_dir, split, os.path.join(d, f"{split}.gen"))
        scores["teacher_forced_by_position"] = running_sums.teacher_forced_by_position(ckpt, bin_dir, split)
        if epoch is not None:
            scores["epoch"] = epoch
        with open(js, "w") as f:
            json.dump(scores, f)
        add_recovery(js, ckpt, bin_dir, split)
    print(f"done: {arch} {name} seed {seed}", flush=True)
    return d


def greedy_scores(ckpt, bin_dir, split, gen):
    """``running_sums.position_accuracy`` of ``fairseq-generate --beam 1`` on ``split``."""
    sh(["fairseq-generate", bin_dir, "--user-dir", "fairseq_ext", "--path", ckpt, "--gen-subset", split,
        "--beam", "1", "--batch-size", "300", "--required-batch-size-multiple", "1", "--num-workers", "0"], gen)
    return scores_of_generate(gen)


def scores_of_generate(gen):
    return running_sums.score_generate_output(read_generate_file(gen))


def select(d, bin_dir, epochs, every):
    """The epoch (of the checkpoints every ``every`` epochs) with the best greedy dev sequence
    accuracy, the earliest on ties; the dev curve is kept in ``select.json`` (resumable)."""
    path = os.path.join(d, "select.json")
    curve = {}
    if os.path.isfile(path):
        with open(path) as f:
            curve = {int(e): a for e, a in json.load(f)["dev_seq_acc"].items()}
    for epoch in range(every, epochs + 1, every):
        if epoch not in curve:
            ckpt = os.path.join(d, f"checkpoint{epoch}.pt")
            curve[epoch] = greedy_scores(ckpt, bin_dir, "valid", os.path.join(d, "select.gen"))["seq_acc"]
            with open(path, "w") as f:
                json.dump({"dev_seq_acc": curve}, f)
    best = max(sorted(curve), key=lambda e: curve[e])
    with open(path, "w") as f:
        json.dump({"dev_seq_acc": curve, "best_epoch": best}, f)
    return best


def add_recovery(js, ckpt, bin_dir, split):
    """Add the test split's recovery from one wrong history token (running_sums.corrupted_history) to
    its scores, once; scores written before it existed get it while their checkpoint is there."""
    if split != "test" or not os.path.isfile(ckpt):
        return
    with open(js) as f:
        scores = json.load(f)
    if "corrupted_history" not in scores:
        scores["corrupted_history"] = running_sums.corrupted_history_of_checkpoint(ckpt, bin_dir, split)
        with open(js, "w") as f:
            json.dump(scores, f)


def add_seq_correct(js, gen):
    """Add per-sentence exact matches to scores that lack them (written by earlier versions of this
    script), from the run's generate output where it is there, once."""
    with open(js) as f:
        scores = json.load(f)
    if "seq_correct" not in scores and os.path.isfile(gen):
        scores["seq_correct"] = scores_of_generate(gen)["seq_correct"]
        with open(js, "w") as f:
            json.dump(scores, f)


def significance(work, arch, systems, passes):
    """Test sequence accuracy against CE, paired by sentence (fairseq_ext.evaluation.comparison's
    paired bootstrap of the mean difference): per seed, pooled over seeds (each system's seed i
    against CE's seed i), and best-on-dev restart against CE's best-on-dev restart."""
    runs = {}
    for system in systems:
        name = run_name(system, passes)
        dev, test = load_by_seed(work, arch, name, "valid"), load_by_seed(work, arch, name, "test")
        runs[system] = {seed: (dev[seed]["seq_acc"], test[seed]) for seed in test
                        if seed in dev and "seq_correct" in test[seed]}
    if "ce" not in runs or not runs["ce"]:
        return
    ce = runs["ce"]
    ce_best = max(ce, key=lambda s: ce[s][0])
    print(f"\ntest sequence accuracy against CE, paired by sentence (bootstrap p, 10,000 resamples); "
          f"best-on-dev restart against CE's (seed {ce_best}, {100 * ce[ce_best][1]['seq_acc']:.1f}):\n")
    print("| system | by seed | minus CE by seed (p) | pooled minus CE (p) | best-on-dev (seed) | minus CE's best (p) |\n"
          + "|" + "---|" * 6)
    for system in systems:
        mine = runs.get(system, {})
        common = sorted(set(mine) & set(ce))
        if not common:
            continue
        diffs, pooled_s, pooled_c = [], [], []
        for seed in common:
            a, b = np.array(mine[seed][1]["seq_correct"], float), np.array(ce[seed][1]["seq_correct"], float)
            p = paired_bootstrap_mean(a, b, 10000, seed) if system != "ce" else 1.0
            diffs.append(f"{100 * (a.mean() - b.mean()):+.1f} ({p:.3f})")
            pooled_s.append(a)
            pooled_c.append(b)
        a, b = np.concatenate(pooled_s), np.concatenate(pooled_c)
        p = paired_bootstrap_mean(a, b, 10000, 0) if system != "ce" else 1.0
        best = max(mine, key=lambda s: mine[s][0])
        x, y = np.array(mine[best][1]["seq_correct"], float), np.array(ce[ce_best][1]["seq_correct"], float)
        pb = paired_bootstrap_mean(x, y, 10000, 0) if system != "ce" else 1.0
        print("| " + " | ".join([
            label(system, passes), " / ".join(f"{100 * mine[s][1]['seq_acc']:.1f}" for s in common),
            " / ".join(diffs), f"{100 * (a.mean() - b.mean()):+.2f} ({p:.3f})",
            f"{100 * x.mean():.1f} ({best})", f"{100 * (x.mean() - y.mean()):+.1f} ({pb:.3f})"]) + " |")


def run_name(system, passes):
    return system if passes is None or system == "ce" else f"{system}_p{passes}"


def label(system, passes):
    return LABELS[system] + ("" if passes is None or system == "ce" else f", {passes} passes")


def load_by_seed(work, arch, name, split):
    """{seed: scores of ``split``} of the runs of ``name`` that have them."""
    out = {}
    for seed_dir in os.listdir(os.path.join(work, arch)) if os.path.isdir(os.path.join(work, arch)) else []:
        if seed_dir.startswith(name + ".s"):
            js = os.path.join(work, arch, seed_dir, f"{split}.json")
            if os.path.isfile(js):
                with open(js) as f:
                    out[int(seed_dir[len(name) + 2:])] = json.load(f)
    return out


def load(work, arch, name, split):
    """The scores of ``split`` of the runs of ``name``, by seed."""
    by_seed = load_by_seed(work, arch, name, split)
    return [by_seed[seed] for seed in sorted(by_seed)]


def choose_k(work, bin_dir, arch, **budget):
    """k with the best dev sequence accuracy of DSS soft-argmax (alpha 1 fixed), seed 1."""
    path = os.path.join(work, arch, "k_choice.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)["k"]
    dev = {}
    for k in K_GRID:
        run(work, bin_dir, arch, "soft_greedy_fixed", 1, k, splits=("valid",), tag=f"k{k}", **budget)
        dev[k] = load(work, arch, f"k{k}", "valid")[0]["seq_acc"]
    best = max(K_GRID, key=lambda k: dev[k])
    with open(path, "w") as f:
        json.dump({"k": best, "dev_seq_acc": dev}, f)
    return best


def bucket(scores, key, lo, hi):
    by = {int(t): a for t, a in scores[key].items()}
    vals = [by[t] for t in range(lo, hi + 1) if t in by]
    return sum(vals) / len(vals)


def table(work, archs, systems, passes=None):
    for arch in archs:
        kpath = os.path.join(work, arch, "k_choice.json")
        if os.path.isfile(kpath):
            with open(kpath) as f:
                kc = json.load(f)
            print(f"\n{arch}: k = {kc['k']} (dev seq acc of DSS soft-argmax by k, seed 1: "
                  + ", ".join(f"{k}: {100 * v:.1f}" for k, v in kc["dev_seq_acc"].items()) + ")")
        head = ["system", "dev seq acc", "test token acc", "test seq acc"] + \
               [f"pos {lo}-{hi}" for lo, hi in BUCKETS] + ["seeds"]
        print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for system in systems:
            name = run_name(system, passes)
            dev, test = load(work, arch, name, "valid"), load(work, arch, name, "test")
            cells = [label(system, passes), percent([s["seq_acc"] for s in dev]), percent([s["token_acc"] for s in test]),
                     percent([s["seq_acc"] for s in test])]
            cells += [percent([bucket(s, "by_position", lo, hi) for s in test]) for lo, hi in BUCKETS]
            print("| " + " | ".join(cells + [str(len(test))]) + " |")
        epochs = {system: [s["epoch"] for s in load(work, arch, run_name(system, passes), "test") if "epoch" in s]
                  for system in systems}
        if any(epochs.values()):
            print("\nselected epoch (best greedy dev sequence accuracy), by seed: "
                  + "; ".join(f"{label(system, passes)} {' / '.join(map(str, e))}" for system, e in epochs.items() if e))
        head = ["system"] + [f"teacher-forced pos {lo}-{hi}" for lo, hi in BUCKETS[2:]] + \
               [f"compounding pos {lo}-{hi}" for lo, hi in BUCKETS[2:]] + ["recovered", "followed"]
        print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for system in systems:
            test = load(work, arch, run_name(system, passes), "test")
            tf = [percent([bucket(s, "teacher_forced_by_position", lo, hi) for s in test]) for lo, hi in BUCKETS[2:]]
            gap = [percent([bucket(s, "teacher_forced_by_position", lo, hi) - bucket(s, "by_position", lo, hi)
                             for s in test]) for lo, hi in BUCKETS[2:]]
            probe = [s["corrupted_history"] for s in test if "corrupted_history" in s]
            rec = [percent([c[key] for c in probe]) for key in ("recovered", "followed")]
            print("| " + " | ".join([label(system, passes)] + tf + gap + rec) + " |")
        significance(work, arch, systems, passes)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work")
    p.add_argument("--archs", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--k", type=float, help="use this k instead of choosing it on dev")
    p.add_argument("--dss-passes", type=int, help="train the scheduled-sampling systems with P passes")
    p.add_argument("--epochs", type=int, default=EPOCHS, help="training epochs of every run (default %(default)s)")
    p.add_argument("--select-every", type=int, metavar="E",
                   help="save every E epochs and score the checkpoint with the best greedy dev sequence accuracy "
                        "(the thesis's best-on-dev selection) instead of the last one")
    p.add_argument("--lr-decay", action="store_true",
                   help="learning rate falls linearly from 0.005 to 0 over the run (default: constant)")
    p.add_argument("--table", action="store_true", help="only print the table of what is done")
    a = p.parse_args(argv)
    if a.epochs < 1 or (a.select_every is not None and not 1 <= a.select_every <= a.epochs):
        p.error(f"--epochs must be >= 1 and --select-every between 1 and --epochs (got {a.epochs}, {a.select_every})")
    if not a.table:
        bin_dir = prepare(a.work)
        budget = dict(epochs=a.epochs, select_every=a.select_every, lr_decay=a.lr_decay)
        for arch in a.archs:
            k = a.k if a.k is not None else choose_k(a.work, bin_dir, arch, **budget)
            for seed in a.seeds:
                for system in a.systems:
                    run(a.work, bin_dir, arch, system, seed, k, passes=a.dss_passes, **budget)
    table(a.work, a.archs, a.systems, a.dss_passes)


if __name__ == "__main__":
    main()
