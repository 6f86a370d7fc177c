"""The suite's fork server (tests/forkserver.py) must be invisible: a command run
through it behaves as the real program does (output streams, exit status, signals,
environment), and it is really used (else the suite is slow again)."""
import os
import signal
import subprocess
import time

import pytest

from conftest import REPO, cli_env
from fairseq_ext.synthetic import tiny_models

REAL = {"FAIRSEQ_EXT_FORKSERVER": ""}  # the shims exec the real program
pytestmark = pytest.mark.skipif(not os.environ.get("FAIRSEQ_EXT_FORKSERVER"), reason="fork server turned off")


def run(args, real=False, **env):
    env = cli_env(**{"OMP_NUM_THREADS": "1", **env, **(REAL if real else {})})
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_commands_run_in_the_preloaded_server():
    probe = ["python", "-c", "import sys; print('torch' in sys.modules, sys.argv)", "a", "b"]
    assert run(probe).stdout.split("\n")[0] == "True ['-c', 'a', 'b']"
    assert run(probe, real=True).stdout.split("\n")[0] == "False ['-c', 'a', 'b']"
    # an environment variable read when torch is imported: the real interpreter
    threads = ["python", "-c", "import torch; print(torch.get_num_threads())"]
    assert run(threads, OMP_NUM_THREADS="2").stdout.strip() == "2"


def test_train_and_generate_print_where_the_real_programs_print(toy_bin, tmp_path):
    """fairseq-train logs to stdout (its module-level basicConfig), fairseq-generate to
    stderr (fairseq's import-time one): the server must not swap them; errors end the
    same way with the same status."""
    outs = {}
    for real in (False, True):
        save = tmp_path / f"real{real}"
        train = run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *tiny_models.TINY_ARCHS["transformer"],
                     "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500", "--max-update", "2",
                     "--num-workers", "0", "--seed", "1", "--disable-validation", "--save-dir", str(save)], real=real)
        assert train.returncode == 0, train.stderr[-2000:]
        gen = run(["fairseq-generate", toy_bin, "--user-dir", "fairseq_ext", "--path", str(save / "checkpoint_last.pt"),
                   "--beam", "2", "--max-sentences", "8"], real=real)
        bad = run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--criterion", "mgs", "--mgs-alpha", "0"],
                  real=real)
        outs[real] = (train, gen, bad)
    for train, gen, bad in outs.values():
        assert "num_updates" in train.stdout and "done training" in train.stdout
        assert gen.stdout.count("\nH-") + gen.stdout.startswith("H-") == 40 and "Translated" in gen.stderr
        assert bad.returncode != 0
    assert outs[False][1].stdout.splitlines()[-1] == outs[True][1].stdout.splitlines()[-1]  # the same BLEU line
    assert outs[False][2].returncode == outs[True][2].returncode
    assert outs[False][2].stderr.strip().splitlines()[-1] == outs[True][2].stderr.strip().splitlines()[-1]


def test_signals_reach_the_command_and_a_killed_shim_takes_it_down(tmp_path):
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    for sig, expected in ((signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM),
                          (signal.SIGKILL, -signal.SIGKILL)):
        pidfile.unlink(missing_ok=True)
        proc = subprocess.Popen(["python", "-c", code], cwd=REPO, env=cli_env(OMP_NUM_THREADS="1"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not pidfile.exists() or not pidfile.read_text():
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.05)
        child = int(pidfile.read_text())
        assert child != proc.pid  # the command runs in the server's child, not in the shim
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == expected
        deadline = time.time() + 10
        while os.path.exists(f"/proc/{child}") and time.time() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{child}"), f"the command outlived its shim ({sig!r})"
