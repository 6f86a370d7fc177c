"""``python -m fairseq_ext.finetune``, the one fine-tuning path for a user's checkpoint:
from tiny transformer and lstm checkpoints on a Moses + subword-nmt corpus and on a
sentencepiece corpus, it reads the architecture, the model options and the tokenization
from the checkpoint, and fine-tunes with each method; the fine-tuned model has the
checkpoint's model options, and its text costs detokenize as the data does."""
import argparse
import os

import pytest
import torch

from conftest import REPO, run_cli
from fairseq_ext.synthetic import tiny_models
from test_detokenization import prepared_corpora

TRAIN = ["--optimizer", "adam", "--lr", "0.005", "--max-tokens", "400", "--max-update", "3", "--num-workers", "0",
         "--disable-validation", "--no-epoch-checkpoints", "--seed", "1", "--dropout", "0.2",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
SMALL = ["--max-tokens", "300", "--update-freq", "1", "--max-update", "1", "--cpu", "--", "--disable-validation",
         "--num-workers", "0"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(arch, bpe): (data-bin, MLE checkpoint)}: tiny models trained 3 updates; the subword-nmt
    ones with fairseq's --tokenizer moses --bpe subword_nmt (the tokenization the checkpoint
    records)."""
    root = tmp_path_factory.mktemp("finetune")
    corpora, _, _ = prepared_corpora(root)
    out = {}
    for bpe, prepared in corpora.items():
        tokenization = (["--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", str(prepared / "code"),
                         "--source-lang", "de", "--target-lang", "en"] if bpe == "subword_nmt" else [])
        for arch in ("transformer", "lstm"):
            save = root / f"{arch}_{bpe}"
            run_cli(["fairseq-train", str(prepared / "bin"), "--user-dir", "fairseq_ext",
                     *tiny_models.TINY_ARCHS[arch], *TRAIN, *tokenization, "--save-dir", str(save)])
            out[arch, bpe] = (str(prepared / "bin"), str(save / "checkpoint_last.pt"))
    return out


def model_args(path):
    state = torch.load(path, map_location="cpu", weights_only=False)
    from fairseq.models import ARCH_MODEL_REGISTRY

    saved = state["cfg"]["model"]
    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[saved.arch].add_args(parser)
    return {a.dest: getattr(saved, a.dest, None) for a in parser._actions if a.option_strings and a.dest != "help"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "lstm"])
@pytest.mark.parametrize("bpe", ["subword_nmt", "sentencepiece"])
def test_finetune_reads_the_model_and_tokenization_from_the_checkpoint(arch, bpe, checkpoints, tmp_path):
    data, mle = checkpoints[arch, bpe]
    save = tmp_path / "mrt"
    proc = run_cli(["python", "-m", "fairseq_ext.finetune", "--mle", mle, "--data", data, "--method", "mrt",
                    "--save-dir", str(save), *SMALL], cwd=str(tmp_path))
    log = proc.stdout + proc.stderr
    assert os.path.isfile(save / "checkpoint_last.pt"), log[-3000:]
    assert model_args(save / "checkpoint_last.pt") == model_args(mle)  # the same model, dropout 0.2 included
    assert model_args(mle)["dropout"] == 0.2
    how = ("subwords removed by --bpe subword_nmt, detokenized with --tokenizer moses" if bpe == "subword_nmt"
           else "subwords removed by --mrt-post-process sentencepiece")
    assert f"text costs (sbleu): {how}" in log, log[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pg", "mgs", "dss", "soft_beam", "mle"])
def test_finetune_runs_every_method(method, checkpoints, tmp_path):
    data, mle = checkpoints["transformer", "sentencepiece"]
    save = tmp_path / method
    proc = run_cli(["python", "-m", "fairseq_ext.finetune", "--mle", mle, "--data", data, "--method", method,
                    "--save-dir", str(save), *SMALL], cwd=str(tmp_path))
    assert os.path.isfile(save / "checkpoint_last.pt"), (proc.stdout + proc.stderr)[-3000:]
    command = proc.stdout.splitlines()[0]
    expected = {"pg": "--criterion pg", "mgs": "--criterion mgs", "dss": "--criterion differentiable_scheduled_sampling "
                "--dss-passes 2", "soft_beam": "--criterion soft_beam_direct_loss --lr 0.0001",
                "mle": "--criterion label_smoothed_cross_entropy"}[method]
    assert expected in command, command


def test_bad_input_is_one_line(tmp_path):
    import subprocess

    from conftest import cli_env

    for args, message in [(["--mle", "nope.pt", "--data", str(tmp_path), "--method", "mrt"],
                           "--mle nope.pt: no such checkpoint file"),
                          (["--mle", __file__, "--data", str(tmp_path / "nope"), "--method", "mrt"],
                           "no such data directory"),
                          (["--mle", __file__, "--data", str(tmp_path), "--method", "mrt", "--max-update", "0"],
                           "--max-update must be >= 1, got 0")]:
        proc = subprocess.run(["python", "-m", "fairseq_ext.finetune", *args], cwd=REPO, env=cli_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
