"""Fine-tune your own translation checkpoint with one of the plugin's methods:

    python -m fairseq_ext.finetune --mle checkpoint_best.pt --data data-bin --method mrt --save-dir ft_mrt

builds the ``fairseq-train`` command and runs it (``--dry-run`` prints it only). The
architecture and every model option that differs from the architecture's defaults, the
language pair, and the data's tokenization (``--bpe`` / ``--tokenizer`` and the task's
``--eval-bleu-detok``, where the checkpoint was trained with them) are read from the
checkpoint's saved configuration: nothing is assumed about the model or the corpus.

Methods: ``mrt``, ``pg``, ``mgs`` (sentence BLEU as the task loss, ``--task-loss`` another),
``dss``, ``soft_beam``, and ``mle``, the control: the same updates of label-smoothed
cross-entropy. Each uses the plugin's defaults (the recommended settings) plus, for
``dss`` on a transformer, ``--dss-passes 2`` and for ``soft_beam`` lr 1e-4 (docs/dss.md,
docs/soft_beam.md). The knobs that matter, sized for one GPU:

* ``--max-tokens`` (4096) and ``--update-freq`` (4): 16k target tokens an update;
* ``--max-update`` (2000) and ``--lr`` (3e-4; Adam, ``--clip-norm 1.0``, the measured
  protocol), a checkpoint every ``--save-interval-updates`` (200);
* on N GPUs fairseq-train uses them all: divide ``--update-freq`` by N to keep the tokens
  an update (``CUDA_VISIBLE_DEVICES=0,1,2,3 python -m fairseq_ext.finetune ... --update-freq 1``);
* ``--cpu`` for a machine without one (then lower ``--max-tokens``).

Everything after ``--`` goes to fairseq-train as it is (``-- --mrt-candidates 4 --eval-bleu``).
"""
import argparse
import os
import shlex
import subprocess
import sys
from typing import List, Optional, Sequence

METHODS = ("mrt", "pg", "mgs", "dss", "soft_beam", "mle")
_MISSING = object()


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _value(value) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(str(v) for v in value) + ")" if isinstance(value, tuple) else ",".join(map(str, value))
    return str(value)


def model_options(saved, arch: str, data: str) -> List[str]:
    """``--arch ARCH`` and the model options of ``saved`` (a checkpoint's ``cfg.model``) that
    differ from what the command line gives without them, as fairseq-train flags. Options
    whose defaults follow others (``--decoder-output-dim`` follows ``--decoder-embed-dim``)
    are compared after those are given, so only what differs is passed."""
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    if arch not in ARCH_MODEL_REGISTRY:
        raise ValueError(f"--arch {arch}: the checkpoint's architecture is not registered (does it need a --user-dir "
                         "of its own?)")
    own = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[arch].add_args(own)
    actions = [a for a in own._actions if a.option_strings and a.dest not in ("help", "arch")]
    given: dict = {}
    for _ in range(3):  # until no option differs: the derived defaults follow the given ones
        flags = [w for dest, words in given.items() for w in words]
        parsed = options.parse_args_and_arch(options.get_training_parser(), [data, "--arch", arch, *flags])
        added = False
        for action in actions:
            value, current = getattr(saved, action.dest, _MISSING), getattr(parsed, action.dest, _MISSING)
            if action.dest in given or value is _MISSING or value is None or str(value) == str(current):
                continue
            flag = next((f for f in action.option_strings if f.startswith("--")), action.option_strings[0])
            if isinstance(action, argparse._StoreTrueAction):
                if value:
                    given[action.dest], added = [flag], True
                continue
            given[action.dest], added = [flag, _value(value)], True
        if not added:
            break
    for dest in list(given):  # drop what the others imply (a default that follows another option)
        rest = [w for d, words in given.items() if d != dest for w in words]
        parsed = options.parse_args_and_arch(options.get_training_parser(), [data, "--arch", arch, *rest])
        if str(getattr(parsed, dest, _MISSING)) == str(getattr(saved, dest)):
            del given[dest]
    return ["--arch", arch, *[w for words in given.values() for w in words]]


def data_options(cfg) -> List[str]:
    """The language pair and tokenization the checkpoint was trained with, as flags."""
    out = []
    task = cfg.get("task") or {}
    for key in ("source_lang", "target_lang"):
        if task.get(key):
            out += [_flag(key), str(task[key])]
    for group in ("bpe", "tokenizer"):
        section = cfg.get(group)
        if section is not None and section.get("_name"):
            out += [f"--{group}", str(section["_name"])]
            for key, value in section.items():
                if key != "_name" and value not in (None, False) and not str(value).startswith("${"):
                    out += [_flag(key)] if value is True else [_flag(key), str(value)]
    detok = task.get("eval_bleu_detok")
    if detok and detok != "space":
        out += ["--eval-bleu-detok", str(detok), "--eval-bleu-detok-args", str(task.get("eval_bleu_detok_args") or "{}")]
    return out


