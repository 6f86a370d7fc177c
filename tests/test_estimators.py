"""The sequence-level criteria move the parameters the right way, in-process on tiny
toy models (the fairseq adapters, not only core/):

- MRT and PG lower the expected task loss of a fixed batch, whose optimum is known
  (each reference has cost 0), faster than a control that sees the same samples
  with their costs shuffled within each input (same noise, no signal); a wrong
  sign or costs paired with the wrong samples fail it;
- with peaked weights, an MGS step lands on the best candidate;
- one MGS update with an SGD optimizer moves theta by +lr * Delta: with one MLE
  candidate and vanishing noise, Delta is minus the per-token NLL gradient
  (computed here with torch's cross-entropy), clipped to --mgs-direction-clip;
- candidates are decoded without dropout, whatever the model's training mode.
"""
import pytest
import torch
import torch.nn.functional as F

from fairseq_ext.synthetic import tiny_models
from fairseq_ext.decoding import candidates
from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates
from fairseq_ext.costs.batch_scorer import BatchScorer


def _build(toy_bin, criterion_args, seed=1, dropout="0.1"):
    task, model, args = tiny_models.build_task_and_model(toy_bin, "translation", "transformer",
                                                 criterion_args + ["--dropout", dropout], seed=seed)
    task.load_dataset("train")
    return task, model, task.build_criterion(args)


def _batch(task, n=8):
    ds = task.dataset("train")
    return ds.collater([ds[i] for i in range(n)])


def _token_nll(model, task, sample):
    """Mean NLL over the batch's target tokens (what fairseq's cross_entropy minimises)."""
    lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
    return F.nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1),
                      ignore_index=task.target_dictionary.pad())


def _pretrain(model, task, steps=60, seed=1):
    """A few MLE steps, so that sampled outputs have varied costs."""
    ds = task.dataset("train")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        batch = ds.collater([ds[i] for i in torch.randint(len(ds), (32,), generator=g).tolist()])
        opt.zero_grad()
        _token_nll(model, task, batch).backward()
        opt.step()


def _expected_edit(model, task, sample, m=64):
    """Monte Carlo E_p[edit] of the batch: m samples per input, fixed random numbers."""
    was_training = model.training
    cand = decode_candidates(model, sample, DecodeConfig(strategy="sample", num_candidates=m, max_len_ref_ratio=1.3),
                             generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        costs, _ = BatchScorer(task, "edit").score(cand.as_list(), cand.source_index, sample)
    model.train(was_training)
    return float(costs.mean())


def _shuffle_costs(crit, seed):
    """The control: the batch's candidate costs permuted at random over all inputs and
    candidates, so the estimator sees the same samples and cost values but no pairing
    between them (a permutation within each input would leave a moving baseline the
    inputs' mean costs to learn from)."""
    score, gen = crit.scorer.score, torch.Generator().manual_seed(seed)

    def shuffled(hyps, index, batch):
        costs, per_name = score(hyps, index, batch)
        return costs[torch.randperm(costs.numel(), generator=gen)], per_name

    crit.scorer.score = shuffled


def _fine_tune(toy_bin, criterion_args, control, steps=20):
    task, model, crit = _build(toy_bin, criterion_args)
    _pretrain(model, task)
    sample = _batch(task)
    before = _expected_edit(model, task, sample)
    if control:
        _shuffle_costs(crit, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    torch.manual_seed(1)
    for _ in range(steps):
        loss, sample_size, _ = crit(model, sample)
        opt.zero_grad()
        (loss / sample_size).backward()
        opt.step()
    return before, _expected_edit(model, task, sample)


@pytest.mark.parametrize("criterion_args", [
    ["--criterion", "mrt", "--mrt-task-loss", "edit", "--mrt-mle-weight", "0"],
    ["--criterion", "pg", "--pg-task-loss", "edit", "--pg-mle-weight", "0"],
    ["--criterion", "pg", "--pg-task-loss", "edit", "--pg-mle-weight", "0", "--pg-baseline", "moving"],
], ids=["mrt", "pg_loo", "pg_moving"])
def test_lowers_expected_cost_faster_than_shuffled_costs(toy_bin, criterion_args):
    """20 Adam steps (lr 0.003) on 8 training sources after 60 MLE steps, no MLE term.
    Measured mean E[edit] over seeds 1-5, before -> after (method / shuffled control):
    MRT 0.766 -> 0.583 / 0.825; PG loo 0.766 -> 0.614 / 0.840; PG moving 0.766 ->
    0.609 / 0.794; in every seed the method ends at least 0.10 below its start and
    0.10 below its control. With the estimator's sign reversed E[edit] rises to about
    0.99 in 10 steps."""
    before, after = _fine_tune(toy_bin, criterion_args, control=False)
    _, control = _fine_tune(toy_bin, criterion_args, control=True)
    print(f"{criterion_args[1]}: E[edit] {before:.3f} -> {after:.3f}, shuffled-cost control {control:.3f}")
    assert after < before - 0.05, (before, after)
    assert after < control - 0.05, (after, control)


def _greedy_edit(model, task, sample):
    cand = decode_candidates(model, sample, DecodeConfig(max_len_ref_ratio=1.3))
    with torch.no_grad():
        return float(BatchScorer(task, "edit").score(cand.as_list(), cand.source_index, sample)[0].mean())


def test_mgs_step_with_peaked_weights_lands_on_the_best_candidate(toy_bin):
    """alpha = 1e6 puts all the weight on the lowest-cost candidate, so one SGD step of
    lr 1 (direction clip off) moves theta to theta + Delta_best, bitwise as the search
    perturbed it: the new C(theta) is the logged best candidate cost, below the
    start. A wrong sign, or weights that favour another candidate, land elsewhere."""
    task, model, crit = _build(toy_bin, ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-alpha", "1e6",
                                         "--mgs-importance", "none", "--mgs-candidates", "4",
                                         "--mgs-direction-clip", "0"])
    _pretrain(model, task)
    sample = _batch(task, 48)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1.0)
    loss, sample_size, log = crit(model, sample)
    opt.zero_grad()
    (loss / sample_size).backward()
    opt.step()
    assert log["mgs_weight_entropy"] < 1e-9  # one candidate has all the weight
    print(f"C(theta) {log['loss']:.4f}, candidates mean {log['mgs_cand_mean']:.4f}, best {log['mgs_cand_best']:.4f}")
    assert log["mgs_cand_best"] < log["loss"] - 0.01
    assert _greedy_edit(model, task, sample) == pytest.approx(log["mgs_cand_best"], abs=1e-6)


