"""Loading the plugin changes nothing a user of fairseq's own components did not ask for
(docs/fairseq.md is the contract):

* the fairseq attributes replaced on import, and those replaced where a command chooses a
  plugin component, are exactly the documented ones (walked by
  scripts/inspect/fairseq_changes.py), at most 8 on import, ``sys.excepthook`` untouched;
* a fairseq ``transformer`` trained with ``label_smoothed_cross_entropy`` for two epochs,
  stopped in the middle of the first and resumed, logs the same loss at every update, ends
  with bitwise the same parameters and generates the same output with ``--user-dir`` as
  without it (the control that would catch a plugin fix leaking into fairseq's runs: the
  plugin's exact resume changes a resumed run's batches);
* ``multilingual_translation`` (a dictionary per language) trains, resumes and generates
  with the plugin loaded;
* a ``--restore-file`` that does not exist trains from scratch, as fairseq does, with one
  warning naming it; ``--finetune-from-model`` keeps fairseq's own errors.
"""
import json
import os
import re

import pytest
import torch

from conftest import REPO, run_cli, run_cli_batch
from fairseq_ext.synthetic import toy

TINY = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]
TRAIN = ["--optimizer", "adam", "--lr", "0.005", "--max-tokens", "400", "--num-workers", "0", "--seed", "3",
         "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1", "--disable-validation"]
# both sides load checkpoints the same way: fairseq alone needs this under torch >= 2.6; a command with it
# runs as a fresh interpreter (tests/forkserver.py), so "without" has no plugin anywhere in the process
REAL = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "FAIRSEQ_EXT_FORKSERVER": ""}


@pytest.fixture(scope="module")
def small_bin(tmp_path_factory):
    """300 toy pairs (about 15 updates an epoch at --max-tokens 400), joined dictionary src/tgt."""
    tmp = tmp_path_factory.mktemp("guest")
    return toy.binarize_translation(toy.write_toy_data(str(tmp / "raw"), sizes=(300, 40, 40), seed=2),
                                    str(tmp / "bin"))


def _documented(section: str) -> list:
    """The attribute names (in backticks, first column) of the table under ``## section`` in docs/fairseq.md."""
    text = open(os.path.join(REPO, "docs", "fairseq.md")).read()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return sorted(m.group(1) for m in re.finditer(r"^\| `((?:fairseq|sys)[\w.]*)`", body, re.M))


def test_the_replaced_fairseq_attributes_are_the_documented_ones():
    proc = run_cli(["python", "scripts/inspect/fairseq_changes.py", "--activate", "--json"],
                   env={"FAIRSEQ_EXT_FORKSERVER": ""})
    found = json.loads(proc.stdout)
    assert found["on_import"] == _documented("Replaced on import"), found
    assert found["on_activate"] == _documented("Replaced where a plugin component runs"), found
    assert len(found["on_import"]) <= 8
    assert "sys.excepthook" not in found["on_import"] and "sys.excepthook" in found["on_activate"]


def _train_interrupted(data, save, plugin: bool, env=None):
    """Two epochs in two commands (stopped after 27 updates, in the middle of the second epoch of 22;
    then resumed), batches of at most 150 tokens."""
    user_dir = ["--user-dir", "fairseq_ext"] if plugin else []
    base = ["fairseq-train", data, *user_dir, "--task", "translation", *TINY, "--criterion",
            "label_smoothed_cross_entropy", "--label-smoothing", "0.1", *TRAIN, "--max-tokens", "150",
            "--save-dir", save]
    logs = []
    for stop in (["--max-update", "27"], ["--max-epoch", "2"]):
        proc = run_cli(base + stop, env={**REAL, **(env or {})})
        logs += [json.loads(line.split("| train_inner | ", 1)[1]) for line in (proc.stdout + proc.stderr).splitlines()
                 if "| train_inner | " in line]
    generated = run_cli(["fairseq-generate", data, *user_dir, "--path", os.path.join(save, "checkpoint_last.pt"),
                         "--gen-subset", "valid", "--beam", "3", "--batch-size", "16"], env={**REAL, **(env or {})}).stdout
    return logs, generated


