"""Fixtures made once per pytest run (``scope="session"``, pytest's name for one run): the toy data
set binarized once, tiny fairseq models, and the real corpora directory ($FAIRSEQ_EXT_DATA)."""
import atexit
import json
import glob
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from fairseq_ext.evaluation.generate_output import parse as parse_generate_output
from fairseq_ext.synthetic import tiny_models, toy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the pages a user reads: their commands and links are checked (test_doc_commands, test_doc_links)
USER_PAGES = sorted({os.path.relpath(p, REPO) for pattern in ("README.md", "docs/*.md", "examples/README.md",
                                                               "examples/*/README.md", "examples/*/results/README.md")
                     for p in glob.glob(os.path.join(REPO, pattern))})


@pytest.fixture(scope="session")
def toy_raw(tmp_path_factory):
    return toy.write_toy_data(str(tmp_path_factory.mktemp("toy_raw")), sizes=(300, 40, 40), seed=1)


@pytest.fixture(scope="session")
def toy_bin(toy_raw, tmp_path_factory):
    """Binarized toy translation data (src -> tgt, joined dictionary)."""
    return toy.binarize_translation(toy_raw, str(tmp_path_factory.mktemp("toy_bin")))


@pytest.fixture(scope="session")
def toy_lm_bin(toy_raw, tmp_path_factory):
    """Binarized toy target-side lines for text_completion / language modeling."""
    return toy.binarize_lines(toy_raw, str(tmp_path_factory.mktemp("toy_lm_bin")))


@pytest.fixture(scope="session")
def untrained_models(toy_bin, toy_lm_bin):
    """Untrained tiny models: {'transformer', 'lstm'} on the translation task and
    'transformer_lm' on text_completion (context size 3), each as (task, model)."""
    out = {}
    for arch in ("transformer", "lstm"):
        task, model, _ = tiny_models.build_task_and_model(toy_bin, "translation", arch)
        out[arch] = (task, model)
    task, model, _ = tiny_models.build_task_and_model(toy_lm_bin, "text_completion", "transformer_lm",
                                                      ["--completion-context-size", "3"])
    out["transformer_lm"] = (task, model)
    return out


@pytest.fixture(scope="session")
def real_data():
    """$FAIRSEQ_EXT_DATA (the shared real corpora). Missing: an error in CI, a skip elsewhere."""
    path = os.environ.get("FAIRSEQ_EXT_DATA")
    if not path or not os.path.isdir(path):
        msg = (
            "FAIRSEQ_EXT_DATA is not set to the shared corpora directory "
            f"(got {path!r}); .ci/run sets it to ../shared/data"
        )
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


# ---------------------------------------------------------------- commands through the fork server
# tests/forkserver.py: one process per test worker imports torch and fairseq once and forks it for
# each `fairseq-*` / `python` command a test or recipe launches (about 3 CPU s saved per command).
# FAIRSEQ_EXT_FORKSERVER=0 turns it off (every command a fresh interpreter); a test that needs real
# process semantics passes ``env={"FAIRSEQ_EXT_FORKSERVER": ""}``.
_SHIMS = None


