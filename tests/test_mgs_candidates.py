"""MGS: theta and its K perturbations decoded together (``--mgs-candidate-evaluation
batched``) against one at a time, the parameters perturbed in place (``sequential``, the
reference): the same costs, weights and update."""
import logging

import pytest
import torch

from fairseq_ext.synthetic import tiny_models


def _criterion(data, task_name, arch, mode, extra=()):
    options = ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-candidates", "4", "--mgs-noise", "30",
               "--mgs-candidate-evaluation", mode] + list(extra)
    if task_name == "text_completion":
        options += ["--completion-context-size", "3"]
    task, model, args = tiny_models.build_task_and_model(data, task_name, arch, options, seed=3)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    return task.build_criterion(args), model.train(), ds.collater([ds[i] for i in range(8)])


def _update(crit, model, sample):
    torch.manual_seed(0)  # the MLE gradient's dropout
    model.zero_grad(set_to_none=True)
    loss, _, log = crit(model, sample)
    loss.backward()
    return log, [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("which,decoder", [("transformer", "greedy"), ("transformer_lm", "greedy"),
                                           ("transformer", "sample")])
def test_candidates_decoded_together_equal_one_at_a_time(toy_bin, toy_lm_bin, which, decoder):
    data, task_name = (toy_bin, "translation") if which == "transformer" else (toy_lm_bin, "text_completion")
    extra = ["--mgs-decoder", decoder]
    batched, model, sample = _criterion(data, task_name, which, "batched", extra)
    sequential, model_s, _ = _criterion(data, task_name, which, "sequential", extra)
    model_s.load_state_dict(model.state_dict())
    for _ in range(2):  # the second update reuses the stacked buffer
        log_b, grad_b = _update(batched, model, sample)
        log_s, grad_s = _update(sequential, model_s, sample)
        assert batched.batched and not sequential.batched
        for key in ("loss", "mgs_cand_mean", "mgs_cand_best", "mgs_weight_entropy", "mgs_mle_weight",
                    "mgs_cand_norm", "mgs_direction_norm", "mgs_logq_std"):
            assert log_b[key] == pytest.approx(log_s[key], rel=1e-6, abs=1e-9), key
        assert log_s["mgs_weight_std"] > 0  # the candidates' costs differ: the weights are not uniform
        flat_b, flat_s = torch.cat([g.view(-1) for g in grad_b]), torch.cat([g.view(-1) for g in grad_s])
        assert (flat_b - flat_s).abs().max().item() <= 1e-6 * flat_s.abs().max().item()
        with torch.no_grad():  # one optimiser step on both: the next update starts elsewhere
            for p, q, g in zip(model.parameters(), model_s.parameters(), grad_b):
                p.sub_(0.1 * g)
                q.sub_(0.1 * g)


def test_candidates_decoded_one_at_a_time_where_they_cannot_be_together(toy_bin, caplog):
    crit, model, sample = _criterion(toy_bin, "translation", "transformer", "batched", ["--mgs-decoder", "beam"])
    with caplog.at_level(logging.INFO):
        _update(crit, model, sample)
        _update(crit, model, sample)
    lines = [r.getMessage() for r in caplog.records if "one at a time" in r.getMessage()]
    assert lines == ["mgs: candidates decoded one at a time (--mgs-candidate-evaluation batched: beam decoding "
                     "(parameter sets are decoded together greedily or by sampling))"]
    assert not crit.batched
