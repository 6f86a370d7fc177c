"""Every criterion under fairseq's data-parallel stack on CPU, through fairseq-train
(tests/dist_train.py: fairseq-train that also dumps each rank's parameters after
every update).

For each criterion, from one starting model and seed, three updates are run as
- ``ref``: one process; for translation a batch of 8 sentences (the whole
  8-sentence training set, so every update sees the same 8 sentences whatever the
  batching); for residual_nce (300 lines, many blocks) 4 blocks x ``--update-freq 2``;
- ``uf2`` (translation): one process, 4 sentences x ``--update-freq 2``;
- ``c10d`` / ``legacy_ddp``: two processes (gloo, ``--distributed-no-spawn``), 4
  sentences (blocks) each. fairseq shards the shuffled batch list (rank r takes
  batches r, r + 2, ...) exactly as ``--update-freq 2`` groups it, so both ranks
  together see the ``ref`` data of every update;
- ``saved`` + ``resumed``: a run as a user runs a long job, with validation and
  ``--save-interval-updates 1``, 4 updates an epoch (translation: batches of 2);
  then a new run resumed from its update-1 checkpoint (``checkpoint_1_1.pt`` as
  ``checkpoint_last.pt``, mid-epoch) for updates 2 and 3.

and the tests check: the two ranks hold bitwise-identical parameters after every
update (both backends); the two-process run equals the one-process run on the
union of the batches (parameters and logged metrics, to float rounding) for every
criterion whose update is a function of the data (all but ``pg``, which samples);
``--update-freq 2`` equals one batch of twice the size for the additive criteria,
and for ``mgs`` it does not (costs are pooled per micro-batch, docs/distributed.md);
every resumed update (two of them: an update count read from a stale meter went
wrong only from the second) is bitwise the uninterrupted ``saved`` run's, with
identical logged metrics (schedules, seeds and the PG moving baseline included).
"""
import glob
import json
import math
import os
import shutil
import subprocess

import pytest
import torch
from fairseq.dataclass.configs import DatasetConfig

from conftest import REPO, cli_env
from fairseq_ext.synthetic import tiny_models, toy
from test_residual_ebm_cli import TASK as RESIDUAL_TASK
from test_residual_ebm_cli import base_lm, negatives  # noqa: F401  (fixtures)

USER_DIR = os.path.join(REPO, "fairseq_ext")
SCRIPT = os.path.join(REPO, "tests", "dist_train.py")
UPDATES = 3
# float rounding (summation order): ~1e-7 after the first SGD step (lr 0.5), amplified to ~1e-4 by the
# soft beam's peaked softmaxes after three; MGS's per-micro-batch searches differ by ~1e-2 at the first
TOL = {1: 1e-5, 2: 1e-3, 3: 1e-3}
COMMON = ["--user-dir", USER_DIR, "--seed", "1", "--num-workers", "0", "--cpu", "--log-format", "json",
          "--log-interval", "1", "--no-epoch-checkpoints", "--optimizer", "sgd",
          "--lr", "0.5", "--required-batch-size-multiple", "1"]
NO_VALID = ["--disable-validation"]
# a long run as users launch it: validation and a checkpoint at every update (kept)
SAVING = ["--save-interval-updates", "1", "--keep-interval-updates", "-1"]
# fairseq main orders a split's examples under seed + the epoch its batch iterator is built in and reuses the
# iterator: a resumed run builds it in a later epoch than an uninterrupted one, so its batches differ unless
# the iterator is rebuilt every epoch (docs/distributed.md)
if "update_epoch_batch_itr" in DatasetConfig.__dataclass_fields__:
    COMMON += ["--update-epoch-batch-itr", "True"]
MT_MODEL = tiny_models.TINY_ARCHS["transformer"] + ["--task", "translation", "--dropout", "0.0"]
# a smaller lr than COMMON's: the translation search's EOS decisions (MAP outputs) make
# the loss piecewise, and at lr 0.5 a 1e-5 difference between the layouts after two
# updates can cross a boundary in the third (measured: 1.7e-2 apart at update 3)
SB = ["--soft-beam-size", "2", "--soft-beam-alpha", "1", "--soft-beam-alpha-schedule", "linear",
      "--soft-beam-alpha-final", "10", "--soft-beam-alpha-updates", "3", "--lr", "0.05"]
