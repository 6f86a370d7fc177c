"""MGS under data parallelism on CPU (gloo): two processes each get half of a batch.
The pooled task loss equals the single-process value on the whole batch, the MLE
gradient is the whole-batch gradient, and the update direction is bitwise the same
on both ranks. Also a two-process fairseq-train run (gloo, --distributed-no-spawn)."""
import os
import subprocess

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import REPO, cli_env
from fairseq_ext.synthetic import tiny_models

TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--criterion", "mgs", "--mgs-task-loss", "edit",
        "--mgs-candidates", "3", "--dropout", "0.0"]


def _step(data_dir, sample_ids, result_file, rank=None, world=None, init_file=None):
    """One MGS criterion step on ``sample_ids``; saves C(theta), the MLE gradient and -Delta."""
    torch.set_num_threads(1)
    if world:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    task, model, args = tiny_models.build_task_and_model(data_dir, "translation", "transformer", TINY, seed=3)
    crit = task.build_criterion(args)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in sample_ids])
    model.train()
    params, grads, _, _ = crit._mle_gradient(model, sample)
    loss, _, log = crit(model, sample)
    loss.backward()
    torch.save({"c0": log["loss"], "mle_grad": grads, "grad": [p.grad.clone() for p in params],
                "cands": log["mgs_cand_mean"]}, result_file)
    if world:
        dist.destroy_process_group()


def _rank_main(rank, data_dir, halves, out_dir, init_file):
    _step(data_dir, halves[rank], os.path.join(out_dir, f"rank{rank}.pt"), rank, 2, init_file)


def test_two_ranks_match_one_process_on_the_union(toy_bin, tmp_path):
    ids = list(range(16))
    halves = [ids[:8], ids[8:]]
    _step(toy_bin, ids, str(tmp_path / "single.pt"))
    mp.spawn(_rank_main, args=(toy_bin, halves, str(tmp_path), str(tmp_path / "init")), nprocs=2, join=True)
    single = torch.load(tmp_path / "single.pt")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["c0"] == r1["c0"] and r0["c0"] == pytest.approx(single["c0"], abs=1e-6)
    assert r0["cands"] == pytest.approx(r1["cands"], abs=0) and r0["cands"] == pytest.approx(single["cands"], abs=1e-6)
    for a, b, s in zip(r0["mle_grad"], r1["mle_grad"], single["mle_grad"]):
        assert torch.equal(a, b)
        assert torch.allclose(a, s, atol=1e-6, rtol=1e-4)
    for a, b in zip(r0["grad"], r1["grad"]):
        assert torch.equal(a, b), "the update direction must be bitwise identical on all ranks"


def test_two_process_fairseq_train(toy_bin, tmp_path):
    """fairseq-train with two CPU processes (gloo, legacy DDP): runs to the end; fairseq
    itself checks every update that the gradient norms agree across ranks."""
    save = tmp_path / "ck"
    mle = tmp_path / "mle"
    common = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
              "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--seed", "1", "--num-workers", "0",
              "--no-epoch-checkpoints", "--log-format", "simple", "--optimizer", "adam", "--lr", "0.003",
              "--max-tokens", "1000"]
    env = cli_env(OMP_NUM_THREADS="1")
    subprocess.run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--max-update", "5", "--save-dir", str(mle)]
                   + common, cwd=REPO, env=env, check=True, capture_output=True)
    procs = [
        subprocess.Popen(
            ["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--max-update", "3", "--save-dir", str(save),
             "--restore-file", str(mle / "checkpoint_last.pt"), "--reset-optimizer", "--reset-dataloader",
             "--reset-meters", "--log-interval", "1", "--criterion", "mgs", "--mgs-task-loss", "edit",
             "--cpu", "--distributed-backend", "gloo", "--distributed-world-size", "2",
             "--distributed-init-method", f"file://{tmp_path / 'init'}", "--distributed-rank", str(r),
             "--distributed-no-spawn", "--ddp-backend", "no_c10d"] + common,
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out[-3000:]}"
    assert "num_updates 3" in outs[0] or "num_updates=3" in outs[0]
    assert (save / "checkpoint_last.pt").exists()
