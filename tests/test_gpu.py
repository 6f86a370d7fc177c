"""CUDA-only checks (skipped without a GPU; see docs/distributed.md): mixed
precision (``--fp16``, ``--memory-efficient-fp16``, ``--amp``) for MGS, DSS and the
soft beam criterion through fairseq-train, MGS's update independent of the loss
scale, and MGS's bitwise restoration of half-precision parameters."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, cli_env
from fairseq_ext import toy
from fairseq_ext.core.mgs import ParameterSearch, ProposalConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SCRIPT = os.path.join(REPO, "tests", "dist_train.py")  # fairseq-train that dumps parameters per update
CRITERIA = {
    "mgs": ["--criterion", "mgs", "--mgs-candidates", "2", "--mgs-task-loss", "edit"],
    "differentiable_scheduled_sampling": ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule",
                                          "always", "--dss-warmup", "0", "--dss-mode", "soft-sample"],
    "soft_beam_direct_loss": ["--criterion", "soft_beam_direct_loss", "--soft-beam-size", "3"],
}
PRECISIONS = {"fp16": ["--fp16"], "memory-efficient-fp16": ["--memory-efficient-fp16"], "amp": ["--amp"]}


def _train(data, out, extra):
    os.makedirs(out, exist_ok=True)
    env = cli_env(DUMP_DIR=str(out))
    proc = subprocess.run([sys.executable, SCRIPT, data, "--user-dir", os.path.join(REPO, "fairseq_ext"),
                           "--task", "translation", *toy.TINY_ARCHS["transformer"], "--optimizer", "adam",
                           "--lr", "0.003", "--max-tokens", "400", "--max-update", "6", "--seed", "1",
                           "--num-workers", "0", "--no-save", "--disable-validation", "--log-format", "json",
                           "--log-interval", "1", *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads(l[l.index("{"):]) for l in proc.stdout.splitlines() + proc.stderr.splitlines()
            if "train_inner" in l and "{" in l]


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_mixed_precision_training_stays_finite(criterion, precision, toy_bin, tmp_path):
    logs = _train(toy_bin, tmp_path, CRITERIA[criterion] + PRECISIONS[precision])
    assert len(logs) == 6
    assert all(math.isfinite(float(log["loss"])) for log in logs)
    last = torch.load(tmp_path / "rank0.update6.pt")
    assert all(torch.isfinite(v.float()).all() for v in last.values() if v.is_floating_point())


@pytest.mark.parametrize("precision", ["fp16", "amp"])
def test_mgs_update_does_not_depend_on_the_loss_scale(precision, toy_bin, tmp_path):
    """The MGS direction is handed to fairseq as a gradient, which fairseq scales and
    unscales by a power of two: the updates must be bitwise the same for any scale."""
    prefix = "--fp16" if precision == "fp16" else "--amp"
    for scale in ("4", "1024"):
        _train(toy_bin, tmp_path / scale, CRITERIA["mgs"] + PRECISIONS[precision]
               + [f"{prefix}-init-scale", scale, f"{prefix}-scale-window", "1000"])
    for update in range(1, 7):
        a, b = (torch.load(tmp_path / s / f"rank0.update{update}.pt") for s in ("4", "1024"))
        assert all(torch.equal(a[k], b[k]) for k in a), f"update {update} depends on the loss scale"


def test_mgs_restores_half_precision_cuda_parameters_bitwise():
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(64, 32, generator=gen).cuda().half(), torch.randn(32, generator=gen).cuda().half()]
    grads = [torch.randn_like(p, dtype=torch.float32) * 1e-3 for p in params]
    before = [p.clone() for p in params]
    search = ParameterSearch(params, grads, ProposalConfig(num_candidates=3, noise=1.0), seed=7)
    for k in range(3):
        with search.perturbed(k):
            assert any(not torch.equal(p, b) for p, b in zip(params, before))
        assert all(torch.equal(p, b) for p, b in zip(params, before))
