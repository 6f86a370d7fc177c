"""PG's moving baseline through fairseq-train: it continues over epoch boundaries
within a run (no restart at 0), and a run resumed from a checkpoint taken at an
epoch boundary or within an epoch continues it exactly (fairseq_ext.runtime.checkpoints.
Trainer.save_checkpoint / load_checkpoint), on 8 toy sentences at 2 updates an epoch."""
import json
import os

import pytest
from fairseq.dataclass.configs import DatasetConfig

from conftest import run_cli
from fairseq_ext.synthetic import tiny_models, toy

UPDATES = 5  # epochs 1 (updates 1-2), 2 (3-4), 3 (5)
DECAY = 0.5
COMMON = ["--user-dir", "fairseq_ext", "--seed", "1", "--num-workers", "0", "--cpu", "--log-format", "json",
          "--log-interval", "1", "--disable-validation", "--no-epoch-checkpoints", "--required-batch-size-multiple",
          "1"] + tiny_models.TINY_ARCHS["transformer"] + ["--task", "translation", "--dropout", "0.0"]
# resumed runs see the uninterrupted run's batches only if every epoch builds its own iterator (docs/distributed.md)
if "update_epoch_batch_itr" in DatasetConfig.__dataclass_fields__:
    COMMON += ["--update-epoch-batch-itr", "True"]
PG = ["--criterion", "pg", "--pg-task-loss", "edit", "--pg-samples", "2", "--pg-baseline", "moving",
      "--pg-baseline-decay", str(DECAY), "--optimizer", "adam", "--lr", "0.003", "--batch-size", "4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: per-update train logs}: ``ref`` uninterrupted for UPDATES updates; ``boundary``
    and ``mid`` stopped after 2 (end of epoch 1) and 3 updates, then relaunched to UPDATES."""
    root = tmp_path_factory.mktemp("pg_baseline")
    data = toy.binarize_translation(toy.write_toy_data(str(root / "raw"), sizes=(8, 8, 8), seed=1), str(root / "bin"))
    run_cli(["fairseq-train", data, *COMMON, "--optimizer", "adam", "--lr", "0.01", "--batch-size", "8",
             "--max-update", "40", "--save-dir", str(root / "mle")])
    start = ["--finetune-from-model", str(root / "mle" / "checkpoint_last.pt")]

    def train(name, updates):
        out = run_cli(["fairseq-train", data, *COMMON, *PG, *start, "--max-update", str(updates),
                       "--save-dir", str(root / name)], env={"OMP_NUM_THREADS": "1"})
        return [json.loads(line[line.index("{"):]) for line in (out.stdout + out.stderr).splitlines()
                if "train_inner" in line and "{" in line]

    logs = {"ref": train("ref", UPDATES)}
    for name, stop in (("boundary", 2), ("mid", 3)):
        first = train(name, stop)
        assert os.path.isfile(root / name / "checkpoint_last.pt")
        logs[name] = first + train(name, UPDATES)
    return logs


def test_baseline_continues_over_epoch_boundaries(runs):
    """b_1 = the first batch's mean cost (no history); b_(u+1) = DECAY b_u + (1 - DECAY)
    cost_u at every update, the first of epochs 2 and 3 included (the old baseline
    restarted at 0 there). Logged values are rounded to 4 decimals."""
    log = runs["ref"]
    assert [int(r["epoch"]) for r in log] == [1, 1, 2, 2, 3]
    b = [float(r["baseline"]) for r in log]
    c = [float(r["cost_mean"]) for r in log]
    assert b[0] == pytest.approx(c[0], abs=2e-4)
    for u in range(1, UPDATES):
        assert b[u] == pytest.approx(DECAY * b[u - 1] + (1 - DECAY) * c[u - 1], abs=3e-4), (u, b, c)
    assert min(b) > 0.05


@pytest.mark.parametrize("name", ["boundary", "mid"])
def test_resumed_run_continues_the_baseline(runs, name):
    """Resumed at an epoch boundary (update 2) or within an epoch (update 3): every
    logged value of every update equals the uninterrupted run's."""
    keys = ("baseline", "cost_mean", "loss", "nll")
    got, want = runs[name], runs["ref"]
    assert len(got) == len(want) == UPDATES
    for g, w in zip(got, want):
        assert {k: g[k] for k in keys} == {k: w[k] for k in keys}, (g, w)