@pytest.mark.parametrize("direction_clip", [0.0, 0.1])
def test_mgs_sgd_step_moves_theta_by_lr_delta(toy_bin, direction_clip):
    """One MLE-component candidate, noise 1e-9: Delta = -g, the per-token NLL gradient,
    so an SGD step on the criterion's loss is theta + lr * Delta = theta - lr * g,
    scaled to norm lr * clip when ||g|| exceeds the clip (0: no clipping)."""
    args = ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-candidates", "1", "--mgs-proposal", "mle",
            "--mgs-noise-scale", "absolute", "--mgs-noise", "1e-9", "--mgs-mle-clip", "0",
            "--mgs-direction-clip", str(direction_clip)]
    task, model, crit = _build(toy_bin, args, dropout="0.0")
    sample = _batch(task)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.autograd.grad(_token_nll(model, task, sample), params)
    g_norm = float(torch.sqrt(sum((x ** 2).sum() for x in g)))
    scale = min(1.0, direction_clip / g_norm) if direction_clip > 0 else 1.0
    assert direction_clip == 0 or g_norm > 2 * direction_clip  # the clip binds
    before = [p.detach().clone() for p in params]
    lr = 0.5
    opt = torch.optim.SGD(params, lr=lr)
    loss, sample_size, log = crit(model, sample)
    opt.zero_grad()
    (loss / sample_size).backward()
    opt.step()
    assert log["mgs_direction_norm"] == pytest.approx(g_norm, rel=1e-4)
    for p, b, gi in zip(params, before, g):
        assert torch.allclose(p.detach() - b, -lr * scale * gi, atol=1e-6), float((p.detach() - b + lr * scale * gi).abs().max())


def test_candidates_are_decoded_without_dropout(toy_bin):
    """Dropout 0.9 and the model in training mode: MGS's C(theta) is the cost of the
    eval-mode greedy decode, and MRT's sampled candidates are the eval-mode samples
    (same random numbers); a train-mode decode gives other outputs."""
    task, model, mgs = _build(toy_bin, ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-candidates", "1"],
                              dropout="0.9")
    _pretrain(model, task)
    sample = _batch(task)
    greedy = DecodeConfig(max_len_ref_ratio=1.3)
    scorer = BatchScorer(task, "edit")

    def mean_cost(hyps):
        with torch.no_grad():
            return float(scorer.score(hyps.as_list(), hyps.source_index, sample)[0].mean())

    def eval_mode_cost(cfg, seed=0):
        torch.manual_seed(seed)
        model.eval()
        return mean_cost(decode_candidates(model, sample, cfg))

    model.train()
    _, _, log = mgs(model, sample)
    assert log["loss"] == pytest.approx(eval_mode_cost(greedy), abs=1e-6)

    mrt = _build(toy_bin, ["--criterion", "mrt", "--mrt-task-loss", "edit", "--mrt-mle-weight", "0"],
                 dropout="0.9")[2]
    model.train()
    torch.manual_seed(3)
    _, _, log = mrt(model, sample)
    assert log["cost_mean"] / log["nsentences"] == pytest.approx(eval_mode_cost(mrt.decode_cfg, seed=3), abs=1e-6)

    # the check can fail: greedy decoding with dropout on (the decode loop called in train mode, fairseq's
    # decoder as its step) gives other outputs
    model.train()
    with torch.no_grad():
        torch.manual_seed(0)
        fairseq_greedy = DecodeConfig(max_len_ref_ratio=1.3, path="fairseq")
        with_dropout = candidates._greedy_or_sample(model, sample, fairseq_greedy, None, None).as_list()
        model.eval()
        without = decode_candidates(model, sample, greedy).as_list()
    assert [r.tolist() for r in with_dropout] != [r.tolist() for r in without]
