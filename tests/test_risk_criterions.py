"""mrt / pg criterions in-process on the tiny toy model: the reference joins MRT's
candidate set, MRT's loss is the eq. 6 risk of what it logs, the self-critical PG
baseline is the greedy decode's cost, gradients are finite."""
import torch

from fairseq_ext import toy
from fairseq_ext.generators.candidates import DecodeConfig


def _crit(toy_bin, extra):
    task, model, args = toy.build_task_and_model(toy_bin, "translation", "transformer", extra, seed=2)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    return task, model, task.build_criterion(args), sample


def test_mrt_with_reference_and_normalisations(toy_bin):
    task, model, crit, sample = _crit(toy_bin, ["--criterion", "mrt", "--mrt-task-loss", "edit", "--mrt-candidates", "3",
                                                "--mrt-include-reference", "--mrt-length-normalize",
                                                "--mrt-normalize-costs", "--mrt-mle-weight", "0.5"])
    model.train()
    cand, batch = crit.scorer.decode(model, sample, crit.decode_cfg)
    hyps, index = crit.candidate_set(model, cand, batch)
    assert len(hyps) == 6 * 4 and index.tolist() == [i for i in range(6) for _ in range(4)]
    refs = crit.scorer.references(batch)
    assert all(torch.equal(hyps[4 * i + 3], refs[i]) for i in range(6))
    loss, sample_size, log = crit(model, sample)
    assert sample_size == 6 and torch.isfinite(loss)
    assert abs(log["loss"] - (log["risk"] + 0.5 * log["nll"])) < 1e-3
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_pg_greedy_baseline_is_the_greedy_cost(toy_bin):
    task, model, crit, sample = _crit(toy_bin, ["--criterion", "pg", "--pg-task-loss", "edit", "--pg-samples", "2",
                                                "--pg-baseline", "greedy"])
    model.train()
    loss, _, log = crit(model, sample)
    cand, batch = crit.scorer.decode(model, sample, DecodeConfig(max_len_ref_ratio=1.3))
    greedy_costs, _ = crit.scorer.score(cand.as_list(), cand.source_index, batch)
    assert abs(log["baseline"] - float(greedy_costs.sum())) < 1e-5
    loss.backward()
