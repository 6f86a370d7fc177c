"""scripts/prepare/prepare_translation.py on your own corpus (docs/data.md, "Bring your own data"):
any language codes and split file names, sentencepiece or subword-nmt, binarized for
fairseq; the subwords come back off exactly and --*-post-process auto recognises them;
missing files and bad values stop it with one line naming them. scripts/prepare/prepare_multi30k.sh,
now a wrapper, still takes Multi30k's layout."""
import json
import os
import subprocess

import pytest
from fairseq.data import Dictionary

from conftest import REPO, cli_env
from fairseq_ext.synthetic import toy
from fairseq_ext.costs.sequence_cost import resolve_post_process

SCRIPT = os.path.join(REPO, "scripts", "prepare", "prepare_translation.py")
SIZES = {"training": 300, "heldout": 40, "eval": 30}


def prepare(*args):
    return subprocess.run(["python", SCRIPT, *map(str, args)], cwd=REPO, env=cli_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """corpus/{training,heldout,eval}.{xh,zu}: the toy pairs under other language codes and split names."""
    root = tmp_path_factory.mktemp("corpus")
    for seed, (name, n) in enumerate(SIZES.items()):
        pairs = toy.toy_corpus(n, seed)
        for lang, side in (("xh", 0), ("zu", 1)):
            (root / f"{name}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    return root


def unsegment(line, bpe):
    return line.replace(" ", "").replace("\u2581", " ").strip() if bpe == "sentencepiece" else line.replace("@@ ", "")


@pytest.mark.parametrize("bpe,vocab", [("sentencepiece", 60), ("subword_nmt", 40)])
def test_own_corpus_any_languages_and_split_names(corpus, tmp_path, bpe, vocab):
    out = tmp_path / "prep"
    proc = prepare(out, "--src", "xh", "--tgt", "zu", "--train", corpus / "training", "--valid", corpus / "heldout",
                   "--test", corpus / "eval", "--bpe", bpe, "--vocab-size", vocab, "--binarize", "--joined-dictionary")
    assert proc.returncode == 0, proc.stderr[-3000:]
    nothing_dropped = {"empty": 0, "min_len": 0, "max_len": 0, "ratio": 0}
    assert json.loads((out / "stats.json").read_text()) == {"train": 300, "valid": 40, "test": 30,
                                                            "train_dropped": nothing_dropped}
    assert "cleaning: kept 300 of 300 training pairs, dropped 0 (0.0%)" in proc.stdout
    assert "train: 300 pairs" in proc.stdout and f"--post-process {bpe}" in proc.stdout
    for split, name in (("train", "training"), ("valid", "heldout"), ("test", "eval")):
        for lang in ("xh", "zu"):
            pieces = (out / f"{split}.{lang}").read_text().splitlines()
            words = (corpus / f"{name}.{lang}").read_text().splitlines()
            assert [unsegment(p, bpe) for p in pieces] == words  # the subwords come off exactly
            assert (out / "bin" / f"{split}.xh-zu.{lang}.bin").exists()
    assert (out / "bin" / "dict.xh.txt").read_text() == (out / "bin" / "dict.zu.txt").read_text()
    # the words were split (a small vocabulary), and the criteria's default post-process finds the scheme
    assert sum(len(p.split()) for p in (out / "train.zu").read_text().splitlines()) > sum(
        len(w.split()) for w in (corpus / "training.zu").read_text().splitlines())
    assert resolve_post_process("auto", Dictionary.load(str(out / "bin" / "dict.zu.txt")), "--mgs-post-process",
                                ["sbleu"]) == bpe


def test_valid_split_from_training_and_no_test(corpus, tmp_path):
    """Without --valid every 10th training pair is held out; without --test there is no test split."""
    out = tmp_path / "prep"
    proc = prepare(out, "--src", "xh", "--tgt", "zu", "--train", corpus / "training", "--valid-every", "10",
                   "--bpe", "sentencepiece", "--vocab-size", "60", "--binarize")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {k: v for k, v in json.loads((out / "stats.json").read_text()).items() if k != "train_dropped"} == {
        "train": 270, "valid": 30}
    assert not (out / "bin" / "test.xh-zu.xh.bin").exists() and (out / "bin" / "dict.xh.txt").exists()


@pytest.mark.parametrize("args,message", [
    (["--valid", "{root}/heldout", "--test", "{root}/missing"], "--test: missing input file {root}/missing.xh"),
    (["--train", "{root}/training.{{l}}.txt"], "--train: missing input file {root}/training.xh.txt"),
    (["--vocab-size", "5"], "--vocab-size 5: sentencepiece:"),
    (["--vocab-size", "0"], "--vocab-size must be >= 1, got 0"),
    (["--joined-dictionary"], "--joined-dictionary goes with --binarize"),
])
def test_bad_input_is_one_line_naming_it(corpus, tmp_path, args, message):
    args = [a.format(root=corpus) for a in args]
    proc = prepare(tmp_path / "prep", "--src", "xh", "--tgt", "zu", "--train", corpus / "training",
                   "--bpe", "sentencepiece", "--vocab-size", "60", *args)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("prepare_translation: ")
    assert message.format(root=corpus) in proc.stderr


def test_prepare_multi30k_layout(tmp_path):
    """The documented Multi30k command: {train,val,test}.{de,en} in, pieces and bin/ out."""
    raw = tmp_path / "m30k"
    raw.mkdir()
    for seed, name in enumerate(("train", "val", "test")):
        pairs = toy.toy_corpus(60 if name == "train" else 10, seed)
        for lang, side in (("de", 0), ("en", 1)):
            (raw / f"{name}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    env = cli_env(PYTHON="python", WORKERS="1")
    proc = subprocess.run(["bash", "scripts/prepare/prepare_multi30k.sh", str(raw), str(tmp_path / "out"), "100"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "spm.model").exists() and (tmp_path / "out" / "valid.en").exists()
    assert (tmp_path / "out" / "bin" / "test.de-en.en.bin").exists()
    (raw / "val.en").unlink()
    proc = subprocess.run(["bash", "scripts/prepare/prepare_multi30k.sh", str(raw), str(tmp_path / "out2"), "100"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"missing input file {raw}/val.en" in proc.stderr
