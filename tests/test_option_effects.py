"""Options of MRT, PG, MGS, MBR, DSS, residual NCE and two tasks that no recipe sets, shown to do what docs/mgs.md says, through the
criterion fairseq builds from the command line (limit cases, each beside the default as the
control):

* ``--mrt-topk 1`` / ``--pg-topk 1``: sampling from the top-1 token is greedy decoding, so every
  candidate is the greedy output; at the default (0: the full distribution) the same seed draws
  candidates that differ from it.
* ``--mrt-max-len-ratio`` / ``--pg-max-len-ratio``: no candidate is longer than
  ceil(ratio x the batch's longest reference) tokens (EOS included); the untrained model's
  samples run to the limit, so halving the ratio shortens the longest candidate;
* ``--mrt-length-normalize`` (q from the mean token log-probability) and ``--mrt-normalize-costs``
  (each input's costs min-max scaled to [0, 1]): MRT's risk on two fixed candidates, by hand for
  each combination;
* ``--mbr-topk 1``, ``--mbr-topp`` near 0, ``--mbr-temperature`` near 0: every candidate
  translation_mbr samples is the greedy output; the default sampling draws others;
* ``--dss-min-eps`` floors DSS's eps and ``--dss-alpha-max`` caps its alpha (by hand after 10 updates);
* ``--completion-loss``: the prefix targets are padding (continuation) or the line (line);
* ``--tagging-min-word-count``: the words kept in sequence_tagging's vocabulary, counted from the file;
* ``--mgs-beam`` with ``--mgs-decoder beam``: a beam of 1 is MGS's greedy decode, the default 4 is not;
* ``--nce-neg-weighting``: residual NCE's negatives averaged or added, by hand.
"""
import math

import pytest
import torch

from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates
from fairseq_ext.synthetic import tiny_models

OPTIONS = {"mrt": ["--criterion", "mrt", "--mrt-candidates", "4", "--mrt-decoder", "sample"],
           "pg": ["--criterion", "pg", "--pg-samples", "4"]}


def _candidates(toy_bin, method, extra=()):
    task, model, args = tiny_models.build_task_and_model(toy_bin, "translation", "transformer",
                                                         [*OPTIONS[method], *extra, "--dropout", "0"], seed=2)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    crit = task.build_criterion(args)
    torch.manual_seed(5)
    with torch.no_grad():
        decoded = decode_batch(model.eval(), sample, crit.decode_cfg)
        cand, batch = decoded.candidates, decoded.batch
        greedy = decode_candidates(model, batch, DecodeConfig(max_len_ref_ratio=crit.decode_cfg.max_len_ref_ratio))
    longest = int(sample["target"].ne(task.target_dictionary.pad()).sum(1).max())
    return cand, greedy, longest


def _rows(c):
    return [tuple(r.tolist()) for r in c.as_list()]


@pytest.mark.parametrize("method", ["mrt", "pg"])
def test_topk_one_samples_the_greedy_output(toy_bin, method):
    cand, greedy, _ = _candidates(toy_bin, method, [f"--{method}-topk", "1"])
    n = cand.num_per_input
    assert n == 4 and _rows(cand) == [row for row in _rows(greedy) for _ in range(n)]
    full, greedy_full, _ = _candidates(toy_bin, method)
    assert _rows(greedy_full) == _rows(greedy)
    assert _rows(full) != [row for row in _rows(greedy_full) for _ in range(n)]  # the control: sampling differs


@pytest.mark.parametrize("method", ["mrt", "pg"])
def test_max_len_ratio_bounds_the_candidates(toy_bin, method):
    short, _, longest = _candidates(toy_bin, method, [f"--{method}-max-len-ratio", "0.5"])
    default, _, _ = _candidates(toy_bin, method)
    assert int(short.lengths.max()) <= math.ceil(0.5 * longest)
    assert int(default.lengths.max()) <= math.ceil(1.3 * longest)
    assert int(default.lengths.max()) > math.ceil(0.5 * longest)  # the control: the default lets them run longer


def _mrt(toy_bin, extra):
    task, _, args = tiny_models.build_task_and_model(toy_bin, "translation", "transformer",
                                                     ["--criterion", "mrt", "--mrt-alpha", "1", *extra], seed=2)
    return task.build_criterion(args)