def _start_fork_server():
    global _SHIMS
    if os.environ.get("FAIRSEQ_EXT_FORKSERVER") == "0":
        return
    import forkserver

    root = tempfile.mkdtemp(prefix="fxfs")
    shims, address = os.path.join(root, "bin"), os.path.join(root, "sock")
    forkserver.install_shims(shims, os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    log = open(os.path.join(root, "server.log"), "w")
    server = subprocess.Popen([sys.executable, forkserver.__file__, address, str(os.getpid())], env=env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not os.path.exists(address):
        if server.poll() is not None or time.time() > deadline:
            server.kill()
            return  # every command runs as a fresh interpreter
        time.sleep(0.05)

    def stop():
        server.kill()
        server.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(stop)
    os.environ["FAIRSEQ_EXT_FORKSERVER"] = address
    os.environ["PATH"] = shims + os.pathsep + os.environ.get("PATH", "")  # commands started without cli_env too
    _SHIMS = shims


def pytest_sessionstart(session):
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        _start_fork_server()  # in each test worker (not in pytest-xdist's controller)


def cli_env(**overrides):
    """The environment of a console command run by a test: the fork server's shims and
    the venv's bin first on PATH, without TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (the plugin
    must load checkpoints by itself), plus ``overrides``."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if _SHIMS:
        env["PATH"] = _SHIMS + os.pathsep + env["PATH"]
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.update(overrides)
    return env


def run_cli(args, cwd=None, env=None, timeout=600):
    """Run a console command with the venv's bin first on PATH; fail with its output.

    With FAIRSEQ_EXT_TEST_PROFILE=FILE set, appends one JSON line per command to FILE:
    the test, the command's first words, its wall time and the CPU time of the
    command and its children (where the suite's time goes; a command run by the fork
    server is not a child of the test: set FAIRSEQ_EXT_FORKSERVER=0 to count its CPU)."""
    full_env = cli_env(**(env or {}))
    profile = os.environ.get("FAIRSEQ_EXT_TEST_PROFILE")
    if profile:
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(args, cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    if profile:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        with open(profile, "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "cmd": " ".join(args[:3]),
                                "wall": round(time.perf_counter() - start, 2), "cpu": round(cpu, 2)}) + "\n")
    if proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def run_cli_batch(commands, tmp_path, env=None, timeout=600):
    """Run console commands (argv lists, or dicts with ``argv`` and optional ``env`` /
    ``cwd``) one after the other in forks of one process that imported the plugin once
    (``tests/cli_batch.py``): for the many commands that stop while parsing. Returns one
    ``{"rc", "stdout", "stderr", "seconds", "cpu"}`` per command."""
    requests = [c if isinstance(c, dict) else {"argv": list(c)} for c in commands]
    req, res = tmp_path / "cli_batch_requests.json", tmp_path / "cli_batch_results.json"
    req.write_text(json.dumps(requests))
    proc = subprocess.run(["python", os.path.join(REPO, "tests", "cli_batch.py"), str(req), str(res)], cwd=REPO,
                          env=cli_env(**(env or {})), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(res.read_text())


def run_bench(script, tmp_path, *args, timeout=300):
    """Run ``bench/<script> --quick ARGS --json FILE``; fail with its output; return the
    parsed rows. Benchmarks print timings; the smoke tests never assert them."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(["python", os.path.join(REPO, "bench", script), "--quick", *args, "--json", str(out)],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def conll(tmp_path_factory):
    """A small toy CoNLL-2003 directory (train/dev/test.txt) for sequence_tagging."""
    return toy.write_toy_conll(str(tmp_path_factory.mktemp("conll")))


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A cache directory for sequence_tagging's binarized splits."""
    return str(tmp_path_factory.mktemp("tagging_cache"))


def hypotheses_by_id(stdout):
    """{sentence id: [its H- lines' score and text]} of a fairseq-generate output."""
    return parse_generate_output(stdout, keep_scores=True)["H"]


def assert_shards_make_one_run(cmd, shards=2, timeout=600):
    """Run ``cmd`` (a fairseq-generate command) once whole and once per shard
    (``--num-shards N --shard-id i``, all at the same time); the shards must print
    disjoint, non-empty sets of sentences whose hypotheses together are the whole
    run's, line for line. Returns the whole run's hypotheses by id."""
    env = cli_env(OMP_NUM_THREADS="1")
    cmds = [cmd] + [cmd + ["--num-shards", str(shards), "--shard-id", str(i)] for i in range(shards)]
    procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for c, p, (out, err) in zip(cmds, procs, outs):
        assert p.returncode == 0, f"{' '.join(c)}\n{out[-2000:]}\n{err[-4000:]}"
    whole, parts = hypotheses_by_id(outs[0][0]), [hypotheses_by_id(o) for o, _ in outs[1:]]
    assert all(parts), "a shard printed no sentence"
    merged = {}
    for part in parts:
        assert not merged.keys() & part.keys(), "shards overlap"
        merged.update(part)
    assert merged == whole
    return whole


# ---------------------------------------------------------------- parallel runs (pytest-xdist)
# `make test` runs the suite on every core with `-n auto --dist loadfile --no-loadscope-reorder`:
# the tests of one module run in one worker, so module fixtures (trained checkpoints, binarized
# data) are made once. (`--dist loadgroup` would split modules further, but pytest-xdist 3.8 marks
# groups through `Item._nodeid`, which pytest 9 no longer reads: every test became its own group and
# each worker trained the fixtures again.) Modules are handed out in the order below, longest
# first, so that no long module starts last (seconds on 2 idle cores; the order matters, not the
# numbers).
EXPECTED_SECONDS = {
    "test_recipes": 180, "test_dss_exposure_bias": 170, "test_real_data": 150, "test_soft_beam": 120,
    "test_static_cache_steps": 110, "test_distributed": 95, "test_robustness": 85,
    "test_residual_distinct": 70, "test_tagging": 65, "test_mh_sampler": 65,
    "test_demo": 60, "test_bench_soft_beam_smoke": 55, "test_forkserver": 45, "test_compiled_step": 40,
    "test_prepare_translation": 40, "test_mgs_distributed": 30, "test_option_errors": 30, "test_soft_beam_label_bias": 27,
    "test_mgs_cli": 26, "test_dss": 25, "test_residual_ebm_cli": 24, "test_bench_mgs_smoke": 24,
    "test_bench_criteria_smoke": 23, "test_mh_core": 18, "test_estimators": 17, "test_score_script": 16,
    "test_mbr_generate": 60, "test_exact_resume": 15, "test_cli": 14, "test_logging": 11, "test_pg_baseline": 11, "test_mlm_energy_synthetic": 11,
}

# ---------------------------------------------------------------- the full suite
# Tests marked ``slow`` take minutes each: a method against its control on a designed task or a real
# corpus (several trainings to convergence), and the paper-scale recipes end to end. `make test` leaves
# them out (it stays under 8 minutes on 2 cores); `make test-full` (FAIRSEQ_EXT_FULL=1), CI, and any
# `-m` expression that names them run them.
FULL_ENV = "FAIRSEQ_EXT_FULL"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: minutes of training; run by make test-full (FAIRSEQ_EXT_FULL=1)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not os.environ.get(FULL_ENV) and not config.getoption("markexpr", ""):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.module.__name__, i)
    items.sort(key=lambda item: (-EXPECTED_SECONDS.get(item.module.__name__, 0), first_seen[item.module.__name__]))
