"""Differentiable scheduled sampling (Goyal thesis 3.3): the relaxations, the
schedules, the soft-input mechanism on fairseq's transformer / lstm and our
tagging_lstm, the criterion's limit cases, and fairseq-train runs."""
import copy
import json
import math
import os

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from conftest import REPO, run_cli
from fairseq_ext.synthetic import tiny_models
from fairseq_ext.core.relaxations import decision_embedding, decision_weights, gumbel_noise, peaked_softmax
from fairseq_ext.core.schedules import exponential_growth, teacher_forcing_prob
from fairseq_ext.core.token_losses import label_smoothed_nll
from fairseq_ext.decoding.soft_inputs import EmbeddingOverride
from fairseq_ext.decoding.dss_passes import make_noise_fn, run_scheduled_sampling

ARCHS = ("transformer", "lstm", "tagging_lstm")

# ----------------------------------------------------------------- core: relaxations


def test_peaked_softmax_hand_values():
    s = torch.tensor([[0.0, math.log(2.0), float("-inf")]])
    assert torch.allclose(peaked_softmax(s, 1.0), torch.tensor([[1 / 3, 2 / 3, 0.0]]))
    assert torch.allclose(peaked_softmax(s, 2.0), torch.tensor([[1 / 5, 4 / 5, 0.0]]))
    # no overflow for huge alpha * scores
    big = torch.tensor([[1000.0, 999.0]])
    assert torch.allclose(peaked_softmax(big, 100.0), torch.tensor([[1.0, math.exp(-100.0)]]))


def test_peaked_softmax_all_forbidden_row_is_zero_and_keeps_gradients_finite():
    s = torch.tensor([[1.0, 2.0], [float("-inf"), float("-inf")]], requires_grad=True)
    w = peaked_softmax(s, 3.0)
    assert torch.equal(w[1], torch.zeros(2))
    (w * torch.tensor([[1.0, -1.0], [1.0, 1.0]])).sum().backward()
    assert torch.isfinite(s.grad).all()


def test_peaked_softmax_rejects_nonpositive_alpha():
    with pytest.raises(ValueError, match="alpha"):
        peaked_softmax(torch.zeros(1, 3), 0.0)


def test_soft_decisions_tend_to_hard_ones_as_alpha_grows():
    torch.manual_seed(0)
    scores = torch.randn(6, 11)
    noise = gumbel_noise(scores.shape, generator=torch.Generator().manual_seed(1))
    E = torch.randn(11, 4)
    for soft, hard in (("soft-argmax", "hard-argmax"), ("soft-sample", "hard-sample")):
        target = decision_weights(scores, hard, 1.0, noise)
        assert torch.equal(target.sum(-1), torch.ones(6)) and torch.equal(target.max(-1).values, torch.ones(6))
        gaps = [(decision_weights(scores, soft, a, noise) - target).abs().max().item() for a in (1, 10, 100, 1e4)]
        assert gaps == sorted(gaps, reverse=True) and gaps[0] > 0.1 and gaps[-1] < 1e-6
        embed_gap = (decision_embedding(scores, E, soft, 1e4, noise) - decision_embedding(scores, E, hard, 1.0, noise))
        assert embed_gap.abs().max() < 1e-5
    # the Gumbel-max trick: hard-sample draws from softmax(scores)
    s = torch.tensor([0.0, math.log(3.0)])
    draws = decision_weights(s.expand(20000, 2), "hard-sample", 1.0,
                             gumbel_noise((20000, 2), generator=torch.Generator().manual_seed(2)))
    assert abs(draws[:, 1].mean().item() - 0.75) < 0.015


def test_hard_decisions_have_no_gradient_to_scores():
    scores = torch.randn(3, 5, requires_grad=True)
    E = torch.randn(5, 2)
    assert not decision_embedding(scores, E, "hard-argmax", 1.0).requires_grad
    decision_embedding(scores, E, "soft-argmax", 1.0).sum().backward()
    assert scores.grad.abs().sum() > 0


