"""Fine-tune your own translation checkpoint with one of the plugin's methods, selected on
validation BLEU:

    python -m fairseq_ext.finetune --mle checkpoint_best.pt --data data-bin --method mrt --save-dir ft_mrt

builds the ``fairseq-train`` command and runs it (``--dry-run`` prints it only). The
architecture and every model option that differs from the architecture's defaults, the
language pair, and the data's tokenization (``--bpe`` / ``--tokenizer`` and the task's
``--eval-bleu-detok``, where the checkpoint was trained with them) are read from the
checkpoint's saved configuration: nothing is assumed about the model or the corpus.

Methods: ``mrt``, ``pg``, ``mgs`` (sentence BLEU as the task loss, ``--task-loss`` another),
``dss``, ``soft_beam``, and ``mle``, the control: the same updates of label-smoothed
cross-entropy. Each uses the plugin's defaults (the recommended settings) plus, for
``dss``, mixing from the first update (``--dss-warmup 0``: the checkpoint is trained) and
``--dss-passes 2`` on a transformer; Adam at lr 1e-4 for ``mrt``, ``pg`` and ``soft_beam``, 3e-4 for
the others (examples/mgs/README.md, docs/soft_beam.md).

Selection: the start model is validated first (update 0), then fairseq-train validates every
``--validate-every`` updates (default: a fifth of the run) with detokenized BLEU (fairseq's
``--eval-bleu``, beam ``--valid-beam``, the data's subword removal and detokenizer) and keeps
the best in ``checkpoint_best.pt``. If no validation beats the start, ``checkpoint_best.pt`` is
the start model. The run ends with one line, ``start X, best Y at update N, last Z``, and
``SAVE_DIR/selection.json`` keeps the numbers.

Budget: an update holds about ``--tokens-per-update`` tokens (16,384 on GPUs, 2,048 with
``--cpu``): ``--update-freq`` = tokens-per-update / (max-tokens x GPUs), rounded, at least 1.
The GPUs are those fairseq-train will use (``CUDA_VISIBLE_DEVICES``, else every visible one);
``--gpus N`` says how many. ``--cpu`` also picks CPU-sized defaults (2,048 tokens a batch,
600 updates).

Everything after ``--`` goes to fairseq-train as it is (``-- --mrt-candidates 4``).

Your own fine-tuning command, selected the same way: ``python -m fairseq_ext.finetune fairseq-train
DATA ... --finetune-from-model START.pt --eval-bleu ... --best-checkpoint-metric bleu
--maximize-best-checkpoint-metric --validate-interval-updates N --save-interval-updates N`` validates
START first under the command's own validation, runs it, and selects as above.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time
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


def method_options(method: str, arch: str, task_loss: Optional[str], lr: Optional[float]) -> List[str]:
    """The criterion of a method (the plugin's defaults) and its learning rate."""
    transformer = "transformer" in arch
    task_loss = task_loss or "sbleu"
    criteria = {
        "mrt": ["--criterion", "mrt", "--mrt-task-loss", task_loss],
        "pg": ["--criterion", "pg", "--pg-task-loss", task_loss],
        "mgs": ["--criterion", "mgs", "--mgs-task-loss", task_loss],
        # the checkpoint is trained: mix in the model's decisions from the first update
        "dss": ["--criterion", "differentiable_scheduled_sampling", "--dss-warmup", "0", "--dss-warmup-updates", "0"]
        + (["--dss-passes", "2"] if transformer else []),
        "soft_beam": ["--criterion", "soft_beam_direct_loss"],
        "mle": ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"],
    }
    # mrt, pg: the validation-selected rate on Multi30k (examples/mgs/README.md, fine-tuning selected on
    # validation); at 3e-4 PG ended below continued MLE there and MRT and PG below it on another corpus
    default_lr = 1e-4 if method in ("soft_beam", "mrt", "pg") else 3e-4
    return criteria[method] + ["--lr", f"{lr if lr is not None else default_lr:g}"]


def target_language(cfg, data: str) -> str:
    task = cfg.get("task") or {}
    if task.get("target_lang"):
        return str(task["target_lang"])
    from fairseq.data import data_utils

    return data_utils.infer_language_pair(data)[1]


def validation_options(cfg, data: str, beam: int, every: int) -> List[str]:
    """fairseq-train's validation on detokenized BLEU every ``every`` updates, with the data's
    subword removal (the checkpoint's ``--bpe``, else what the target dictionary's symbols
    show) and detokenizer (``--tokenizer moses`` or the checkpoint's ``--eval-bleu-detok``,
    else none), and ``checkpoint_best.pt`` kept by it. No validation at epoch ends: the
    interval alone decides the cost."""
    from fairseq.data import Dictionary

    from fairseq_ext.core.subwords import detect_subword_scheme

    bpe = (cfg.get("bpe") or {}).get("_name")
    if bpe not in ("sentencepiece", "subword_nmt"):
        path = os.path.join(data, f"dict.{target_language(cfg, data)}.txt")
        target = Dictionary.load(path)
        bpe = detect_subword_scheme(target.symbols[target.nspecial:])[0]
    task = cfg.get("task") or {}
    tokenizer = (cfg.get("tokenizer") or {}).get("_name")
    out = ["--eval-bleu", "--eval-bleu-args", json.dumps({"beam": beam, "max_len_a": 1.2, "max_len_b": 10})]
    if bpe:
        out += ["--eval-bleu-remove-bpe", bpe]
    if not task.get("eval_bleu_detok") or task.get("eval_bleu_detok") == "space":
        out += (["--eval-bleu-detok", "moses", "--eval-bleu-detok-args",
                 json.dumps({"target_lang": target_language(cfg, data)})] if tokenizer == "moses"
                else ["--eval-bleu-detok", "space"])
    return out + ["--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
                  "--validate-interval-updates", str(every), "--save-interval-updates", str(every),
                  "--validate-interval", "1000000"]


def visible_gpus() -> int:
    """How many GPUs fairseq-train will use: ``CUDA_VISIBLE_DEVICES``'s, else every visible one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    import torch

    return torch.cuda.device_count()


def update_freq(tokens_per_update: int, max_tokens: int, gpus: int) -> int:
    """Batches an update on each of ``gpus`` workers so that an update holds about
    ``tokens_per_update`` tokens: rounded, at least 1."""
    return max(1, round(tokens_per_update / (max_tokens * max(gpus, 1))))


def build_command(a: argparse.Namespace, extra: Sequence[str]) -> List[str]:
    """The fairseq-train command of ``a`` (parsed options, sizes resolved) and the fairseq-train
    options ``extra``."""
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
               "--max-update", str(a.max_update), *validation_options(cfg, a.data, a.valid_beam, a.validate_every),
               "--keep-interval-updates", "1", "--no-epoch-checkpoints", "--log-format", "json", "--seed", str(a.seed)]
    workers = ["--cpu"] if a.cpu else ["--distributed-world-size", str(a.gpus)] if a.gpus > 1 else []
    return command + workers + list(extra)


def validate_start(command: Sequence[str]) -> float:
    """The validation BLEU of the start model (``--finetune-from-model``) under the validation
    of the fairseq-train ``command`` itself: its task, criterion, batches and BLEU options, as
    fairseq-train's own validation would give it at update 0."""
    import torch
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.logging import metrics

    args = options.parse_args_and_arch(options.get_training_parser(), list(command[1:]))
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    torch.manual_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    subset = cfg.dataset.valid_subset.split(",")[0]
    task.load_dataset(subset, combine=False, epoch=1)
    model = task.build_model(cfg.model)
    state = checkpoint_utils.load_checkpoint_to_cpu(cfg.checkpoint.finetune_from_model)
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    device = torch.device("cuda" if torch.cuda.is_available() and not cfg.common.cpu else "cpu")
    model.to(device).eval()
    criterion.to(device).eval()
    batches = task.get_batch_iterator(
        dataset=task.dataset(subset), max_tokens=cfg.dataset.max_tokens_valid,
        max_sentences=cfg.dataset.batch_size_valid,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
        num_workers=0).next_epoch_itr(shuffle=False)
    logs = []
    with torch.no_grad(), metrics.aggregate(new_root=True) as agg:
        for sample in batches:
            sample = utils.move_to_cuda(sample) if device.type == "cuda" else sample
            logs.append(task.valid_step(sample, model, criterion)[2])
        task.reduce_metrics(logs, criterion)
        values = agg.get_smoothed_values()
    return round(float(values["bleu"]), 2)


def _saved_validation(path: str):
    """(validation BLEU, updates) that fairseq saved in checkpoint ``path``; (None, None) if none."""
    import torch

    if not os.path.isfile(path):
        return None, None
    state = torch.load(path, map_location="cpu", weights_only=False)
    history = state.get("optimizer_history") or [{}]
    return (state.get("extra_state") or {}).get("val_loss"), int(history[-1].get("num_updates", 0))


def select(save_dir: str, start: float, start_checkpoint: str, seconds: dict) -> dict:
    """After the run: ``checkpoint_best.pt`` becomes the start model when no validation beat
    ``start``; the record goes to ``SAVE_DIR/selection.json`` and is returned."""
    import shutil

    best_path = os.path.join(save_dir, "checkpoint_best.pt")
    last, last_update = _saved_validation(os.path.join(save_dir, "checkpoint_last.pt"))
    best, best_update = _saved_validation(best_path)
    record = {"metric": "validation BLEU", "start": start, "best": best, "best_update": best_update,
              "last": last, "last_update": last_update, "start_checkpoint": os.path.abspath(start_checkpoint)}
    if best is None or not best > start:
        shutil.copyfile(start_checkpoint, best_path)
        record.update(best=start, best_update=0)
    record["selected"] = "start" if record["best_update"] == 0 else f"update {record['best_update']}"
    record.update(seconds)
    with open(os.path.join(save_dir, "selection.json"), "w") as f:
        json.dump(record, f, indent=1)
    return record


def summary_line(r: dict) -> str:
    last = "none" if r["last"] is None else f"{r['last']:.2f} at update {r['last_update']}"
    line = f"finetune: validation BLEU start {r['start']:.2f}, best {r['best']:.2f} at update {r['best_update']}, last {last}; "
    line += ("no update beat the start: checkpoint_best.pt is the start model" if r["selected"] == "start"
             else f"checkpoint_best.pt is update {r['best_update']}")
    if r.get("run_seconds"):
        spent = r["validation_seconds"] + r["start_validation_seconds"]
        line += f" (validation {spent / (r['run_seconds'] + r['start_validation_seconds']):.0%} of the time)"
    return line


COLLAPSED = "KeyError: 'bleu'"  # fairseq's validation logs no BLEU when every hypothesis is empty


def run(command: Sequence[str]) -> tuple:
    """Run fairseq-train, echoing its output; (return code, validations it logged, whether its
    validation failed on a collapsed model, seconds its validations took)."""
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=_fixes_env())
    validations, collapsed, seconds, began = 0, False, 0.0, None
    for line in proc.stdout:
        sys.stdout.write(line)
        if "begin validation on" in line and "dry-run" not in line:
            began = time.time()
        elif '"valid_bleu"' in line or "| valid |" in line and "bleu" in line:
            validations += 1
            seconds += time.time() - began if began is not None else 0.0
            began = None
        collapsed = collapsed or COLLAPSED in line
    return proc.wait(), validations, collapsed, seconds


