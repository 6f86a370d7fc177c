"""Exposure bias where it must show: on running sums mod m
(``fairseq_ext/synthetic/running_sums.py``) a tiny LSTM trained by teacher forcing loses
accuracy at late positions when it decodes from its own outputs, and
differentiable scheduled sampling (soft-sample, the thesis's epoch schedule),
trained briefly through ``fairseq-train`` with the same budget, must remove much
of that compounding (pooled over three seeds). Plus hand-checked data and scorer."""
import os
import random

import pytest
import torch

from conftest import REPO, run_cli
from fairseq_ext.evaluation.generate_output import read_generate_output
from fairseq_ext.synthetic import running_sums, toy

# ----------------------------------------------------------------- the data and the scorer


def test_targets_are_running_sums_and_data_is_deterministic(tmp_path):
    rng = random.Random(0)
    for _ in range(50):
        src, tgt = running_sums.prefix_sum_pair(rng, modulus=7, max_step=3, min_len=2, max_len=9)
        xs, ys = [int(t[1:]) for t in src.split()], [int(t[1:]) for t in tgt.split()]
        assert len(xs) == len(ys) and 2 <= len(xs) <= 9 and all(0 <= x <= 3 for x in xs)
        assert ys[0] == xs[0] % 7
        assert all((ys[t] - ys[t - 1] - xs[t]) % 7 == 0 for t in range(1, len(xs)))
    assert running_sums.prefix_sum_pair(random.Random(3), 10, 2, 4, 16) == \
        running_sums.prefix_sum_pair(random.Random(3), 10, 2, 4, 16)
    a = running_sums.write_prefix_sum_data(str(tmp_path / "a"), sizes=(5, 2, 2))
    b = running_sums.write_prefix_sum_data(str(tmp_path / "b"), sizes=(5, 2, 2))
    for name in ("train.src", "train.tgt", "test.tgt"):
        assert open(os.path.join(a, name)).read() == open(os.path.join(b, name)).read()
    assert open(os.path.join(a, "train.tgt")).read() != open(os.path.join(a, "valid.tgt")).read()


def test_position_accuracy_hand_values():
    refs = [["y1", "y2", "y3"], ["y4", "y5"], ["y6"]]
    hyps = [["y1", "y0", "y3"], ["y4"], ["y6", "y7"]]  # wrong at t=2; too short; too long
    s = running_sums.position_accuracy(hyps, refs)
    assert s["token_acc"] == pytest.approx(4 / 6)
    assert s["seq_acc"] == 0.0
    assert s["by_position"] == pytest.approx({1: 1.0, 2: 0.0, 3: 1.0})
    assert s["seq_correct"] == [0, 0, 0]
    assert running_sums.position_accuracy([["y1"]], [["y1"]])["seq_acc"] == 1.0
    assert running_sums.position_accuracy([["y1"], ["y2"]], [["y1"], ["y3"]])["seq_correct"] == [1, 0]
    with pytest.raises(ValueError):
        running_sums.position_accuracy([["y1"]], [["y1"], ["y2"]])


class _RuleModel(torch.nn.Module):
    """A stand-in for a translation model: one-hot logits of the y it predicts at
    each decoder position j (the token after the fed prev[j]) by ``rule``:
    "source" = the running sum x_1 + ... + x_{j+1} (mod 10), "shortcut" = the fed
    token plus x_{j+1} (EOS counts as 0), "alternate" = source at odd j, shortcut
    at even j."""

    def __init__(self, d, rule):
        super().__init__()
        self.d, self.rule = d, rule

    def forward(self, src_tokens, src_lengths, prev_output_tokens):
        out = torch.zeros(*prev_output_tokens.shape, len(self.d))
        for b in range(src_tokens.size(0)):
            xs = [int(self.d[i][1:]) for i in src_tokens[b].tolist() if i != self.d.pad()]
            for j in range(min(prev_output_tokens.size(1), len(xs))):
                fed = prev_output_tokens[b, j].item()
                shortcut = (0 if fed == self.d.eos() else int(self.d[fed][1:])) + xs[j]
                use_source = self.rule == "source" or (self.rule == "alternate" and j % 2 == 1)
                y = sum(xs[:j + 1]) if use_source else shortcut
                out[b, j, self.d.index(f"y{y % 10}")] = 1.0
        return out, None