# ----------------------------------------------------------------- core: schedules and loss


def test_teacher_forcing_schedules_equal_their_formulas():
    assert teacher_forcing_prob("inverse_sigmoid", 0.5, warmup=1, k=10) == 1.0
    for t in (0, 1, 7, 40):
        assert teacher_forcing_prob("inverse_sigmoid", 1 + t, warmup=1, k=10) == pytest.approx(10 / (10 + math.exp(t / 10)))
        assert teacher_forcing_prob("exponential", t, k=0.9) == pytest.approx(0.9 ** t)
        assert teacher_forcing_prob("linear", t, slope=0.1, min_eps=0.2) == pytest.approx(max(0.2, 1 - 0.1 * t))
        assert teacher_forcing_prob("always", t) == 0.0
    assert teacher_forcing_prob("inverse_sigmoid", 1e9, k=1) < 1e-300  # no overflow
    # gentler decay for larger k (thesis Table 3.2)
    assert teacher_forcing_prob("inverse_sigmoid", 5, k=100) > teacher_forcing_prob("inverse_sigmoid", 5, k=10) > \
        teacher_forcing_prob("inverse_sigmoid", 5, k=1)
    with pytest.raises(ValueError, match="k must be >= 1 for the inverse_sigmoid schedule, got 0.5"):
        teacher_forcing_prob("inverse_sigmoid", 0, k=0.5)
    with pytest.raises(ValueError, match=r"k must be in \(0, 1\) for the exponential schedule, got 2"):
        teacher_forcing_prob("exponential", 0, k=2)
    assert exponential_growth(2.0, 3.0, 2) == pytest.approx(18.0)
    assert exponential_growth(2.0, 3.0, -4) == 2.0 and exponential_growth(2.0, 3.0, 1e6, max_value=50) == 50


def test_label_smoothed_nll_matches_fairseq_and_ignores_forbidden_outputs():
    torch.manual_seed(0)
    lprobs = torch.log_softmax(torch.randn(7, 6), -1)
    target = torch.tensor([1, 2, 0, 5, 1, 3, 1])  # 1 = padding here
    ours = label_smoothed_nll(lprobs, target, 0.1, ignore_index=1)
    theirs = label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=1)
    assert torch.allclose(ours[0], theirs[0]) and torch.allclose(ours[1], theirs[1])
    # forbidding outputs: smoothing over the allowed ones only (hand-computed)
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.25, 0.0]]))
    loss, nll = label_smoothed_nll(lp, torch.tensor([0]), 0.2)
    eps_i = 0.2 / 2
    expected = (1 - 0.2 - eps_i) * math.log(2) + eps_i * (math.log(2) + 2 * math.log(4))
    assert nll.item() == pytest.approx(math.log(2)) and loss.item() == pytest.approx(expected)


# ----------------------------------------------------------------- models


@pytest.fixture(scope="module")
def models(toy_bin, conll, cache):
    """(model in eval mode, batch) per architecture."""
    out = {}
    for arch in ("transformer", "lstm"):
        task, model, _ = tiny_models.build_task_and_model(toy_bin, "translation", arch)
        out[arch] = (model.eval(), _batch(task, "valid"))
    task, model, _ = tiny_models.build_task_and_model(conll, "sequence_tagging", "tagging_lstm",
                                                      ["--tagging-cache-dir", cache])
    out["tagging_lstm"] = (model.eval(), _batch(task, "test"))
    return out


def _batch(task, split, n=8):
    task.load_dataset(split)
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(n)])


def _fed_everywhere(sample):
    prev = sample["net_input"]["prev_output_tokens"]
    fed = prev.ne(1)
    fed[:, 0] = False
    return fed


def _close_where_real(a, b, sample, atol=1e-5):
    """Equal at non-padding target positions (forbidden outputs: both -inf)."""
    keep = sample["target"].ne(1)
    a, b = a[keep], b[keep]
    assert torch.equal(torch.isinf(a), torch.isinf(b))
    finite = torch.isfinite(a)
    assert (a[finite] - b[finite]).abs().max().item() < atol