CRITERIA = {
    "mgs": ["--criterion", "mgs", "--mgs-candidates", "2", "--mgs-task-loss", "edit"],
    # alpha 1: at the default 0.005 (gradient eq. 7 / alpha) three SGD steps of lr 0.5 amplify the layouts' float
    # rounding into different beam candidates by update 3; alpha 1's sharp q keeps the steps small
    "mrt": ["--criterion", "mrt", "--mrt-decoder", "beam", "--mrt-candidates", "2", "--mrt-task-loss", "edit",
            "--mrt-include-reference", "--mrt-alpha", "1"],
    "pg": ["--criterion", "pg", "--pg-samples", "2", "--pg-task-loss", "edit", "--pg-baseline", "moving"],
    # soft-argmax: deterministic (soft-sample, the default, draws other noise on 1 and 2 workers)
    "differentiable_scheduled_sampling": ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule",
                                          "always", "--dss-warmup", "0", "--dss-schedule-unit", "update",
                                          "--dss-mode", "soft-argmax"],
    "soft_beam_direct_loss": ["--criterion", "soft_beam_direct_loss"] + SB,
    "soft_beam_hinge": ["--criterion", "soft_beam_hinge"] + SB,
    "self_normalized_ce": ["--criterion", "self_normalized_ce"],
    "residual_nce": ["--criterion", "residual_nce", "--residual-num-negatives", "2"],
}
SAMPLING = {"pg"}  # updates depend on the random stream, not only on the data
# logged keys that are timings or depend on the process layout, not on the method
UNLOGGED = {"epoch", "update", "wps", "ups", "train_wall", "wall", "gb_free", "lr", "loss_scale", "cost_seconds"}


@pytest.fixture(scope="module")
def mt(tmp_path_factory):
    """8-sentence toy translation data and a tiny transformer trained on it with MLE."""
    root = tmp_path_factory.mktemp("dist_mt")
    data = toy.binarize_translation(toy.write_toy_data(str(root / "raw"), sizes=(8, 8, 8), seed=1), str(root / "bin"))
    subprocess.run(["python", SCRIPT, data, *COMMON, *NO_VALID, *MT_MODEL, "--optimizer", "adam", "--lr", "0.01",
                    "--batch-size", "8", "--max-update", "40", "--save-dir", str(root / "mle")],
                   cwd=REPO, env=_env(), check=True, capture_output=True)
    return data, str(root / "mle" / "checkpoint_last.pt")


def _env(dump=None, c10d=False):
    env = cli_env(OMP_NUM_THREADS="1")
    env.pop("DUMP_DIR", None)
    if dump:
        env["DUMP_DIR"] = dump
    if c10d:
        env["C10D_ON_CPU"] = "1"
    return env


def _launch(out, args, world=1, backend=None):
    """Start one run (``world`` processes) writing dumps and logs under ``out``."""
    os.makedirs(out, exist_ok=True)
    procs = []
    for rank in range(world):
        dist = [] if world == 1 else [
            "--distributed-world-size", str(world), "--distributed-rank", str(rank), "--distributed-backend", "gloo",
            "--distributed-no-spawn", "--distributed-init-method", f"file://{out}/init", "--ddp-backend", backend]
        log = open(os.path.join(out, f"log{rank}"), "w")
        procs.append((subprocess.Popen(["python", SCRIPT, *args, *dist], cwd=REPO, stdout=log,
                                       stderr=subprocess.STDOUT, env=_env(out, backend == "c10d")), log))
    return procs


def _wait(procs):
    """Wait for a wave of runs; a process that exits non-zero fails the test with its own log."""
    for p, log in procs:
        p.wait(timeout=600)
        log.close()
    for p, log in procs:
        if p.returncode != 0:
            with open(log.name) as f:
                raise AssertionError(f"{log.name} failed (exit {p.returncode}):\n{f.read()[-4000:]}")


class Run:
    def __init__(self, out):
        self.out = out

    def params(self, update, rank=0):
        return torch.load(os.path.join(self.out, f"rank{rank}.update{update}.pt"))

    def ranks(self):
        return len(glob.glob(os.path.join(self.out, f"rank*.update{UPDATES}.pt")))

    def logs(self):
        """Rank 0's per-update training stats (fairseq's train_inner lines)."""
        with open(os.path.join(self.out, "log0")) as f:
            lines = [l for l in f if "train_inner" in l and "{" in l]
        return [json.loads(l[l.index("{"):]) for l in lines]


_CACHE = {}