def test_a_plain_fairseq_run_is_the_same_with_the_plugin_loaded(small_bin, tmp_path):
    without = _train_interrupted(small_bin, str(tmp_path / "without"), plugin=False)
    with_ = _train_interrupted(small_bin, str(tmp_path / "with"), plugin=True)
    (log_a, gen_a), (log_b, gen_b) = without, with_
    updates = [(int(r["num_updates"]), int(r["epoch"])) for r in log_a]
    assert [u for u, _ in updates] == list(range(1, len(updates) + 1)) and len(updates) > 20
    assert updates[26:28] == [(27, 2), (28, 2)], updates  # stopped and resumed within epoch 2
    losses = [(r["num_updates"], r["loss"]) for r in log_a]
    assert losses == [(r["num_updates"], r["loss"]) for r in log_b]
    state_a, state_b = (torch.load(str(tmp_path / d / "checkpoint_last.pt"), map_location="cpu",
                                   weights_only=False)["model"] for d in ("without", "with"))
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    hyps = [line for line in gen_a.splitlines() if line.startswith("H-")]
    assert len(hyps) == 40 and hyps == [line for line in gen_b.splitlines() if line.startswith("H-")]
    # the control: the plugin's exact resume, asked for on fairseq's own components, cuts other batches
    # after the resume, and the comparison above sees it
    fixed, _ = _train_interrupted(small_bin, str(tmp_path / "fixed"), plugin=True, env={"FAIRSEQ_EXT_FIXES": "all"})
    fixed_losses = [(r["num_updates"], r["loss"]) for r in fixed]
    assert fixed_losses[:27] == losses[:27] and fixed_losses[27:] != losses[27:]


def test_multilingual_translation_trains_resumes_and_generates_with_the_plugin(small_bin, tmp_path):
    """A dictionary per language: the checkpoint's fingerprints are per language, and generation,
    which sees one direction's dictionaries, is not refused (fairseq's test_multilingual_transformer)."""
    save = str(tmp_path / "multi")
    lang = ["--task", "multilingual_translation", "--lang-pairs", "src-tgt,tgt-src"]
    arch = ["--arch", "multilingual_transformer", "--encoder-layers", "1", "--decoder-layers", "1",
            "--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-ffn-embed-dim", "16",
            "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
    base = ["fairseq-train", small_bin, "--user-dir", "fairseq_ext", *lang, *arch, "--criterion", "cross_entropy",
            *TRAIN, "--save-dir", save]
    run_cli(base + ["--max-update", "4"])
    resumed = run_cli(base + ["--max-update", "8"])
    assert "Loaded checkpoint" in resumed.stdout + resumed.stderr
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 8
    assert set(state["extra_state"]["fairseq_ext"]["dictionaries"]) == {"dict.src", "dict.tgt"}
    out = run_cli(["fairseq-generate", small_bin, "--user-dir", "fairseq_ext", *lang, "--source-lang", "src",
                   "--target-lang", "tgt", "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset",
                   "valid", "--beam", "2", "--batch-size", "16", "--max-len-b", "10"]).stdout
    assert sum(line.startswith("H-") for line in out.splitlines()) == 40


def test_restore_and_finetune_keep_fairseqs_meaning(small_bin, tmp_path):
    """--restore-file NOSUCH.pt: fairseq trains from scratch (a job that names the checkpoint it will
    write), and the plugin adds one warning naming it. --finetune-from-model with --reset-optimizer,
    and one that does not exist: fairseq's own errors."""
    base = ["fairseq-train", small_bin, "--user-dir", "fairseq_ext", "--task", "translation", *TINY, *TRAIN]
    start = str(tmp_path / "start.pt")
    run_cli(base + ["--max-update", "1", "--save-dir", str(tmp_path / "s")])
    os.rename(tmp_path / "s" / "checkpoint_last.pt", start)
    results = run_cli_batch([
        base + ["--max-update", "2", "--restore-file", str(tmp_path / "nosuch.pt"), "--save-dir", str(tmp_path / "a")],
        base + ["--max-update", "2", "--finetune-from-model", start, "--reset-optimizer", "--save-dir",
                str(tmp_path / "b")],
        base + ["--max-update", "2", "--finetune-from-model", str(tmp_path / "nosuch.pt"), "--save-dir",
                str(tmp_path / "c")],
    ], tmp_path)
    restore, conflict, missing = results
    assert restore["rc"] == 0, restore["stderr"][-2000:]
    warnings = [line for line in (restore["stdout"] + restore["stderr"]).splitlines()
                if "WARNING" in line and "nosuch.pt" in line]
    assert len(warnings) == 1 and "training starts from scratch" in warnings[0]
    assert os.path.isfile(tmp_path / "a" / "checkpoint_last.pt")
    assert conflict["rc"] == 1 and conflict["stderr"].strip().splitlines()[-1] == (
        "ValueError: --finetune-from-model can not be set together with either --reset-optimizer or "
        "reset_lr_scheduler or reset_meters or reset_dataloader")
    assert missing["rc"] == 1 and re.match(r"ValueError: --f[iu]netune-from-model \S*nosuch\.pt does not exist$",
                                           missing["stderr"].strip().splitlines()[-1])  # fairseq 0.12.2 spells it funetune