@pytest.mark.parametrize("arch", ARCHS)
def test_soft_one_hot_inputs_reproduce_token_inputs(models, arch):
    """Positions, padding masks and embedding scaling come out exactly as for
    token inputs: feeding one-hot soft embeddings of the gold tokens everywhere
    through the override gives the token forward's scores."""
    model, sample = models[arch]
    net = sample["net_input"]
    prev = net["prev_output_tokens"]
    emb = model.decoder.embed_tokens
    reference = model(**net)[0]
    soft = torch.nn.functional.one_hot(prev, emb.weight.size(0)).float() @ emb.weight
    encoder_out = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    with EmbeddingOverride(emb) as override:
        override.set(torch.ones_like(prev, dtype=torch.bool), soft)
        overridden = model.decoder(prev, encoder_out=encoder_out)[0]
        override.set(torch.ones_like(prev, dtype=torch.bool), torch.zeros_like(soft))
        zeroed = model.decoder(prev, encoder_out=encoder_out)[0]
    _close_where_real(overridden, reference, sample)
    finite = torch.isfinite(reference)
    assert (zeroed[finite] - reference[finite]).abs().max() > 1e-3  # the override is really used


@pytest.mark.parametrize("arch", ARCHS)
def test_eps_one_sequential_pass_equals_cross_entropy(models, arch):
    """With no model-fed position, the left-to-right pass through the incremental
    state gives the teacher-forced scores, and the criterion's loss equals fairseq's
    cross_entropy criterion on the same batch."""
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    from fairseq_ext.criterions.scheduled_sampling import DSSCriterion

    model, sample = models[arch]
    fed = torch.zeros_like(sample["net_input"]["prev_output_tokens"], dtype=torch.bool)
    sequential, steps = run_scheduled_sampling(model, sample["net_input"], fed, "soft-argmax", 1.0)
    assert len(steps) == fed.size(1)
    _close_where_real(sequential, model(**sample["net_input"])[0], sample)
    task = _Task(model)
    ce = CrossEntropyCriterion(task, sentence_avg=False)(model, sample)[0]
    dss = DSSCriterion(task)  # epoch 1: warm-up, eps = 1
    assert dss.schedule_values()[0] == 1.0
    assert torch.allclose(dss(model, sample)[0], ce)
    lprobs = model.get_normalized_probs((sequential, None), log_probs=True)
    seq_loss = label_smoothed_nll(lprobs.flatten(0, 1), sample["target"].flatten(), 0.0, 1)[0]
    assert torch.allclose(seq_loss, ce, rtol=1e-5)


class _Task:
    """The minimum a criterion needs from a task, with the clock hooks."""

    def __init__(self, model):
        self.target_dictionary = model.decoder.dictionary

    def begin_epoch(self, epoch, model):
        pass

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        return criterion(model, sample)


def _dss_loss(model, sample, fed, mode, alpha, passes=0, seed=3):
    gen = torch.Generator().manual_seed(seed)
    logits, steps = run_scheduled_sampling(model, sample["net_input"], fed, mode, alpha, passes,
                                           make_noise_fn(mode, gen))
    lprobs = model.get_normalized_probs((logits, None), log_probs=True)
    return label_smoothed_nll(lprobs.flatten(0, 1), sample["target"].flatten(), 0.0, 1)[0], steps


@pytest.mark.parametrize("arch", ARCHS)
def test_loss_tends_to_hard_scheduled_sampling_as_alpha_grows(models, arch):
    model, sample = models[arch]
    fed = _fed_everywhere(sample)
    for soft, hard in (("soft-argmax", "hard-argmax"), ("soft-sample", "hard-sample")):
        hard_loss = _dss_loss(model, sample, fed, hard, 1.0)[0].item()
        gaps = [abs(_dss_loss(model, sample, fed, soft, a)[0].item() - hard_loss) for a in (1.0, 1e5)]
        assert gaps[1] < 1e-3 * max(1.0, abs(hard_loss)) and gaps[0] > 10 * gaps[1], (soft, gaps)