@pytest.fixture(scope="module")
def runs(request, mt, tmp_path_factory):
    """``runs(criterion)``: that criterion's runs, made on first use (the residual
    LM fixtures only for residual_nce, so a test worker builds only what it runs)."""
    def get(criterion):
        if criterion not in _CACHE:
            _CACHE[criterion] = _run_all(criterion, tmp_path_factory.mktemp(criterion))
        return _CACHE[criterion]

    def _run_all(criterion, root):
        if criterion == "residual_nce":
            toy_lm_bin, base_lm, negatives = (request.getfixturevalue(name)
                                              for name in ("toy_lm_bin", "base_lm", "negatives"))
            base = [toy_lm_bin, *RESIDUAL_TASK[2:], "--residual-base-lm", base_lm, "--residual-negatives-dir",
                    negatives, "--arch", "residual_energy", "--energy-variant", "bit", "--encoder-layers", "1",
                    "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                    "--dropout", "0.0"]
            ref_batch = ["--batch-size", "4", "--update-freq", "2"]
        else:
            base = [mt[0], *MT_MODEL, "--finetune-from-model", mt[1]]
            # pg: 4 updates an epoch, so that the moving baseline has a history to resume (within the epoch)
            ref_batch = ["--batch-size", "2" if criterion == "pg" else "8"]
        args = base + COMMON + CRITERIA[criterion]
        out = {name: str(root / name) for name in ("ref", "uf2", "c10d", "legacy", "saved")}
        wave = _launch(out["ref"], args + NO_VALID + ref_batch + ["--max-update", str(UPDATES), "--no-save"])
        # mid-epoch checkpoints: 4 updates an epoch
        saving = args + SAVING + (ref_batch if criterion == "residual_nce" else ["--batch-size", "2"])
        wave += _launch(out["saved"], saving + ["--max-update", str(UPDATES), "--save-dir", out["saved"]])
        if criterion != "residual_nce":
            wave += _launch(out["uf2"], args + NO_VALID + ["--batch-size", "4", "--update-freq", "2", "--max-update",
                                                           str(UPDATES), "--no-save"])
        _wait(wave)
        resumed = str(root / "resumed")
        os.makedirs(resumed)
        shutil.copyfile(os.path.join(out["saved"], "checkpoint_1_1.pt"), os.path.join(resumed, "checkpoint_last.pt"))
        wave = _launch(resumed, saving + ["--max-update", str(UPDATES), "--save-dir", resumed])
        for backend in ("c10d", "legacy_ddp"):
            name = "c10d" if backend == "c10d" else "legacy"
            wave += _launch(out[name], args + NO_VALID + ["--batch-size", "4", "--max-update", str(UPDATES),
                                                          "--no-save"], world=2, backend=backend)
        _wait(wave)
        result = {name: Run(path) for name, path in out.items() if os.path.isdir(path)}
        result["resumed"] = Run(resumed)
        return result

    return get


def _max_diff(a, b):
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _assert_logs_close(got, ref):
    assert len(got) == len(ref) == UPDATES, (len(got), len(ref))
    for g, r in zip(got, ref):
        keys = (set(r) - UNLOGGED) & set(g)
        assert "loss" in keys and set(r) - UNLOGGED == set(g) - UNLOGGED, (sorted(r), sorted(g))
        for k in keys:
            assert math.isclose(float(g[k]), float(r[k]), rel_tol=2e-3, abs_tol=2e-3), (k, g[k], r[k])


@pytest.mark.parametrize("backend", ["c10d", "legacy"])
@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_ranks_hold_identical_parameters(criterion, backend, runs):
    run = runs(criterion)[backend]
    assert run.ranks() == 2
    for update in range(1, UPDATES + 1):
        p0, p1 = run.params(update, 0), run.params(update, 1)
        differing = [k for k in p0 if not torch.equal(p0[k], p1[k])]
        assert not differing, f"update {update}: ranks differ in {differing[:5]}"
    assert _max_diff(run.params(1), run.params(UPDATES)) > 1e-6, "the parameters did not move"


@pytest.mark.parametrize("backend", ["c10d", "legacy"])
@pytest.mark.parametrize("criterion", sorted(set(CRITERIA) - SAMPLING))
def test_two_processes_equal_one_on_the_union(criterion, backend, runs):
    r = runs(criterion)
    for update in range(1, UPDATES + 1):
        assert _max_diff(r[backend].params(update), r["ref"].params(update)) < TOL[update], update
    _assert_logs_close(r[backend].logs(), r["ref"].logs())


@pytest.mark.parametrize("criterion", sorted(set(CRITERIA) - SAMPLING - {"residual_nce"}))
def test_update_freq_two_equals_one_batch_of_twice_the_size(criterion, runs):
    r = runs(criterion)
    diff = _max_diff(r["uf2"].params(1), r["ref"].params(1))
    if criterion == "mgs":
        # MGS pools C(theta) and the candidate costs per micro-batch: two searches, not one
        assert diff > 1e-3
    else:
        assert diff < TOL[1]
        _assert_logs_close(r["uf2"].logs(), r["ref"].logs())


def _assert_same_updates(got, ref, updates):
    for update in updates:
        a, b = got.params(update), ref.params(update)
        differing = [k for k in b if not torch.equal(a[k], b[k])]
        assert not differing, f"update {update} differs in {differing[:5]}: {_max_diff(a, b)}"


def _train_logs(run):
    return [{k: v for k, v in log.items() if k not in UNLOGGED} for log in run.logs()]


@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_resumed_run_continues_exactly(criterion, runs):
    """Resumed mid-epoch from an update checkpoint, two more updates: both bitwise."""
    r = runs(criterion)
    resumed, ref = r["resumed"], r["saved"]
    dumps = sorted(f for f in os.listdir(resumed.out) if f.startswith("rank"))
    assert dumps == [f"rank0.update{u}.pt" for u in range(2, UPDATES + 1)]
    _assert_same_updates(resumed, ref, range(2, UPDATES + 1))
    logs = _train_logs(resumed)
    if criterion == "pg":
        assert float(logs[0]["baseline"]) > 0, "the moving baseline was not carried over the resume"
    assert logs == _train_logs(ref)[1:]
