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
    command = next(line for line in proc.stdout.splitlines() if line.startswith("fairseq-train "))
    expected = {"pg": "--criterion pg", "mgs": "--criterion mgs", "dss": "--criterion differentiable_scheduled_sampling "
                "--dss-warmup 0 --dss-warmup-updates 0 --dss-passes 2", "soft_beam": "--criterion soft_beam_direct_loss --lr 0.0001",
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
                           "--max-update must be >= 1, got 0"),
                          (["--mle", __file__, "--data", str(tmp_path), "--method", "mle", "--task-loss", "chrf"],
                           "--task-loss is an option of --method mrt, pg and mgs; --method mle has no task loss"),
                          (["--mle", __file__, "--data", str(tmp_path), "--method", "mrt", "--gpus", "0"],
                           "--gpus must be >= 1, got 0")]:
        proc = subprocess.run(["python", "-m", "fairseq_ext.finetune", *args], cwd=REPO, env=cli_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr


# --- selection on validation BLEU, from a tiny transformer trained 60 updates on the toy pair ---
TINY_MT = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
           "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
           "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]


@pytest.fixture(scope="module")
def start_model(toy_bin, tmp_path_factory):
    """(data-bin, checkpoint) of a model half-way trained: validation BLEU well above 0 and
    below what more cross-entropy reaches."""
    save = tmp_path_factory.mktemp("finetune_start")
    run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY_MT, "--optimizer", "adam", "--lr", "0.005",
             "--max-tokens", "2000", "--max-update", "60", "--save-dir", str(save), "--no-epoch-checkpoints",
             "--num-workers", "0", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--seed", "1", "--disable-validation"])
    return toy_bin, str(save / "checkpoint_last.pt")


def finetune(start_model, save, *args, check=True):
    data, mle = start_model
    cmd = ["python", "-m", "fairseq_ext.finetune", "--mle", mle, "--data", data, "--save-dir", str(save), "--cpu",
           *args, "--", "--num-workers", "0"]
    if check:
        return run_cli(cmd)
    import subprocess

    from conftest import cli_env
    return subprocess.run(cmd, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)


def valid_bleus(stdout):
    """{update: BLEU} of fairseq-train's validation lines."""
    import json
    out = {}
    for line in stdout.splitlines():
        if '"valid_bleu"' in line:
            stats = json.loads(line[line.index("{"):])
            out[int(stats["valid_num_updates"])] = float(stats["valid_bleu"])
    return out


def same_weights(a, b):
    sa, sb = (torch.load(p, map_location="cpu", weights_only=False)["model"] for p in (a, b))
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_harmful_finetune_ends_with_the_start_selected(start_model, tmp_path):
    """Adam at lr 0.05 wrecks the model: every validation falls far below the start, so
    checkpoint_best.pt is the start model itself and the last line says so."""
    proc = finetune(start_model, tmp_path / "ft", "--method", "mle", "--lr", "0.05", "--max-update", "4",
                    "--validate-every", "2")
    import json
    record = json.loads((tmp_path / "ft" / "selection.json").read_text())
    bleus = valid_bleus(proc.stdout)
    assert set(bleus) == {2, 4} and max(bleus.values()) < record["start"] - 10, (bleus, record)
    assert record["selected"] == "start" and record["best"] == record["start"] and record["last"] == bleus[4]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"finetune: validation BLEU start {record['start']:.2f}, best {record['start']:.2f} at "
                           f"update 0, last {bleus[4]:.2f} at update 4; no update beat the start"), last
    assert same_weights(tmp_path / "ft" / "checkpoint_best.pt", start_model[1])


def test_a_helpful_finetune_keeps_its_best_validation(start_model, tmp_path):
    """More cross-entropy at a sane rate raises validation BLEU: checkpoint_best.pt is the
    update with the highest validation BLEU that fairseq-train logged, not the start."""
    proc = finetune(start_model, tmp_path / "ft", "--method", "mle", "--lr", "0.003", "--max-update", "12",
                    "--validate-every", "4")
    bleus = valid_bleus(proc.stdout)
    assert set(bleus) == {4, 8, 12}, bleus
    best = max(bleus, key=lambda u: (bleus[u], -u))
    import json
    record = json.loads((tmp_path / "ft" / "selection.json").read_text())
    assert bleus[best] > record["start"] and record["best_update"] == best and record["best"] == bleus[best]
    saved = torch.load(tmp_path / "ft" / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    assert saved["optimizer_history"][-1]["num_updates"] == best
    assert f"checkpoint_best.pt is update {best}" in proc.stdout.strip().splitlines()[-1]


def test_the_start_validation_is_fairseq_trains_and_sacrebleus(start_model, tmp_path):
    """The start's BLEU (computed before fairseq-train runs) equals (a) fairseq-train's own
    validation after one update at lr 1e-9 (the same model to 1e-9) and (b) sacrebleu's corpus
    BLEU of fairseq-generate's beam-5 outputs of the validation set, decoded with the same
    length limits, against its references."""
    import sacrebleu
    from conftest import parse_generate_output
    proc = finetune(start_model, tmp_path / "ft", "--method", "mrt", "--lr", "1e-9", "--max-update", "1",
                    "--validate-every", "1")
    import json
    start = json.loads((tmp_path / "ft" / "selection.json").read_text())["start"]
    assert valid_bleus(proc.stdout) == {1: start}
    assert '"valid_cost_mean"' in proc.stdout  # the task loss's own metric beside BLEU
    data, mle = start_model
    gen = run_cli(["fairseq-generate", data, "--user-dir", "fairseq_ext", "--path", mle, "--gen-subset", "valid", "--beam", "5", "--max-len-a", "1.2",
                   "--max-len-b", "10", "--batch-size", "64", "--required-batch-size-multiple", "1"])
    lines = parse_generate_output(gen.stdout)
    hyps, refs = ({i: texts[0] for i, texts in lines[kind].items()} for kind in ("D", "T"))
    assert len(hyps) == len(refs) == 40
    order = sorted(hyps)
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in order], [[refs[i] for i in order]]).score
    assert abs(bleu - start) < 0.01, (bleu, start)