SIZES = {False: dict(max_tokens=4096, tokens_per_update=16384, max_update=2000),  # one or more GPUs
         True: dict(max_tokens=2048, tokens_per_update=2048, max_update=600)}  # --cpu: the measured CPU protocol
TASK_LOSS_METHODS = ("mrt", "pg", "mgs")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairseq_ext.finetune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mle", required=True, help="the trained checkpoint to start from (fairseq translation)")
    p.add_argument("--data", required=True, help="its binarized data directory (fairseq-preprocess output)")
    p.add_argument("--method", required=True, choices=METHODS, help="what to fine-tune with (mle: the control)")
    p.add_argument("--save-dir", default=None, help="where checkpoints go (default: finetune_METHOD)")
    p.add_argument("--task-loss", default=None, help="mrt / pg / mgs: the task loss (default sbleu)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="fairseq's --max-tokens a batch, per GPU: the longer side of each pair times the batch's "
                        "sentences, padding included, so fewer target tokens (default 4096; 2048 with --cpu)")
    p.add_argument("--tokens-per-update", type=int, default=None,
                   help="about this many tokens (as --max-tokens counts them) an update, whatever the number of GPUs "
                        "(default 16384; 2048 with --cpu)")
    p.add_argument("--update-freq", type=int, default=None,
                   help="batches an update on each GPU (default: tokens-per-update / (max-tokens x GPUs), rounded, "
                        "at least 1)")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs fairseq-train uses (default: those CUDA_VISIBLE_DEVICES names, else every visible one)")
    p.add_argument("--max-update", type=int, default=None, help="updates (default 2000; 600 with --cpu)")
    p.add_argument("--lr", type=float, default=None,
                   help="Adam's learning rate (default 1e-4 for mrt, pg and soft_beam; 3e-4 for mgs, dss and mle)")
    p.add_argument("--validate-every", "--save-interval-updates", dest="validate_every", type=int, default=None,
                   help="validate (detokenized BLEU) and save every N updates (default: max-update / 5)")
    p.add_argument("--valid-beam", type=int, default=5, help="beam size of the validation BLEU (default 5)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cpu", action="store_true", help="train on the CPU (and take the CPU-sized defaults)")
    p.add_argument("--dry-run", action="store_true", help="print the fairseq-train command, run nothing")
    a = p.parse_args(argv)
    for name, value in SIZES[a.cpu].items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    a.gpus = 1 if a.cpu else (a.gpus if a.gpus is not None else max(visible_gpus(), 1))
    if a.validate_every is None:
        a.validate_every = max(1, a.max_update // 5)
    for name in ("max_tokens", "tokens_per_update", "update_freq", "gpus", "max_update", "validate_every",
                 "valid_beam"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.task_loss is not None and a.method not in TASK_LOSS_METHODS:
        p.error(f"--task-loss is an option of --method mrt, pg and mgs; --method {a.method} has no task loss")
    if a.update_freq is None:
        a.update_freq = update_freq(a.tokens_per_update, a.max_tokens, a.gpus)
    if not os.path.isfile(a.mle):
        p.error(f"--mle {a.mle}: no such checkpoint file")
    if not os.path.isdir(a.data):
        p.error(f"--data {a.data}: no such data directory")
    a.save_dir = a.save_dir or f"finetune_{a.method}"
    a.error = p.error
    return a


def _option_value(command: Sequence[str], flag: str, default: Optional[str] = None) -> Optional[str]:
    for i, word in enumerate(command):
        if word == flag and i + 1 < len(command):
            return command[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return default


def wrapped(command: List[str]) -> argparse.Namespace:
    """``python -m fairseq_ext.finetune fairseq-train ...``: a fine-tuning command of your own,
    selected the same way; it must start from ``--finetune-from-model`` and validate on BLEU."""
    def error(message: str):
        print(f"python -m fairseq_ext.finetune: error: {message}", file=sys.stderr)
        sys.exit(2)

    start = _option_value(command, "--finetune-from-model")
    if start is None:
        error("the fairseq-train command needs --finetune-from-model START.pt (the model the selection compares with)")
    if not os.path.isfile(start):
        error(f"--finetune-from-model {start}: no such checkpoint file")
    missing = [f for f in ("--eval-bleu", "--maximize-best-checkpoint-metric") if f not in command]
    if _option_value(command, "--best-checkpoint-metric") != "bleu":
        missing.insert(1, "--best-checkpoint-metric bleu")
    if missing:
        error("the fairseq-train command must validate on BLEU and keep its best: add " + " ".join(missing)
              + " (with the data's --eval-bleu-remove-bpe and --eval-bleu-detok)")
    return argparse.Namespace(mle=start, save_dir=_option_value(command, "--save-dir", "checkpoints"),
                              dry_run=False)


def _fixes_env() -> dict:
    """The environment of the fairseq-train run: the plugin's fixes of fairseq (runtime.fixes) apply
    to every method, the MLE control with fairseq's own criterion included, unless
    FAIRSEQ_EXT_FIXES says otherwise."""
    return {**os.environ, "FAIRSEQ_EXT_FIXES": os.environ.get("FAIRSEQ_EXT_FIXES") or "all"}


def main(argv: Optional[Sequence[str]] = None) -> None:
    from fairseq_ext.runtime import cli

    cli.install()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fairseq-train"]:
        a, command = wrapped(argv), argv
    else:
        extra = argv[argv.index("--") + 1:] if "--" in argv else []
        a = parse(argv[:argv.index("--")] if "--" in argv else argv)
        try:
            command = build_command(a, extra)
        except ValueError as err:
            a.error(str(err))
        workers = "the CPU" if a.cpu else f"{a.gpus} GPU{'s' if a.gpus > 1 else ''}"
        print(f"finetune: {workers}, --max-tokens {a.max_tokens} x --update-freq {a.update_freq}: about "
              f"{a.max_tokens * a.update_freq * a.gpus} tokens an update", flush=True)
        print(" ".join(shlex.quote(w) for w in command), flush=True)
    if a.dry_run:
        return
    if "--disable-validation" in command:
        print("finetune: --disable-validation: no validation, no selection (checkpoint_last.pt is the result)",
              flush=True)
        raise SystemExit(subprocess.call(command, env=_fixes_env()))
    record_path = os.path.join(a.save_dir, "selection.json")
    previous = json.load(open(record_path)) if os.path.isfile(record_path) else {}
    if previous.get("start_checkpoint") == os.path.abspath(a.mle) and "start" in previous:
        start, start_seconds = previous["start"], previous.get("start_validation_seconds", 0.0)
    else:
        began = time.time()
        start = validate_start(command)
        start_seconds = time.time() - began
        os.makedirs(a.save_dir, exist_ok=True)
        with open(record_path, "w") as f:
            json.dump({"start": start, "start_checkpoint": os.path.abspath(a.mle),
                       "start_validation_seconds": start_seconds}, f)
    print(f"finetune: validation BLEU of the start model {start:.2f} ({start_seconds:.0f} s)", flush=True)
    began = time.time()
    code, validations, collapsed, valid_seconds = run(command)
    if code != 0 and not collapsed:
        raise SystemExit(code)
    if collapsed:
        print("finetune: the run stopped at a validation where every output was empty (the model collapsed, and "
              "fairseq logs no BLEU then): lower --lr; selecting among the validations before it", flush=True)
    record = select(a.save_dir, start, a.mle, {"start_validation_seconds": start_seconds,
                                               "run_seconds": time.time() - began, "validations": validations,
                                               "validation_seconds": valid_seconds})
    print(summary_line(record), flush=True)
    if collapsed:
        raise SystemExit(1)

if __name__ == "__main__":
    main()
