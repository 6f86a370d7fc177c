"""A checkpoint knows its dictionaries (``runtime.dictionaries``): a checkpoint trained with
the plugin refuses data whose dictionaries have the same size but other entries, at
``fairseq-generate --path``, ``--finetune-from-model`` and ``--restore-file``, nothing
written (in one line with exit 2 where the command chooses a plugin component); ``FAIRSEQ_EXT_DICT_CHECK=0`` overrides it; a
checkpoint without fingerprints loads as before."""
import os
import shutil
import subprocess

import pytest
import torch

from conftest import REPO, cli_env, run_cli
from fairseq_ext.runtime import dictionaries

TINY = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings", "--seed", "1",
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "1000", "--num-workers", "0",
        "--disable-validation", "--no-epoch-checkpoints", "--log-format", "simple"]


def run(args, **env):
    """A command that may fail: its CompletedProcess."""
    return subprocess.run(args, cwd=REPO, env=cli_env(**env), capture_output=True, text=True, timeout=600)


GENERATE = ["--gen-subset", "valid", "--beam", "2", "--batch-size", "20", "--max-len-b", "20"]


class _Dictionary:
    def __init__(self, symbols):
        self.symbols = list(symbols)

    def __len__(self):
        return len(self.symbols)


def test_fingerprint_is_the_sha256_of_the_symbols_in_order():
    """A pinned value (checkpoints keep fingerprints: the format must not drift): the first
    12 hex digits of sha256("<s>\\n<pad>\\n</s>\\n<unk>\\na\\nb"), written out once; counts do
    not enter, the order does."""
    from fairseq.data import Dictionary

    symbols = ["<s>", "<pad>", "</s>", "<unk>", "a", "b"]
    assert dictionaries.fingerprint(_Dictionary(symbols)) == "d3ce97b62d52"
    real = Dictionary()
    real.add_symbol("a", n=5)
    real.add_symbol("b", n=1)
    assert dictionaries.fingerprint(real) == "d3ce97b62d52"  # fairseq's own, other counts
    swapped = symbols[:4] + ["b", "a"]
    assert dictionaries.fingerprint(_Dictionary(swapped)) != dictionaries.fingerprint(_Dictionary(symbols))


@pytest.fixture(scope="module")
def trained(toy_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("dict_ckpt"))
    run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY, "--criterion", "cross_entropy",
             "--max-update", "3", "--save-dir", save])
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def other_bin(toy_bin, tmp_path_factory):
    """The toy data with the same-size dictionaries of another vocabulary: two entries swapped."""
    out = str(tmp_path_factory.mktemp("other_bin"))
    shutil.copytree(toy_bin, out, dirs_exist_ok=True)
    for side in ("src", "tgt"):
        path = os.path.join(out, f"dict.{side}.txt")
        lines = open(path).read().splitlines()
        lines[0], lines[1] = lines[1], lines[0]
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
    return out


def test_the_checkpoint_holds_the_fingerprints_of_its_data(trained, toy_bin):
    from fairseq.data import Dictionary

    state = torch.load(trained, map_location="cpu", weights_only=False)
    saved = state["extra_state"]["fairseq_ext"]["dictionaries"]
    for side in ("src", "tgt"):
        d = Dictionary.load(os.path.join(toy_bin, f"dict.{side}.txt"))
        key = "source" if side == "src" else "target"
        assert saved[key] == {"fingerprint": dictionaries.fingerprint(d), "size": len(d)}


def _refused(proc, path, data, plugin_command=True):
    """A command that chooses a plugin component ends with one line, exit 2; one with only fairseq's
    components, with a traceback whose last line is the same message (exit 1)."""
    if plugin_command:
        assert proc.returncode == 2, (proc.stdout + proc.stderr)[-2000:]
        lines = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    else:
        assert proc.returncode == 1 and "Traceback" in proc.stderr, (proc.stdout + proc.stderr)[-2000:]
        lines = proc.stderr.strip().splitlines()[-1:]
        assert lines[0].startswith("fairseq_ext.runtime.dictionaries.DictionaryMismatch: "), lines
    line = lines[0]
    assert f"{path}: trained with another source dictionary than {data}'s (the same size, other entries)" in line
    assert line.count("entries") == 3 and "FAIRSEQ_EXT_DICT_CHECK=0" in line, line
    return line


def test_generate_refuses_same_size_other_dictionary(trained, toy_bin, other_bin):
    proc = run(["fairseq-generate", other_bin, "--user-dir", "fairseq_ext", "--path", trained, *GENERATE])
    line = _refused(proc, trained, other_bin, plugin_command=False)
    state = torch.load(trained, map_location="cpu", weights_only=False)
    assert state["extra_state"]["fairseq_ext"]["dictionaries"]["source"]["fingerprint"] in line
    assert not [l for l in proc.stdout.splitlines() if l.startswith("H-")]
    # the data it was trained on decodes; the override decodes the other data too
    ok = run_cli(["fairseq-generate", toy_bin, "--user-dir", "fairseq_ext", "--path", trained, *GENERATE])
    assert len([l for l in ok.stdout.splitlines() if l.startswith("H-")]) == 40
    forced = run_cli(["fairseq-generate", other_bin, "--user-dir", "fairseq_ext", "--path", trained, *GENERATE],
                     env={"FAIRSEQ_EXT_DICT_CHECK": "0"})
    assert len([l for l in forced.stdout.splitlines() if l.startswith("H-")]) == 40


@pytest.mark.parametrize("how", ["--finetune-from-model", "--restore-file"])
def test_training_refuses_same_size_other_dictionary(how, trained, other_bin, tmp_path):
    save = tmp_path / "save"
    proc = run(["fairseq-train", other_bin, "--user-dir", "fairseq_ext", *TINY, "--criterion", "mrt",
                "--max-update", "5", "--save-dir", str(save), how, trained]
               + (["--reset-optimizer"] if how == "--restore-file" else []))  # the checkpoint's criterion is another
    _refused(proc, trained, other_bin)
    assert not list(save.glob("*.pt")) if save.exists() else True


def test_a_checkpoint_without_fingerprints_loads_as_before(trained, other_bin, tmp_path):
    """Trained without the plugin (no fingerprints): nothing to compare, it loads."""
    state = torch.load(trained, map_location="cpu", weights_only=False)
    del state["extra_state"]["fairseq_ext"]["dictionaries"]
    plain = str(tmp_path / "plain.pt")
    torch.save(state, plain)
    proc = run_cli(["fairseq-generate", other_bin, "--user-dir", "fairseq_ext", "--path", plain, *GENERATE])
    assert len([l for l in proc.stdout.splitlines() if l.startswith("H-")]) == 40