@pytest.mark.parametrize("flags,expected", [
    ([], 0.2 * 0.880797 + 0.6 * 0.119203),  # q = softmax(-2, -4): (0.8808, 0.1192)
    (["--mrt-length-normalize"], 0.5 * 0.2 + 0.5 * 0.6),  # log p / length = (-1, -1): q uniform
    (["--mrt-normalize-costs"], 0.0 * 0.880797 + 1.0 * 0.119203),  # costs min-max -> (0, 1)
    (["--mrt-length-normalize", "--mrt-normalize-costs"], 0.5),
])
def test_mrt_length_normalize_and_normalize_costs_by_hand(toy_bin, flags, expected):
    """One input, two distinct candidates of 2 and 4 tokens, log p (-2, -4), costs (0.2, 0.6), alpha 1:
    the risk E_q[c] by hand for each combination of the two flags."""
    crit = _mrt(toy_bin, flags)
    hyps = [torch.tensor([4, 5]), torch.tensor([6, 7, 8, 9])]
    risk, logged = crit.estimator(None, None, hyps, torch.tensor([[-2.0, -4.0]]), torch.tensor([[0.2, 0.6]]))
    assert float(risk.sum()) == pytest.approx(expected, abs=1e-5)
    assert logged["distinct"] == 2


def _mbr_candidates(toy_bin, extra=()):
    """The candidates translation_mbr's generator samples (``--mbr-candidates sample``, 4 an input) for 6
    valid sentences, and the greedy outputs under the same length limits."""
    import argparse

    task, model, args = tiny_models.build_task_and_model(
        toy_bin, "translation_mbr", "transformer", ["--mbr-candidates", "sample", "--mbr-num-candidates", "4",
                                                    *extra, "--dropout", "0"], seed=2)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    gen = task.build_generator([model.eval()], argparse.Namespace(**vars(args), beam=1, max_len_a=1.0, max_len_b=5))
    cfg = gen.candidate_cfg
    greedy_cfg = DecodeConfig(max_len_a=cfg.max_len_a, max_len_b=cfg.max_len_b, min_len=cfg.min_len)
    torch.manual_seed(5)
    with torch.no_grad():
        return decode_candidates(model, sample, cfg), decode_candidates(model, sample, greedy_cfg)


@pytest.mark.parametrize("flags", [["--mbr-topk", "1"], ["--mbr-topp", "1e-6"], ["--mbr-temperature", "1e-4"]])
def test_mbr_sampling_limits_give_the_greedy_output(toy_bin, flags):
    """--mbr-topk 1, a nucleus of almost no mass, a temperature near 0: each candidate is the greedy output;
    the default sampling (the control) draws others."""
    cand, greedy = _mbr_candidates(toy_bin, flags)
    assert _rows(cand) == [row for row in _rows(greedy) for _ in range(4)]
    full, _ = _mbr_candidates(toy_bin)
    assert _rows(full) != [row for row in _rows(greedy) for _ in range(4)]


@pytest.mark.parametrize("flags,expected", [
    ([], (0.0, 1e4)),  # the control: eps 1 - 0.5 x 10 -> 0; alpha 2 x 3^10 = 118098 -> the default cap 1e4
    (["--dss-min-eps", "0.3", "--dss-alpha-max", "50"], (0.3, 50.0)),
])
def test_dss_min_eps_and_alpha_max_floor_and_cap_the_schedules(toy_bin, flags, expected):
    """After 10 updates of --dss-schedule linear (slope 0.5) and alpha 2 x 3^t: eps is floored at
    --dss-min-eps and alpha capped at --dss-alpha-max, by hand."""
    task, _, args = tiny_models.build_task_and_model(toy_bin, "translation", "transformer", [
        "--criterion", "differentiable_scheduled_sampling", "--dss-schedule", "linear", "--dss-decay-slope", "0.5",
        "--dss-schedule-unit", "update", "--dss-warmup", "0", "--dss-alpha", "2", "--dss-alpha-growth", "3", *flags])
    crit = task.build_criterion(args)
    crit.clock.num_updates = 10
    eps, alpha = crit.schedule_values()
    assert (eps, alpha) == pytest.approx(expected)


