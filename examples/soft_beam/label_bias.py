#!/usr/bin/env python
"""Label bias, where global normalisation must win: the synthetic task of
``fairseq_ext/synthetic/label_bias.py`` (the label of an F word is the colour of the next
word), encoder {left-to-right (``--encoder-unidirectional``), bidirectional} x training x
decoding {greedy, beam}; accuracy on the future-dependent positions and overall,
mean +- std over seeds (examples/soft_beam/README.md, "Label bias").

Runs per encoder and seed (``tagging_lstm_tiny``, dropout 0, Adam, batches of 32
sentences, the last checkpoint of every run: no checkpoint selection):

  ce          cross-entropy, PRE_EPOCHS epochs at lr 0.01 (the CE init)
  sn          self_normalized_ce (lambda 0.1), same budget (the self-normalised init)
  ce_ft       ce + FT_EPOCHS more epochs of cross-entropy at lr 0.005: the control,
              with the fine-tunings' update budget
  local       ce + soft_beam_direct_loss, --soft-beam-normalization local
  global_ce   ce + soft_beam_direct_loss, --soft-beam-normalization global
  global_sn   sn + soft_beam_direct_loss, --soft-beam-normalization global
  hinge_local, hinge_global   ce + soft_beam_hinge, local / global scores

Fine-tunings: FT_EPOCHS epochs at lr 0.005, fresh optimizer, k = 3, alpha 1 ->
10 geometrically over 200 updates, then held (5 epochs = 315 updates). Decoding
(fairseq-generate, test split): ``greedy`` (--beam 1) and ``beam`` (our hard
beam, k = 3, under the normalisation the checkpoint was trained with: raw logits
for global_*, log-probabilities otherwise); ``beam_raw`` for ce, ce_ft and sn: the
same beam over their raw logits (--search-normalization global), a diagnostic.

Resumable: a finished training leaves ``trained`` in its directory, a finished
decode its ``.json``; an interrupted training is restarted from scratch.

usage: python examples/soft_beam/label_bias.py WORK_DIR [--seeds 1 2 3] [--encoders uni bi]
       [--only NAME ...] [--pre-epochs 5] [--ft-epochs 5] [--train 2000] [--test 500]
       [--decodes greedy beam beam_raw] [--table-only]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from fairseq_ext.synthetic.label_bias import score_generate_output, write_label_bias_data

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SB = ["--soft-beam-size", "3", "--soft-beam-alpha", "1", "--soft-beam-alpha-schedule", "exponential",
      "--soft-beam-alpha-final", "10", "--soft-beam-alpha-updates", "200"]
# name -> (init, criterion options); init None = pre-training
RUNS = {
    "ce": (None, ["--criterion", "cross_entropy"]),
    "sn": (None, ["--criterion", "self_normalized_ce", "--self-norm-lambda", "0.1"]),
    "ce_ft": ("ce", ["--criterion", "cross_entropy"]),
    "local": ("ce", ["--criterion", "soft_beam_direct_loss", *SB, "--soft-beam-normalization", "local"]),
    "global_ce": ("ce", ["--criterion", "soft_beam_direct_loss", *SB, "--soft-beam-normalization", "global"]),
    "global_sn": ("sn", ["--criterion", "soft_beam_direct_loss", *SB, "--soft-beam-normalization", "global"]),
    "hinge_local": ("ce", ["--criterion", "soft_beam_hinge", *SB, "--soft-beam-normalization", "local"]),
    "hinge_global": ("ce", ["--criterion", "soft_beam_hinge", *SB, "--soft-beam-normalization", "global"]),
}
DECODES = {
    "greedy": ["--beam", "1"],
    "beam": ["--beam", "3", "--search-algorithm", "hard"],
    "beam_raw": ["--beam", "3", "--search-algorithm", "hard", "--search-normalization", "global"],
}
RAW_DECODED = ("ce", "sn", "ce_ft")
ENCODERS = {"uni": ["--encoder-unidirectional"], "bi": []}


def tool(name):
    return shutil.which(name) or os.path.join(os.path.dirname(sys.executable), name)


def run(cmd, log):
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}), see {log}: {' '.join(cmd)}")


def task_args(work):
    return [os.path.join(work, "data"), "--user-dir", "fairseq_ext", "--task", "sequence_tagging",
            "--tagging-cache-dir", os.path.join(work, "cache")]


def train(work, enc, name, seed, a):
    d = os.path.join(work, enc, f"{name}.s{seed}")
    if os.path.exists(os.path.join(d, "trained")):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    init, opts = RUNS[name]
    cmd = [tool("fairseq-train"), *task_args(work), "--arch", "tagging_lstm_tiny", *ENCODERS[enc], *opts,
           "--optimizer", "adam", "--batch-size", "32", "--save-dir", d, "--seed", str(seed),
           "--no-epoch-checkpoints", "--no-save-optimizer-state", "--num-workers", "0", "--disable-validation",
           "--log-format", "simple"]
    if init is None:
        cmd += ["--lr", "0.01", "--max-epoch", str(a.pre_epochs)]
    else:
        init_dir = train(work, enc, init, seed, a)
        cmd += ["--lr", "0.005", "--max-epoch", str(a.ft_epochs),
                "--finetune-from-model", os.path.join(init_dir, "checkpoint_last.pt")]
    print(f"train {enc} {name} seed {seed}", flush=True)
    run(cmd, os.path.join(d, "train.log"))
    open(os.path.join(d, "trained"), "w").close()
    return d


def decode(work, d, mode):
    out = os.path.join(d, f"test.{mode}")
    if os.path.exists(out + ".json"):
        return
    run([tool("fairseq-generate"), *task_args(work), "--path", os.path.join(d, "checkpoint_last.pt"),
         "--gen-subset", "test", "--batch-size", "256", *DECODES[mode]], out + ".gen")
    with open(out + ".json", "w") as f:
        json.dump(score_generate_output(out + ".gen"), f)


def cell(values):
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} +- {statistics.stdev(values):.1f}"


def table(work, encoders, names, seeds):
    """Markdown table: per encoder, run and decoding, future-position and overall accuracy."""
    lines = ["| encoder | training | decoding | future-dependent acc. | overall acc. | seeds |",
             "|---|---|---|---|---|---|"]
    for enc in encoders:
        for name in names:
            for mode in DECODES:
                scores = []
                for seed in seeds:
                    path = os.path.join(work, enc, f"{name}.s{seed}", f"test.{mode}.json")
                    if os.path.exists(path):
                        with open(path) as f:
                            scores.append(json.load(f))
                if scores:
                    lines.append(f"| {enc} | {name} | {mode} | {cell([s['future_acc'] for s in scores])} | "
                                 f"{cell([s['accuracy'] for s in scores])} | {len(scores)} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--encoders", nargs="+", choices=list(ENCODERS), default=list(ENCODERS))
    p.add_argument("--only", nargs="+", choices=list(RUNS), default=list(RUNS))
    p.add_argument("--pre-epochs", type=int, default=5)
    p.add_argument("--ft-epochs", type=int, default=5)
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--decodes", nargs="+", choices=list(DECODES), default=list(DECODES))
    p.add_argument("--table-only", action="store_true")
    a = p.parse_args(argv)
    work = os.path.abspath(a.work)
    if not a.table_only:
        if not os.path.isdir(os.path.join(work, "data")):
            write_label_bias_data(os.path.join(work, "data"), (a.train, 200, a.test), seed=1)
        for seed in a.seeds:
            for enc in a.encoders:
                for name in a.only:
                    d = train(work, enc, name, seed, a)
                    for mode in a.decodes:
                        if mode != "beam_raw" or name in RAW_DECODED:
                            decode(work, d, mode)
    print(table(work, a.encoders, a.only, a.seeds))


if __name__ == "__main__":
    main()