@pytest.mark.parametrize("arch", ARCHS)
def test_credit_assignment_to_the_previous_step(models, arch):
    """d loss_t / d scores_{t-1}: non-zero through soft decisions, zero through hard ones."""
    model, sample = models[arch]
    fed = _fed_everywhere(sample)
    t = 2
    for mode in ("soft-argmax", "soft-sample", "hard-argmax", "hard-sample"):
        gen = torch.Generator().manual_seed(0)
        logits, steps = run_scheduled_sampling(model, sample["net_input"], fed, mode, 1.0, 0, make_noise_fn(mode, gen))
        lprobs = model.get_normalized_probs((logits, None), log_probs=True)
        loss_t = -lprobs[:, t].gather(-1, sample["target"][:, t : t + 1]).sum()
        grad = torch.autograd.grad(loss_t, steps[t - 1], allow_unused=True)[0]
        norm = 0.0 if grad is None else grad[torch.isfinite(grad)].abs().sum().item()
        if mode.startswith("soft"):
            assert norm > 1e-6, mode
        else:
            assert norm == 0.0, mode


@pytest.mark.parametrize("arch", ARCHS)
def test_parallel_passes_converge_to_the_sequential_pass(models, arch):
    """P parallel passes get positions 1..P-1 right, so P = T passes reproduce the
    exact left-to-right pass (deterministic modes). The decoder's weights are scaled
    up so that an untrained model's decisions depend on its inputs."""
    model, sample = models[arch]
    model = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.mul_(4.0)
    fed = _fed_everywhere(sample)
    T = fed.size(1)
    for mode in ("soft-argmax", "hard-argmax"):
        exact = _dss_loss(model, sample, fed, mode, 2.0)[0]
        two = _dss_loss(model, sample, fed, mode, 2.0, passes=2)[0]
        full = _dss_loss(model, sample, fed, mode, 2.0, passes=T)[0]
        assert torch.allclose(full, exact, rtol=1e-6, atol=0), mode
        assert (two - exact).abs() > 100 * (full - exact).abs(), (mode, two - exact, full - exact)


def test_criterion_schedule_follows_the_clock(models):
    from fairseq_ext.criterions.scheduled_sampling import DSSCriterion

    model, sample = models["lstm"]
    c = DSSCriterion(_Task(model), dss_decay_k=4.0, dss_alpha=2.0, dss_alpha_growth=3.0)
    c.task.begin_epoch(1, model)
    assert c.schedule_values() == (1.0, 2.0)
    c.task.begin_epoch(4, model)  # 3 epochs done, 1 of warm-up: t = 2
    eps, alpha = c.schedule_values()
    assert eps == pytest.approx(4 / (4 + math.exp(2 / 4))) and alpha == pytest.approx(18.0)
    u = DSSCriterion(_Task(model), dss_schedule="linear", dss_schedule_unit="update",
                                        dss_warmup=10, dss_decay_slope=0.01)
    u.task.train_step(sample, model.train(), u, None, update_num=30)
    model.eval()
    assert u.schedule_values()[0] == pytest.approx(0.8)
    for bad in (dict(dss_decay_k=0.5), dict(dss_passes=1), dict(dss_alpha=0.0),
                dict(dss_schedule="linear", dss_decay_slope=0.0)):
        with pytest.raises(ValueError, match="--dss-"):
            DSSCriterion(_Task(model), **bad)



# ----------------------------------------------------------------- independent re-implementations