def _sums_batch(d, sources):
    """A collated batch as fairseq's translation task builds it: source left-padded,
    target right-padded with EOS, prev_output_tokens = EOS + target."""
    n, width = len(sources), max(len(x) for x in sources)
    src = torch.full((n, width), d.pad())
    tgt = torch.full((n, width + 1), d.pad())
    prev = torch.full((n, width + 1), d.pad())
    for b, xs in enumerate(sources):
        ys = [d.index(f"y{sum(xs[:t + 1]) % 10}") for t in range(len(xs))]
        src[b, width - len(xs):] = torch.tensor([d.index(f"x{x}") for x in xs])
        tgt[b, :len(xs) + 1] = torch.tensor(ys + [d.eos()])
        prev[b, :len(xs) + 1] = torch.tensor([d.eos()] + ys)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([len(x) for x in sources]),
                          "prev_output_tokens": prev}, "target": tgt}


def test_corrupted_history_hand_values():
    from fairseq.data import Dictionary

    d = Dictionary()
    for sym in [f"x{i}" for i in range(3)] + [f"y{i}" for i in range(10)]:
        d.add_symbol(sym)
    # lengths 4, 3, 6: corrupting y_c for c in 3..8 scores position c + 1 where it exists:
    # c = 3 in the first, none in the second, c = 3, 4, 5 in the third: 4 cases
    batch = [_sums_batch(d, [[2, 1, 2, 2], [1, 1, 1], [2, 2, 2, 1, 0, 2]])]
    source = running_sums.corrupted_history(_RuleModel(d, "source"), d, batch)
    assert (source["recovered"], source["followed"], source["n"]) == (1.0, 0.0, 4)
    shortcut = running_sums.corrupted_history(_RuleModel(d, "shortcut"), d, batch)
    assert (shortcut["recovered"], shortcut["followed"]) == (0.0, 1.0)
    # source at odd positions c = 3, 5 (the first sentence's and two of the third's), shortcut at c = 4
    mixed = running_sums.corrupted_history(_RuleModel(d, "alternate"), d, batch)
    assert (mixed["recovered"], mixed["followed"]) == (0.75, 0.25)
    # only c = 2: one case per sentence
    assert running_sums.corrupted_history(_RuleModel(d, "source"), d, batch, positions=[2])["n"] == 3
    with pytest.raises(ValueError, match="no sentence"):
        running_sums.corrupted_history(_RuleModel(d, "source"), d, batch, positions=[6])
    with pytest.raises(ValueError, match="y0 .. y11"):
        running_sums.corrupted_history(_RuleModel(d, "source"), d, batch, modulus=12)


# ----------------------------------------------------------------- DSS must beat teacher forcing

DATA = dict(sizes=(2000, 10, 300), modulus=10, max_step=2, min_len=4, max_len=12, seed=5)
TRAIN = ["--task", "translation", "--arch", "lstm", "--encoder-layers", "1", "--decoder-layers", "1",
         "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-hidden-size", "64",
         "--decoder-hidden-size", "64", "--decoder-out-embed-dim", "32", "--dropout", "0",
         "--optimizer", "adam", "--lr", "0.005", "--clip-norm", "1", "--batch-size", "32", "--max-epoch", "10",
         "--disable-validation", "--no-epoch-checkpoints", "--no-save-optimizer-state", "--num-workers", "0",
         "--seed", "1"]
CE = ["--criterion", "cross_entropy"]
# the thesis's schedule: epoch 1 teacher forced, then eps = k / (k + exp(t / k)) per epoch
DSS = ["--criterion", "differentiable_scheduled_sampling", "--dss-mode", "soft-sample", "--dss-schedule-unit",
       "epoch", "--dss-warmup", "1", "--dss-decay-k", "3", "--dss-alpha", "1"]
