"""--criterion mgs through fairseq-train / fairseq-validate on the toy task: it runs
with fairseq's optimizer and checkpointing, logs its diagnostics, is reproducible
from the seed, and rejects bad options. (Whether the updates lower the task loss,
and in which direction they move theta, is tested in-process in test_estimators.py.)
Fine-tuning commands (the tests', the docs' and the recipes') start with
--finetune-from-model, so a rerun after an interruption resumes instead of
starting again from the MLE model."""
import glob
import os
import re

import pytest

from conftest import REPO, run_cli

ARCH = [
    "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings", "--seed", "1",
    "--no-epoch-checkpoints", "--log-format", "simple", "--num-workers", "0",
]
MGS = ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-alpha", "100", "--mgs-candidates", "4"]


@pytest.fixture(scope="module")
def mle_ckpt(toy_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("mgs_mle"))
    run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--optimizer", "adam", "--lr", "0.005",
             "--max-tokens", "2000", "--max-update", "40", "--save-dir", save] + ARCH)
    return os.path.join(save, "checkpoint_last.pt")


def _finetune(toy_bin, mle_ckpt, save, updates, extra=()):
    return run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--optimizer", "adam", "--lr", "0.003",
                    "--max-tokens", "1000", "--max-update", str(updates), "--save-dir", save,
                    "--finetune-from-model", mle_ckpt, "--log-interval", "1"] + ARCH + MGS + list(extra))


def test_rerun_of_a_stopped_finetune_resumes(toy_bin, mle_ckpt, tmp_path):
    """The same command run again on a save directory that holds the checkpoint of update 2 (what a
    Ctrl-C after it leaves) continues from update 2: --finetune-from-model loads the MLE model only
    on the first launch."""
    save = str(tmp_path / "ft")
    _finetune(toy_bin, mle_ckpt, save, 2)
    out = _finetune(toy_bin, mle_ckpt, save, 4)
    log = out.stdout + out.stderr
    assert f"Loaded checkpoint {save}/checkpoint_last.pt (epoch 1 @ 2 updates)" in log
    assert re.findall(r"\| train_inner \|.* num_updates=(\d+)", log) == ["3", "4"]


def _commands(path):
    """The command lines of a shell script (comments left out) or a markdown page (its code: indented
    blocks and fenced blocks, not the prose that talks about options)."""
    lines, fenced = [], False
    for line in open(path, encoding="utf-8"):
        if path.endswith(".sh"):
            if not line.lstrip().startswith("#"):
                lines.append(line)
        elif line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            lines.append(line)
    return "".join(lines)


def test_docs_and_recipes_finetune_with_finetune_from_model():
    """No fine-tuning command in README.md, docs/ or examples/ starts from a model with --restore-file
    MODEL (+ --reset-*): rerun after an interruption, such a command starts again from MODEL and
    overwrites the interrupted run. (--restore-file checkpoint_last.pt, fairseq's default, resumes.)"""
    files = [os.path.join(REPO, "README.md")] + [
        f for pattern in ("docs/*.md", "examples/**/*.sh", "examples/**/*.md")
        for f in glob.glob(os.path.join(REPO, pattern), recursive=True)]
    restart = re.compile(r"--restore-file[\s=]+(?![\"']?checkpoint_last\.pt)\S+")
    found = [f"{os.path.relpath(f, REPO)}: {m.group(0)}" for f in files for m in restart.finditer(_commands(f))]
    assert not found, "use --finetune-from-model instead:\n" + "\n".join(found)


def test_mgs_reproducible_from_seed(toy_bin, mle_ckpt, tmp_path):
    logs = []
    for run in ("a", "b"):
        out = _finetune(toy_bin, mle_ckpt, str(tmp_path / run), 3)
        logs.append([re.sub(r"cost_seconds=[0-9.]+, ", "", l.split("| train_inner |")[1].split("wps=")[0])
                     for l in (out.stdout + out.stderr).splitlines() if "| train_inner |" in l])
    assert len(logs[0]) == 3 and logs[0] == logs[1]
    assert all(f"mgs_{key}=" in logs[0][0] for key in ("weight_entropy", "mle_weight", "direction_norm"))


@pytest.mark.parametrize("flag,value,message", [
    ("--mgs-candidates", "0", "--mgs-candidates"),
    ("--mgs-alpha", "0", "--mgs-alpha"),
    ("--mgs-mixture", "1.5", "--mgs-mixture"),
    ("--mgs-task-loss", "bleurt", "'bleurt' is not a task loss"),
    ("--mgs-task-loss", "sbleu --mgs-post-process spm", "--mgs-post-process: unknown value 'spm'"),
])
def test_mgs_bad_options(toy_bin, mle_ckpt, tmp_path, flag, value, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        _finetune(toy_bin, mle_ckpt, str(tmp_path / "bad"), 1, [flag, *value.split()])


def test_mgs_lm_cost_with_score_model(toy_bin, mle_ckpt, tmp_path):
    """--mgs-task-loss lm scored by a given checkpoint (conditional on the source)."""
    out = _finetune(toy_bin, mle_ckpt, str(tmp_path / "lm"), 2,
                    ["--mgs-task-loss", "lm", "--mgs-score-model", mle_ckpt])
    costs = [float(m.group(1)) for m in re.finditer(r"\| train_inner \|.* loss=([0-9.]+)", out.stdout + out.stderr)]
    assert len(costs) == 2 and all(c > 0 for c in costs)  # negative log-probabilities of whole sequences
    with pytest.raises(AssertionError, match="missing.pt"):
        _finetune(toy_bin, mle_ckpt, str(tmp_path / "lm2"), 1,
                  ["--mgs-task-loss", "lm", "--mgs-score-model", str(tmp_path / "missing.pt")])


def test_validate_criterion_scores_mle_checkpoint(toy_bin, mle_ckpt):
    """scripts/inspect/validate_criterion.py scores a cross-entropy checkpoint with the MGS criterion's greedy
    task loss (plain fairseq-validate builds the saved criterion and cannot), with the same MLE loss."""
    common = [toy_bin, "--user-dir", "fairseq_ext", "--task", "translation", "--path", mle_ckpt,
              "--valid-subset", "valid", "--max-tokens", "2000"]
    loss = r"valid on 'valid' subset \| loss ([0-9.]+)"
    plain = run_cli(["fairseq-validate"] + common)
    scored = run_cli(["python", "scripts/inspect/validate_criterion.py", "{'_name': 'mgs', 'mgs_task_loss': 'edit'}"] + common)
    assert "task_loss" not in plain.stdout + plain.stderr
    edit = re.search(r"\| task_loss ([0-9.]+) .*\| cost_edit ([0-9.]+)", scored.stdout + scored.stderr)
    assert edit and 0.0 <= float(edit.group(1)) == float(edit.group(2)) <= 1.0
    assert (re.search(loss, plain.stdout + plain.stderr).group(1)
            == re.search(loss, scored.stdout + scored.stderr).group(1))