def test_a_collapsed_model_is_reported_and_the_start_kept(start_model, tmp_path):
    """Adam at lr 0.5: every validation output is empty, fairseq's validation has no BLEU and
    stops; finetune says so in one line, keeps the start, exits 1."""
    proc = finetune(start_model, tmp_path / "ft", "--method", "mle", "--lr", "0.5", "--max-update", "4",
                    "--validate-every", "2", check=False)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "every output was empty (the model collapsed" in proc.stdout
    assert "no update beat the start: checkpoint_best.pt is the start model" in proc.stdout.strip().splitlines()[-1]
    assert same_weights(tmp_path / "ft" / "checkpoint_best.pt", start_model[1])


@pytest.mark.parametrize("gpus, freq, tokens", [(1, 4, 16384), (2, 2, 16384), (8, 1, 32768)])
def test_dry_run_on_n_gpus_keeps_the_tokens_an_update(gpus, freq, tokens, start_model, tmp_path):
    """--gpus N (or CUDA_VISIBLE_DEVICES) sets fairseq-train's world size and derives
    --update-freq = round(16384 / (4096 x N)), at least 1; 8 GPUs hold 32k tokens an update."""
    data, mle = start_model
    args = ["python", "-m", "fairseq_ext.finetune", "--mle", mle, "--data", data, "--method", "mrt", "--dry-run"]
    for how, env in [(["--gpus", str(gpus)], {}), ([], {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus)))})]:
        out = run_cli(args + how, env=env).stdout.splitlines()
        assert out[0] == (f"finetune: {gpus} GPU{'s' if gpus > 1 else ''}, --max-tokens 4096 x --update-freq {freq}: "
                          f"about {tokens} tokens an update"), out[0]
        assert f"--max-tokens 4096 --update-freq {freq} --max-update 2000" in out[1]
        assert ("--distributed-world-size" in out[1]) == (gpus > 1)
        if gpus > 1:
            assert out[1].endswith(f"--distributed-world-size {gpus}"), out[1]


def test_dry_run_on_the_cpu_takes_cpu_sized_defaults(start_model):
    data, mle = start_model
    out = run_cli(["python", "-m", "fairseq_ext.finetune", "--mle", mle, "--data", data, "--method", "mrt", "--cpu",
                   "--dry-run"]).stdout.splitlines()
    assert out[0] == "finetune: the CPU, --max-tokens 2048 x --update-freq 1: about 2048 tokens an update"
    for words in ["--criterion mrt --mrt-task-loss sbleu --lr 0.0001",
                  "--max-tokens 2048 --update-freq 1 --max-update 600", "--validate-interval-updates 120",
                  "--best-checkpoint-metric bleu --maximize-best-checkpoint-metric", "--eval-bleu-detok space",
                  "--keep-interval-updates 1", "--cpu"]:
        assert words in out[1], (words, out[1])


def test_a_fairseq_train_command_of_ones_own_is_selected_the_same_way(start_model, tmp_path):
    """python -m fairseq_ext.finetune fairseq-train ...: the start validated under the command's
    own validation first, then the run, then the same selection and closing line; a command that
    does not validate on BLEU is refused in one line before any work."""
    import subprocess

    from conftest import cli_env
    data, mle = start_model
    train = ["python", "-m", "fairseq_ext.finetune", "fairseq-train", data, "--user-dir", "fairseq_ext", *TINY_MT,
             "--finetune-from-model", mle, "--criterion", "label_smoothed_cross_entropy", "--optimizer", "adam",
             "--lr", "0.05", "--max-tokens", "2048", "--max-update", "4", "--cpu", "--num-workers", "0",
             "--save-dir", str(tmp_path / "own"), "--log-format", "json"]
    bleu = ["--eval-bleu", "--eval-bleu-args", '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}',
            "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric", "--validate-interval-updates", "2",
            "--save-interval-updates", "2"]
    proc = subprocess.run(train, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "python -m fairseq_ext.finetune: error: the fairseq-train command must validate on BLEU and keep its best: add "
        "--eval-bleu --best-checkpoint-metric bleu --maximize-best-checkpoint-metric (with the data's "
        "--eval-bleu-remove-bpe and --eval-bleu-detok)"), proc.stderr[-2000:]
    assert not (tmp_path / "own").exists()
    out = run_cli(train + bleu).stdout
    import json
    record = json.loads((tmp_path / "own" / "selection.json").read_text())
    bleus = valid_bleus(out)
    assert set(bleus) == {2, 4} and record["selected"] == "start" and max(bleus.values()) < record["start"]
    assert "no update beat the start: checkpoint_best.pt is the start model" in out.strip().splitlines()[-1]
    assert same_weights(tmp_path / "own" / "checkpoint_best.pt", mle)