# Pooled over seeds 1-3 (mean of the per-seed values, positions 9-12, points). The task must
# show exposure bias: teacher forcing's compounding (teacher-forced minus greedy accuracy) at
# least CE_COMPOUNDING; and DSS must remove at least MARGIN points of it. Measured with this
# very setup (2026-11-27), seeds 1 / 2 / 3: compounding CE 0.7 / 18.5 /
# 19.1 (mean 12.8), DSS 6.2 / 10.0 / -0.4 (mean 5.3); greedy accuracy CE 67.9 / 17.2 / 30.4, DSS
# 45.9 / 31.2 / 44.5. The greedy-accuracy gain of seed 1 alone is no test: +25.0 (seeds 2 / 3
# +11.9 / +5.2) on one CPU, -22.0 on the CPU of the measurement above: a retrained model
# differs from CPU to CPU, and at this budget the accuracy gain is seed luck (docs/dss.md's 20-epoch table: behind CE on one seed of three) while the removed
# compounding is not (there: every seed). With eps = 1 (--dss-warmup 1e12) the DSS runs are
# the CE runs, nothing is removed, and the test fails. See docs/dss.md.
# The mechanism, measured directly (running_sums.corrupted_history: one wrong y_c fed at c = 3..8,
# share of right y_{c+1}): DSS must recover at least RECOVERY_MARGIN points more often than CE,
# pooled. Measured with this setup, the same CPU, seeds 1 / 2 / 3: CE 91.0 / 31.5 / 70.3 (mean
# 64.3), DSS 90.5 / 51.8 / 80.7 (mean 74.3); error carried forward CE 6.4 / 44.9 / 19.7, DSS
# 7.4 / 35.1 / 7.9. With eps = 1 the difference is 0 and the test fails.
SEEDS = (1, 2, 3)
CE_COMPOUNDING = 5.0
MARGIN = 3.0
RECOVERY_MARGIN = 5.0


@pytest.fixture(scope="module")
def sums_data(tmp_path_factory):
    raw = running_sums.write_prefix_sum_data(str(tmp_path_factory.mktemp("sums_raw")), **DATA)
    return toy.binarize_translation(raw, str(tmp_path_factory.mktemp("sums_bin")))


def _train_and_decode(data, criterion, save_dir, train=TRAIN):
    """fairseq-train, then greedy fairseq-generate on test; position_accuracy's scores
    plus the teacher-forced accuracy by position."""
    run_cli(["fairseq-train", data, "--user-dir", os.path.join(REPO, "fairseq_ext"), *train, *criterion,
             "--save-dir", save_dir])
    ckpt = os.path.join(save_dir, "checkpoint_last.pt")
    out = run_cli(["fairseq-generate", data, "--user-dir", os.path.join(REPO, "fairseq_ext"), "--path", ckpt,
                   "--gen-subset", "test", "--beam", "1", "--batch-size", "300",
                   "--required-batch-size-multiple", "1"]).stdout
    scores = running_sums.score_generate_output(read_generate_output(out))
    assert scores["n"] == DATA["sizes"][2]
    scores["teacher_forced_by_position"] = running_sums.teacher_forced_by_position(ckpt, data, "test")
    scores["corrupted_history"] = running_sums.corrupted_history_of_checkpoint(ckpt, data, "test")
    return scores


def _late(by_position):
    return sum(by_position[t] for t in range(9, 13)) / 4


def _compounding(scores):
    return 100 * (_late(scores["teacher_forced_by_position"]) - _late(scores["by_position"]))


@pytest.mark.slow
def test_dss_beats_teacher_forcing_where_errors_compound(sums_data, tmp_path):
    ce, dss = [], []
    for seed in SEEDS:
        seeded = list(TRAIN)
        seeded[seeded.index("--seed") + 1] = str(seed)
        ce.append(_train_and_decode(sums_data, CE, str(tmp_path / f"ce{seed}"), seeded))
        dss.append(_train_and_decode(sums_data, DSS, str(tmp_path / f"dss{seed}"), seeded))
    ce_c, dss_c = [_compounding(s) for s in ce], [_compounding(s) for s in dss]
    report = (f"compounding at positions 9-12 per seed: CE {[round(c, 1) for c in ce_c]}, "
              f"DSS {[round(c, 1) for c in dss_c]}; greedy accuracy CE "
              f"{[round(100 * _late(s['by_position']), 1) for s in ce]}, DSS "
              f"{[round(100 * _late(s['by_position']), 1) for s in dss]}; recovered from a wrong y_c CE "
              f"{[round(100 * s['corrupted_history']['recovered'], 1) for s in ce]}, DSS "
              f"{[round(100 * s['corrupted_history']['recovered'], 1) for s in dss]}")
    # the task shows exposure bias: teacher forcing's model is right on gold prefixes where it
    # is wrong on its own
    ce_mean, dss_mean = sum(ce_c) / len(SEEDS), sum(dss_c) / len(SEEDS)
    assert ce_mean > CE_COMPOUNDING, report
    assert ce_mean - dss_mean >= MARGIN, report
    # and the reason: DSS has learned to take the running sum from the source when its history is wrong
    ce_rec, dss_rec = [sum(100 * s["corrupted_history"]["recovered"] for s in runs) / len(SEEDS) for runs in (ce, dss)]
    assert dss_rec - ce_rec >= RECOVERY_MARGIN, report