class _FeedEmbeddings(torch.nn.Module):
    """Stands in for ``decoder.embed_tokens`` in the independent loops below: the
    token lookup, except at the rows of ``mask`` where ``soft`` (N, E) is returned.
    (A module swap, not the criterion's forward hook.)"""

    def __init__(self, embedding):
        super().__init__()
        self.inner = embedding
        self.mask, self.soft = None, None

    @property
    def weight(self):
        return self.inner.weight

    @property
    def padding_idx(self):
        return self.inner.padding_idx

    def forward(self, tokens):
        out = self.inner(tokens)
        if self.mask is None:
            return out
        assert out.size(1) == 1, "incremental decoding embeds one position at a time"
        return torch.where(self.mask.view(-1, 1, 1), self.soft.unsqueeze(1).to(out.dtype), out)


def _independent_loop(model, sample, fed, t_stop, feed, delta_at=None, delta=None):
    """Decode positions 0..t_stop one at a time through fairseq's incremental state;
    a model-fed position i gets ``feed(scores_{i-1})`` (tokens (N,) or soft
    embeddings (N, E)), with ``delta`` added to the scores of step ``delta_at``
    first. Returns the per-step scores (N, V) as a list."""
    net = sample["net_input"]
    decoder = model.decoder
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    prev = net["prev_output_tokens"].clone()
    original, swap = decoder.embed_tokens, _FeedEmbeddings(decoder.embed_tokens)
    decoder.embed_tokens = swap
    try:
        state, scores = {}, []
        for i in range(t_stop + 1):
            swap.mask = None
            if i > 0 and bool(fed[:, i].any()):
                s = scores[i - 1] + (delta if delta_at == i - 1 else 0)
                fed_input = feed(s)
                if fed_input.dim() == 1:  # tokens: written into the history itself
                    prev[:, i] = torch.where(fed[:, i], fed_input, prev[:, i])
                else:
                    swap.mask, swap.soft = fed[:, i], fed_input
            logits, _ = decoder(prev[:, : i + 1], encoder_out=enc, incremental_state=state)
            scores.append(logits[:, -1])
    finally:
        decoder.embed_tokens = original
    return scores


