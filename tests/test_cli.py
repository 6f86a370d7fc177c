"""End to end through the console scripts: fairseq-train trains and saves,
fairseq-generate --user-dir fairseq_ext reloads (torch >= 2.6, nothing exported),
fairseq-train resumes, scripts/score/score.py scores."""
import argparse
import io
import json
import os
import re

import pytest
import torch

from conftest import run_cli

TORCH_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"

TRAIN_TINY = [
    "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings",
    "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000", "--criterion", "label_smoothed_cross_entropy",
    "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "5", "--seed", "3",
]


@pytest.fixture(scope="module")
def trained(toy_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("ckpt"))
    run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--max-update", "20", "--save-dir", save] + TRAIN_TINY)
    return save


def test_train_saves_checkpoint(trained):
    assert os.path.exists(os.path.join(trained, "checkpoint_last.pt"))
    assert os.path.exists(os.path.join(trained, "checkpoint_best.pt"))


def test_generate_reloads_without_env_and_scores(trained, toy_bin, tmp_path):
    out = run_cli(
        ["fairseq-generate", toy_bin, "--user-dir", "fairseq_ext", "--path", os.path.join(trained, "checkpoint_best.pt"),
         "--gen-subset", "valid", "--beam", "2", "--batch-size", "16", "--max-len-b", "30"]
    )
    hyps = [l for l in out.stdout.splitlines() if l.startswith("H-")]
    assert len(hyps) == 40, out.stdout[-2000:]
    assert TORCH_ENV not in out.stdout + out.stderr  # torch warns when it finds the variable set
    gen_file = tmp_path / "gen.out"
    gen_file.write_text(out.stdout)
    json_file = tmp_path / "scores.json"
    res = run_cli(["python", "scripts/score/score.py", str(gen_file), "--json", str(json_file), "--max-len", "30"])
    scores = json.loads(json_file.read_text())
    assert scores["n_sentences"] == 40
    assert 0.0 <= scores["bleu"] <= 100.0
    assert "BLEU" in res.stdout


@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 6), reason="weights_only default is torch >= 2.6")
def test_checkpoint_needs_the_plugin_under_new_torch(trained, toy_bin):
    """Without the plugin, torch >= 2.6 refuses the fairseq checkpoint: the patch is what makes it load."""
    with pytest.raises(AssertionError, match="(?i)weights_only|Unpickling"):
        run_cli(["fairseq-generate", toy_bin, "--path", os.path.join(trained, "checkpoint_best.pt"),
                 "--gen-subset", "valid", "--beam", "1", "--batch-size", "16"])


def test_checkpoint_loader_passes_weights_only_without_the_environment(trained, monkeypatch, tmp_path):
    """fairseq's loader calls torch.load with weights_only=False and leaves the
    process environment alone (it used to set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
    around the call, and torch warned about it on every load)."""
    from fairseq import checkpoint_utils

    import fairseq_ext  # noqa: F401

    monkeypatch.delenv(TORCH_ENV, raising=False)
    calls, real_load = [], torch.load

    def spy(*args, **kwargs):
        calls.append((kwargs.get("weights_only"), os.environ.get(TORCH_ENV)))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(trained, "checkpoint_best.pt"))
    assert "model" in state and calls == [(False, None)]
    # in data-parallel training the other ranks unpickle rank 0's state with fairseq.distributed.utils' torch.load
    from fairseq.distributed import utils as distributed_utils

    buffer = io.BytesIO()
    torch.save({"args": argparse.Namespace(lr=0.1)}, buffer)
    buffer.seek(0)
    assert distributed_utils.torch.load(buffer)["args"].lr == 0.1 and calls[-1] == (False, None)
    torch.save({"x": 1}, tmp_path / "plain.pt")
    assert torch.load(tmp_path / "plain.pt") == {"x": 1} and calls[-1] == (None, None)  # elsewhere: torch's default


def test_resume_continues_from_checkpoint(trained, toy_bin, tmp_path):
    save = tmp_path / "resume"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(open(os.path.join(trained, "checkpoint_last.pt"), "rb").read())
    out = run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--max-update", "25", "--save-dir", str(save)] + TRAIN_TINY)
    log = out.stdout + out.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 20 updates\)", log), log[-3000:]
    assert "num_updates 25" in log or "num_updates=25" in log


def test_plugin_registers_and_help_works():
    from fairseq.tasks import TASK_REGISTRY

    import fairseq_ext  # noqa: F401

    assert "text_completion" in TASK_REGISTRY
    out = run_cli(["fairseq-train", "--user-dir", "fairseq_ext", "--help"])
    assert "--criterion" in out.stdout


def test_text_completion_train_generate(toy_lm_bin, toy_raw, tmp_path):
    """A transformer_lm trained on continuations; fairseq-generate prints the k-token
    prefix as S-, the reference continuation as T- and a continuation as H-, for
    every test line: --batch-size 6 leaves a last batch whose size is not a multiple
    of --required-batch-size-multiple (8), which fairseq-fixed drops unless the task
    sets it to 1 (tasks/batching.py)."""
    save = str(tmp_path / "lm")
    common = ["--user-dir", "fairseq_ext", "--task", "text_completion", "--completion-context-size", "3"]
    run_cli(["fairseq-train", toy_lm_bin] + common + [
        "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "32",
        "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "0.005",
        "--max-tokens", "2000", "--max-update", "15", "--save-dir", save, "--no-epoch-checkpoints",
        "--log-format", "simple"])
    out = run_cli(["fairseq-generate", toy_lm_bin] + common + [
        "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "1",
        "--batch-size", "6", "--max-len-b", "20"])
    lines = [l.split() for l in open(os.path.join(toy_raw, "test.txt"))]
    lines = [l for l in lines if len(l) > 3]
    assert (len(lines) % 6) % 8  # a last batch (of 4) that fairseq-fixed would drop
    by_id = {}
    for row in out.stdout.splitlines():
        m = re.match(r"^([STH])-(\d+)\t(.*)$", row)
        if m:
            by_id.setdefault(int(m.group(2)), {})[m.group(1)] = m.group(3).split("\t")[-1]
    assert len(by_id) == len(lines)
    pairs = {(" ".join(l[:3]), " ".join(l[3:])) for l in lines}
    for rec in by_id.values():
        assert len(rec["S"].split()) == 3
        assert (rec["S"], rec["T"]) in pairs
        assert len(rec["H"].split()) <= 20
