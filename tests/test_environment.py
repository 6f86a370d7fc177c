"""The plugin in a user's own environment: the built wheel installs beside the torch and
fairseq that are there without touching them, ``fairseq-ext-dir`` gives ``--user-dir``
from any directory, and an unsupported torch or fairseq is one line at import."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, cli_env
from fairseq_ext.runtime import support

TINY = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings", "--seed", "1",
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "1000", "--num-workers", "0", "--no-save",
        "--disable-validation", "--criterion", "mrt", "--mrt-candidates", "2", "--mrt-task-loss", "edit",
        "--max-update", "1", "--log-format", "simple", "--log-interval", "1"]
VENV_BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize("text, release", [("2.13.0+cpu", (2, 13, 0)), ("0.12.3.1", (0, 12, 3, 1)),
                                           ("2.11.0+cu130", (2, 11, 0)), ("1.0.0a0", (1, 0, 0)), ("0.12.2", (0, 12, 2))])
def test_release_reads_the_numeric_part(text, release):
    assert support.release(text) == release


@pytest.mark.parametrize("name, version, supported", [
    ("fairseq", "0.12.2", True), ("fairseq", "0.12.3.1", True), ("fairseq", "0.12.4", True),
    ("fairseq", "0.12.1", False), ("fairseq", "0.13.0", False), ("fairseq", "0.10.2", False),
    ("torch", "2.0.0", True), ("torch", "2.13.0+cpu", True), ("torch", "1.13.1", False), ("torch", "3.0.0", False)])
def test_supported_ranges(name, version, supported):
    bounds = support.FAIRSEQ_RANGE if name == "fairseq" else support.TORCH_RANGE
    refusal = support._refusal(name, version, "/somewhere", bounds)
    assert (refusal is None) == supported, refusal
    if not supported:
        assert refusal == (f"fairseq-ext needs {name} {'>= 0.12.2, < 0.13' if name == 'fairseq' else '>= 2.0, < 3'} "
                           f"(found {name} {version} in /somewhere)")


def test_an_unsupported_fairseq_is_one_line_at_import(tmp_path):
    """A fairseq of another release found first on the path (here a stand-in package that holds
    only its version file, as fairseq's own does): importing the plugin is one line, exit 2."""
    fake = tmp_path / "fairseq"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('the plugin imported fairseq before checking it')\n")
    (fake / "version.py").write_text('__version__ = "0.10.2"\n')
    env = cli_env(PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]), FAIRSEQ_EXT_FORKSERVER="")
    proc = subprocess.run([sys.executable, "-c", "import fairseq_ext"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("python: error: fairseq-ext needs fairseq >= 0.12.2, < 0.13 (found fairseq 0.10.2 in "), lines
    assert "make install" in lines[0]


def test_fairseq_ext_dir_loads_the_plugin_from_any_directory(toy_bin, tmp_path):
    """fairseq resolves ``--user-dir fairseq_ext`` only from the source tree's root (or beside an
    installed fairseq); ``--user-dir "$(fairseq-ext-dir)"`` works from anywhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = cli_env(FAIRSEQ_EXT_FORKSERVER="")
    where = subprocess.run([os.path.join(VENV_BIN, "fairseq-ext-dir")], cwd=elsewhere, env=env, capture_output=True,
                           text=True, timeout=60, check=True).stdout.strip()
    assert os.path.samefile(where, os.path.join(REPO, "fairseq_ext"))
    plain = subprocess.run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode != 0 and "FileNotFoundError" in plain.stderr, plain.stderr[-2000:]
    proc = subprocess.run(["fairseq-train", toy_bin, "--user-dir", where, *TINY], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "num_updates 1" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]


def _freeze(python, env):
    out = subprocess.run([python, "-m", "pip", "freeze", "--all"], env=env, capture_output=True, text=True, check=True,
                         timeout=120).stdout
    return sorted(line for line in out.splitlines() if line.strip())


def _preinstalled(site, out, with_fairseq_metadata):
    """A copy of this environment's packages by symlinks, without fairseq-ext: torch, fairseq
    and their requirements, as a user's environment holds them. Without fairseq's metadata it
    stands for fairseq from a source checkout or a fork (the module, no fairseq distribution)."""
    os.makedirs(out)
    for name in os.listdir(site):
        low = name.lower()
        if (low.startswith(("fairseq_ext", "fairseq-ext", "__editable__", "easy-install", "_fairseq_ext"))
                or low.endswith((".pth", ".egg-link"))):
            continue
        if not with_fairseq_metadata and low.startswith("fairseq_fixed") and low.endswith(".dist-info"):
            continue
        os.symlink(os.path.join(site, name), os.path.join(out, name))


@pytest.mark.slow
@pytest.mark.parametrize("fairseq_kind", ["fairseq-fixed", "source checkout"])
def test_the_wheel_installs_beside_torch_and_fairseq(fairseq_kind, toy_bin, tmp_path):
    """A fresh virtualenv that already has torch and fairseq (this environment's, linked in):
    installing the built wheel (no package index) adds fairseq-ext and changes no other
    package; from another directory ``fairseq-ext-dir`` then loads it for an MRT update, and
    ``python -m fairseq_ext.options`` lists the options."""
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    build = tmp_path / "src"
    shutil.copytree(REPO, build, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                                "demo_work", ".pytest_cache", ".hypothesis"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "FAIRSEQ_EXT_FORKSERVER"))}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    str(build), "-w", str(wheels)], env=env, check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = [str(p) for p in wheels.glob("fairseq_ext-*.whl")]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], env=env, check=True, timeout=300)
    python = str(venv / "bin" / "python")
    venv_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
    _preinstalled(site, str(tmp_path / "preinstalled"), fairseq_kind == "fairseq-fixed")
    with open(os.path.join(venv_site, "preinstalled.pth"), "w") as f:
        f.write(str(tmp_path / "preinstalled") + "\n")
    env = {**env, "PATH": str(venv / "bin") + os.pathsep + env.get("PATH", "")}
    before = _freeze(python, env)
    assert any(line.startswith("torch==") for line in before), before
    install = subprocess.run([python, "-m", "pip", "install", "--no-index", wheel], env=env, capture_output=True,
                             text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    after = _freeze(python, env)
    added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    assert len(added) == 1 and added[0].startswith("fairseq-ext @ file://") and added[0].split("#")[0].endswith(
        os.path.basename(wheel)), (added, removed)
    assert removed == [], (added, removed)

    where = subprocess.run([str(venv / "bin" / "fairseq-ext-dir")], cwd=elsewhere, env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert where.startswith(venv_site), where
    train = subprocess.run([python, "-m", "fairseq_cli.train", toy_bin, "--user-dir", where, *TINY], cwd=elsewhere,
                           env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0 and "num_updates 1" in train.stdout + train.stderr, (train.stdout + train.stderr)[-3000:]
    options = subprocess.run([python, "-m", "fairseq_ext.options", "mrt"], cwd=elsewhere, env=env, capture_output=True,
                             text=True, timeout=300)
    assert options.returncode == 0 and "--mrt-candidates" in options.stdout, options.stderr[-2000:]