def _step_nll(scores_t, target_t, pad=1):
    lp = torch.log_softmax(scores_t, dim=-1).gather(-1, target_t.unsqueeze(-1)).squeeze(-1)
    return -(lp * target_t.ne(pad)).sum()


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
@pytest.mark.parametrize("mode", ["soft-argmax", "soft-sample"])
def test_credit_assignment_matches_float64_finite_differences(models, arch, mode, monkeypatch):
    """d loss_t / d scores_j for j = t-1, t-2, t-3 (autograd through the criterion's
    left-to-right pass) against central finite differences of an independent
    float64 loop through fairseq's incremental state, in a random direction.
    The decoder's weights are scaled up so that the soft decisions matter.

    fairseq's attention softmax runs in float32 whatever the input (utils.softmax),
    which leaves noise of the order of the derivative itself in float64 differences
    at h = 1e-5 (-0.48 against -1.09 on the transformer); it is switched to the
    input's dtype here. The LSTM's attention scores still make a
    float32 round trip (fairseq/models/lstm.py), hence h = 1e-4 and a relative
    tolerance of 1e-5 (measured: 4e-7 to 2e-6); a wrong path is off by tens of
    percent."""
    import fairseq.utils

    monkeypatch.setattr(fairseq.utils, "softmax", lambda x, dim, onnx_trace=False: torch.softmax(x, dim=dim))
    model, sample = models[arch]
    model = copy.deepcopy(model).double()
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.mul_(3.0)
    fed = _fed_everywhere(sample)
    t, alpha = 5, 1.5
    emb = model.decoder.embed_tokens.weight
    gen = torch.Generator().manual_seed(7)
    noise = [gumbel_noise((fed.size(0), emb.size(0)), generator=gen, dtype=torch.float64) for _ in range(fed.size(1))]
    if mode == "soft-argmax":
        noise = [torch.zeros_like(g) for g in noise]
    calls = iter(noise)
    logits, steps = run_scheduled_sampling(model, sample["net_input"], fed, mode, alpha, 0,
                                           (lambda s: next(calls)) if mode == "soft-sample" else None)
    target = sample["target"]
    loss_t = _step_nll(logits[:, t], target[:, t])

    def independent(delta_at=None, delta=None):
        used = iter(noise)  # one draw per decision, in the order the criterion takes them

        def feed(s):  # e-bar / e-tilde written out: softmax(alpha (s + G)) E
            return torch.softmax(alpha * (s + next(used)), dim=-1) @ emb
        return _step_nll(_independent_loop(model, sample, fed, t, feed, delta_at, delta)[t], target[:, t])

    assert independent().item() == pytest.approx(loss_t.item(), rel=1e-10)
    h = 1e-4
    for j in (t - 1, t - 2, t - 3):
        grad = torch.autograd.grad(loss_t, steps[j], retain_graph=True)[0]
        v = torch.randn(grad.shape, generator=torch.Generator().manual_seed(j), dtype=torch.float64)
        fd = (independent(j, h * v) - independent(j, -h * v)).item() / (2 * h)
        analytic = (grad * v).sum().item()
        assert abs(fd) > 1e-4, (j, fd)  # the earlier step really matters
        assert analytic == pytest.approx(fd, rel=1e-5, abs=1e-9), (j, analytic, fd)


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
@pytest.mark.parametrize("mode", ["hard-argmax", "hard-sample"])
def test_hard_scheduled_sampling_loss_matches_a_token_feeding_loop(models, arch, mode):
    """The hard modes' loss against an independent loop that writes the argmax
    token (of the scores, plus the same Gumbel noise for sampling) into the
    history and decodes it one step at a time with fairseq's incremental decoding:
    no embedding override anywhere. Half the positions model-fed at random."""
    model, sample = models[arch]
    model = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.mul_(4.0)
    coins = torch.rand(sample["target"].shape, generator=torch.Generator().manual_seed(1))
    fed = _fed_everywhere(sample) & (coins < 0.5)
    T = fed.size(1)
    gen = torch.Generator().manual_seed(11)
    noise = [gumbel_noise((fed.size(0), model.decoder.embed_tokens.weight.size(0)), generator=gen) for _ in range(T)]
    if mode == "hard-argmax":
        noise = [torch.zeros_like(g) for g in noise]
    calls = iter(noise)
    ours, _ = run_scheduled_sampling(model, sample["net_input"], fed, mode, 1.0, 0,
                                     (lambda s: next(calls)) if mode == "hard-sample" else None)
    used = iter(noise)
    loop = torch.stack(_independent_loop(model, sample, fed, T - 1, lambda s: (s + next(used)).argmax(-1)), dim=1)
    # float32 rounding: the static-cache step (transformer) and fairseq's incremental path
    # order their products differently; the scores reach 40 here (decoder weights x 4)
    _close_where_real(ours, loop, sample, atol=1e-5 * max(1.0, loop.abs().max().item()))
    target = sample["target"]
    loss = lambda scores: sum(_step_nll(scores[:, i], target[:, i]) for i in range(T))  # noqa: E731
    lprobs = model.get_normalized_probs((ours, None), log_probs=True)
    criterion_loss = label_smoothed_nll(lprobs.flatten(0, 1), target.flatten(), 0.0, 1)[0]
    assert criterion_loss.item() == pytest.approx(loss(loop).item(), rel=1e-5)
    teacher_forced = model(**sample["net_input"])[0]
    keep = target.ne(1)
    assert (loop - teacher_forced)[keep].abs().max() > 1e-2  # the fed tokens matter (1000x the tolerance)


# ----------------------------------------------------------------- through fairseq-train

COMMON = ["--criterion", "differentiable_scheduled_sampling", "--optimizer", "adam", "--lr", "0.005",
          "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "json", "--log-interval", "1000",
          "--no-progress-bar", "--seed", "1"]


def _train_logs(stdout):
    return [json.loads(line[line.index("{"):]) for line in stdout.splitlines()
            if "| train |" in line and "{" in line]