def method_options(method: str, arch: str, task_loss: str, lr: Optional[float]) -> List[str]:
    """The criterion of a method (the plugin's defaults) and its learning rate."""
    transformer = "transformer" in arch
    criteria = {
        "mrt": ["--criterion", "mrt", "--mrt-task-loss", task_loss],
        "pg": ["--criterion", "pg", "--pg-task-loss", task_loss],
        "mgs": ["--criterion", "mgs", "--mgs-task-loss", task_loss],
        "dss": ["--criterion", "differentiable_scheduled_sampling"] + (["--dss-passes", "2"] if transformer else []),
        "soft_beam": ["--criterion", "soft_beam_direct_loss"],
        "mle": ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"],
    }
    default_lr = 1e-4 if method == "soft_beam" else 3e-4
    return criteria[method] + ["--lr", f"{lr if lr is not None else default_lr:g}"]


def build_command(a: argparse.Namespace, extra: Sequence[str]) -> List[str]:
    """The fairseq-train command of ``a`` (parsed options) and the fairseq-train options ``extra``."""
    import fairseq_ext  # (checkpoint loading under torch >= 2.6; one-line errors)
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(a.mle)
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None:
        raise ValueError(f"--mle {a.mle}: no saved configuration (a checkpoint of fairseq < 0.10?)")
    saved = cfg["model"]
    arch = getattr(saved, "arch", None) or (saved.get("_name") if hasattr(saved, "get") else None)
    task = (cfg.get("task") or {}).get("_name") or "translation"
    if task != "translation":
        raise ValueError(f"--mle {a.mle}: trained with --task {task}; fairseq_ext.finetune fine-tunes translation "
                         "checkpoints (--task translation)")
    command = ["fairseq-train", a.data, "--user-dir", os.path.dirname(fairseq_ext.__file__), "--task", "translation",
               *model_options(saved, arch, a.data), *data_options(cfg),
               "--finetune-from-model", a.mle, "--save-dir", a.save_dir,
               *method_options(a.method, arch, a.task_loss, a.lr),
               "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
               "--max-tokens", str(a.max_tokens), "--update-freq", str(a.update_freq),
               "--max-update", str(a.max_update), "--save-interval-updates", str(a.save_interval_updates),
               "--keep-interval-updates", "1", "--no-epoch-checkpoints", "--log-format", "json", "--seed", str(a.seed)]
    return command + (["--cpu"] if a.cpu else []) + list(extra)


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m fairseq_ext.finetune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mle", required=True, help="the trained checkpoint to start from (fairseq translation)")
    p.add_argument("--data", required=True, help="its binarized data directory (fairseq-preprocess output)")
    p.add_argument("--method", required=True, choices=METHODS, help="what to fine-tune with (mle: the control)")
    p.add_argument("--save-dir", default=None, help="where checkpoints go (default: finetune_METHOD)")
    p.add_argument("--task-loss", default="sbleu", help="mrt / pg / mgs: the task loss (default sbleu)")
    p.add_argument("--max-tokens", type=int, default=4096, help="target tokens a batch, per GPU (default 4096)")
    p.add_argument("--update-freq", type=int, default=4, help="batches an update (default 4: 16k tokens)")
    p.add_argument("--max-update", type=int, default=2000, help="updates (default 2000)")
    p.add_argument("--lr", type=float, default=None, help="Adam's learning rate (default 3e-4; soft_beam 1e-4)")
    p.add_argument("--save-interval-updates", type=int, default=200, help="a checkpoint every N updates (200)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cpu", action="store_true", help="train on the CPU")
    p.add_argument("--dry-run", action="store_true", help="print the fairseq-train command, run nothing")
    a = p.parse_args(argv)
    for name in ("max_tokens", "update_freq", "max_update", "save_interval_updates"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not os.path.isfile(a.mle):
        p.error(f"--mle {a.mle}: no such checkpoint file")
    if not os.path.isdir(a.data):
        p.error(f"--data {a.data}: no such data directory")
    a.save_dir = a.save_dir or f"finetune_{a.method}"
    try:
        command = build_command(a, extra)
    except ValueError as err:
        p.error(str(err))
    print(" ".join(shlex.quote(w) for w in command), flush=True)
    if not a.dry_run:
        raise SystemExit(subprocess.call(command))


if __name__ == "__main__":
    main()