@pytest.mark.parametrize("loss", ["continuation", "line"])
def test_completion_loss_masks_the_prefix_targets_or_not(toy_lm_bin, loss):
    """--completion-loss continuation: the first k target positions (the prefix) are padding, the
    rest is the line; line: the whole line is the target (k = --completion-context-size 3)."""
    task, _, _ = tiny_models.build_task_and_model(toy_lm_bin, "text_completion", "transformer_lm", [
        "--completion-context-size", "3", "--completion-loss", loss, "--tokens-per-sample", "64"])
    task.load_dataset("valid")
    item = task.dataset("valid")[0]
    line, target, pad = item["source"][1:], item["target"], task.target_dictionary.pad()
    assert torch.equal(target[3:-1], line[3:]) and target[-1] == task.target_dictionary.eos()
    if loss == "continuation":
        assert target[:3].eq(pad).all()
    else:
        assert torch.equal(target[:3], line[:3]) and not target.eq(pad).any()


def test_tagging_min_word_count_sets_the_vocabulary(conll, tmp_path):
    """--tagging-min-word-count n keeps the training words seen at least n times (counted here from the
    training file's first column): 1 keeps every word, 10 drops those seen fewer times (the toy corpus's
    rarest words are seen 9 times)."""
    from collections import Counter

    from fairseq import options, tasks

    words = Counter(line.split()[0] for line in open(f"{conll}/train.txt")
                    if line.strip() and not line.startswith("-DOCSTART-"))
    rare = [w for w, c in words.items() if c < 10]
    assert rare and len(words) > len(rare)
    sizes = {}
    for n in (1, 10):
        args = options.parse_args_and_arch(options.get_training_parser(), [
            conll, "--task", "sequence_tagging", "--tagging-cache-dir", str(tmp_path / f"c{n}"), "--arch",
            "tagging_lstm_tiny", "--tagging-min-word-count", str(n)])
        d = tasks.setup_task(args).source_dictionary
        sizes[n] = sum(not w.startswith("madeupword") for w in d.symbols[d.nspecial:])  # fairseq pads to 8
        assert all(d.index(w) != d.unk() for w, c in words.items() if c >= n)
        assert all((d.index(w) == d.unk()) == (n == 10) for w in rare)
    assert sizes == {1: len(words), 10: len(words) - len(rare)}


def test_mgs_beam_sets_the_beam_of_mgs_beam_decoder(toy_bin):
    """--mgs-decoder beam decodes each parameter set with a beam of --mgs-beam: a beam of 1 is MGS's
    greedy decode; the default beam of 4 (the control) finds other outputs for some inputs."""
    outputs = {}
    for beam in ("1", "4"):
        task, model, args = tiny_models.build_task_and_model(toy_bin, "translation", "transformer", [
            "--criterion", "mgs", "--mgs-decoder", "beam", "--mgs-beam", beam, "--dropout", "0"], seed=2)
        task.load_dataset("valid")
        ds = task.dataset("valid")
        sample = ds.collater([ds[i] for i in range(6)])
        crit = task.build_criterion(args)
        with torch.no_grad():
            cand = decode_batch(model.eval(), sample, crit.decode_cfg).candidates
            greedy = decode_batch(model, sample, crit.greedy_cfg).candidates
        eos = task.target_dictionary.eos()
        strip = lambda rows: [r[:-1] if r and r[-1] == eos else r for r in rows]  # noqa: E731
        outputs[beam] = (strip(_rows(cand)), strip(_rows(greedy)))  # beam search ends a full-length row with EOS
    assert outputs["1"][0] == outputs["1"][1]
    assert outputs["4"][1] == outputs["1"][1] and outputs["4"][0] != outputs["4"][1]


@pytest.mark.parametrize("weighting,expected", [
    ("mean", 1.313262 + (0.126928 + 0.048587) / 2),  # softplus(1) + mean of softplus(-2), softplus(-3)
    ("sum", 1.313262 + 0.126928 + 0.048587),
])
def test_nce_neg_weighting_by_hand(weighting, expected):
    """residual_nce's loss for one prefix with energies E+ = 1 and E- = (2, 3) (a stand-in model whose
    energy is a row's first token): the negatives' terms averaged (mean) or added (sum)."""
    from types import SimpleNamespace

    from fairseq_ext.criterions.residual_nce import ResidualNCECriterion

    task = SimpleNamespace(target_dictionary=None, require_negatives=lambda option: None)
    crit = ResidualNCECriterion(task, nce_neg_weighting=weighting)
    sample = {"positive": torch.tensor([[1, 9]]), "negatives": torch.tensor([[[2, 9], [3, 9]]]), "ntokens": 2}
    loss, size, _ = crit(lambda rows: rows[:, 0].double(), sample)
    assert size == 1 and float(loss) == pytest.approx(expected, abs=1e-5)