@pytest.mark.parametrize("arch", ARCHS)
def test_fairseq_train_runs(arch, toy_bin, conll, cache, tmp_path):
    if arch == "tagging_lstm":
        data = [conll, "--task", "sequence_tagging", "--tagging-cache-dir", cache, "--arch", "tagging_lstm_tiny",
                "--batch-size", "16"]
    else:
        data = [toy_bin, "--task", "translation"] + tiny_models.TINY_ARCHS[arch] + ["--max-tokens", "400"]
    proc = run_cli(["fairseq-train", *data, "--user-dir", os.path.join(REPO, "fairseq_ext"), *COMMON,
                    "--dss-mode", "soft-sample", "--dss-warmup", "1", "--dss-decay-k", "1",
                    "--dss-alpha", "2", "--dss-alpha-growth", "2", "--max-epoch", "3",
                    "--save-dir", str(tmp_path / "ck")])
    logs = _train_logs(proc.stdout)
    assert [int(log["epoch"]) for log in logs] == [1, 2, 3]
    assert [float(log["train_dss_eps"]) for log in logs] == pytest.approx([1.0, 0.5, 1 / (1 + math.e)], abs=1e-4)
    assert [float(log["train_dss_alpha"]) for log in logs] == pytest.approx([2.0, 2.0, 4.0])
    assert float(logs[0]["train_dss_fed"]) == 0.0 and float(logs[2]["train_dss_fed"]) > 0.3
    assert all(math.isfinite(float(log["train_loss"])) for log in logs)


def test_schedules_survive_resume(conll, cache, tmp_path):
    """Two epochs, stop, resume to four: the schedule values of epochs 3-4 equal an
    uninterrupted four-epoch run's (by update here; by epoch is covered above)."""
    base = [conll, "--user-dir", os.path.join(REPO, "fairseq_ext"), "--task", "sequence_tagging", "--tagging-cache-dir",
            cache, "--arch", "tagging_lstm_tiny", "--batch-size", "16", *COMMON, "--dss-schedule-unit", "update",
            "--dss-warmup", "5", "--dss-decay-k", "10", "--dss-alpha-growth", "1.1"]
    straight = _train_logs(run_cli(["fairseq-train", *base, "--max-epoch", "4",
                                    "--save-dir", str(tmp_path / "a")]).stdout)
    run_cli(["fairseq-train", *base, "--max-epoch", "2", "--save-dir", str(tmp_path / "b")])
    resumed = _train_logs(run_cli(["fairseq-train", *base, "--max-epoch", "4",
                                   "--save-dir", str(tmp_path / "b")]).stdout)
    assert [int(log["epoch"]) for log in resumed] == [3, 4]
    for key in ("train_dss_eps", "train_dss_alpha", "train_num_updates"):
        assert [log[key] for log in resumed] == [log[key] for log in straight[2:]], key
    assert float(straight[3]["train_dss_eps"]) < float(straight[1]["train_dss_eps"]) < 1.0


def test_epoch_schedule_follows_the_formula_across_a_resume(conll, cache, tmp_path):
    """Epochs 1-2, stop, resume to 5 (without the optimizer state, which fairseq
    needs to restore its update count; the epoch comes back regardless): the eps
    and alpha logged per epoch are the thesis's schedule written out by hand,
    eps = 1 in epoch 1, then 2 / (2 + exp(t / 2)) with t = epoch - 2, and alpha
    tripled per epoch after the first."""
    base = [conll, "--user-dir", os.path.join(REPO, "fairseq_ext"), "--task", "sequence_tagging", "--tagging-cache-dir",
            cache, "--arch", "tagging_lstm_tiny", "--batch-size", "16", *COMMON, "--dss-schedule-unit", "epoch",
            "--dss-warmup", "1", "--dss-decay-k", "2", "--dss-alpha", "1", "--dss-alpha-growth", "3",
            "--no-save-optimizer-state", "--save-dir", str(tmp_path / "ck")]
    first = _train_logs(run_cli(["fairseq-train", *base, "--max-epoch", "2"]).stdout)
    resumed = _train_logs(run_cli(["fairseq-train", *base, "--max-epoch", "5"]).stdout)
    logs = first + resumed
    assert [int(log["epoch"]) for log in logs] == [1, 2, 3, 4, 5]
    # 2 / (2 + exp(t / 2)), t = 0..3: 2/3, 2/3.648721, 2/4.718282, 2/6.481689
    assert [float(log["train_dss_eps"]) for log in logs] == pytest.approx(
        [1.0, 0.666667, 0.548137, 0.423883, 0.308562], abs=1e-4)
    assert [float(log["train_dss_alpha"]) for log in logs] == pytest.approx([1.0, 1.0, 3.0, 9.0, 27.0])


def test_warmup_in_updates_and_the_unfed_warning_on_an_epoch_longer_than_the_run(toy_bin, tmp_path):
    """An epoch of the toy pair at --max-tokens 20 is about 150 updates. With the default
    warm-up (one epoch) a 105-update run feeds nothing: one warning line at update 100 names
    --dss-warmup. Counted in updates (--dss-warmup 0 --dss-warmup-updates 3, eps 0 after it),
    the first 3 updates are teacher-forced and every later one is mixed; no warning."""
    data = [toy_bin, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"], "--max-tokens", "20",
            "--user-dir", os.path.join(REPO, "fairseq_ext"), *COMMON]
    proc = run_cli(["fairseq-train", *data, "--max-update", "105", "--save-dir", str(tmp_path / "a")])
    out = proc.stdout + proc.stderr
    warnings = [line for line in out.splitlines() if "no position was fed the model's decisions" in line]
    assert len(warnings) == 1, out[-3000:]
    assert ("in the 100 updates since update 0: the run is plain cross-entropy so far (eps is 1: --dss-warmup 1 "
            "epoch of teacher forcing, and the run is at epoch 1;") in warnings[0], warnings[0]
    assert float(_train_logs(proc.stdout)[-1]["train_dss_fed"]) == 0.0
    proc = run_cli(["fairseq-train", *data, "--max-update", "6", "--log-interval", "1", "--dss-warmup", "0",
                    "--dss-warmup-updates", "3", "--dss-schedule", "always", "--save-dir", str(tmp_path / "b")])
    inner = [json.loads(line[line.index("{"):]) for line in proc.stdout.splitlines() if "| train_inner |" in line]
    assert [float(log["dss_eps"]) for log in inner] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert [float(log["dss_fed"]) > 0 for log in inner] == [False] * 3 + [True] * 3
    assert "no position was fed" not in proc.stdout + proc.stderr


def test_passes_gap_script_is_exact_at_the_limit_and_not_below(toy_bin, tmp_path):
    """scripts/inspect/dss_passes_gap.py (docs/dss.md, "When --dss-passes P is safe") on a
    briefly trained transformer: with P at least the target length the P-pass
    loss and gradient are the exact pass's (gap 0, cosine 1); at eps 0 two passes
    differ from it (a gap the script must see)."""
    save = tmp_path / "ck"
    run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *tiny_models.TINY_ARCHS["transformer"],
             "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "500", "--max-update", "20", "--num-workers", "0",
             "--seed", "1", "--disable-validation", "--no-epoch-checkpoints", "--save-dir", str(save)])
    out = tmp_path / "gap.json"
    run_cli(["python", "scripts/inspect/dss_passes_gap.py", str(save / "checkpoint_last.pt"), toy_bin, "--sentences", "8",
             "--eps", "0", "--passes", "2,64", "--json", str(out)])
    rows = {(r["mode"], r["passes"]): r for r in json.loads(out.read_text())}
    for mode in ("soft-argmax", "hard-argmax"):
        assert abs(rows[mode, 64]["loss_gap"]) < 1e-5 and rows[mode, 64]["grad_cosine"] > 1 - 1e-5
        assert rows[mode, 64]["argmax_differs"] == 0.0
    assert max(abs(rows[m, 2]["loss_gap"]) for m in ("soft-argmax", "hard-argmax")) > 1e-3, rows
