"""mrt / pg criterions in-process on the tiny toy model: MRT's loss on fixed
candidates against a hand computation (repeats counted once, the reference added
only when no candidate equals it, the MLE term on the per-token scale), the
self-critical PG baseline is the greedy decode's cost, bad options stop with the
option's name."""
import pytest
import torch

from fairseq_ext.synthetic import tiny_models
from fairseq_ext.decoding.batch import Decoded, decode_batch
from fairseq_ext.decoding.candidates import Candidates, DecodeConfig


def _crit(toy_bin, extra):
    task, model, args = tiny_models.build_task_and_model(toy_bin, "translation", "transformer", extra, seed=2)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    return task, model, task.build_criterion(args), sample


def _fixed_candidates(rows, pad):
    tokens = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    n = len(rows)
    return Candidates(tokens, torch.tensor([len(r) for r in rows]), torch.zeros(n), torch.ones(n, dtype=torch.bool), 3)


def _log_p(model, src, hyp, eos):
    """log p(hyp | src) by one teacher-forced forward pass of the model."""
    prev = torch.cat([torch.tensor([eos]), hyp[:-1]]).unsqueeze(0)
    out = model(src.unsqueeze(0), torch.tensor([len(src)]), prev)
    return model.get_normalized_probs(out, log_probs=True)[0].gather(-1, hyp.unsqueeze(-1)).sum()


def test_mrt_loss_by_hand_on_fixed_candidates(toy_bin):
    """Input 0 draws [y*, x, x], input 1 [x, z, x], where x differs from the reference
    y* in one token and z in two (edit costs 1/n and 2/n, n reference words); with
    --mrt-include-reference the sets are {y*, x} (y* was drawn) and {x, z, y*}, and
    loss = sum_i E_q[c] + w sum_i -log p(y*_i) / |y*_i|, q = p^alpha / Z over each set.
    (Keeping repeats would give x twice its share; the reference would enter set 0
    twice; the old MLE term was the sequence NLL, |y*| times larger.)"""
    alpha, w = 0.5, 0.3
    task, model, crit, sample = _crit(toy_bin, [
        "--criterion", "mrt", "--mrt-task-loss", "edit", "--mrt-candidates", "3", "--mrt-include-reference",
        "--mrt-alpha", str(alpha), "--mrt-mle-weight", str(w), "--dropout", "0"])
    d = task.target_dictionary
    sample = {**sample, "net_input": {k: v[:2] for k, v in sample["net_input"].items()}, "target": sample["target"][:2],
              "nsentences": 2, "ntokens": int(sample["target"][:2].ne(d.pad()).sum())}
    refs = crit.scorer.references(sample)
    srcs = crit.scorer.sources(sample)

    def edited(ref, k):  # the first k words replaced by a word that is none of them
        word = next(t for t in range(d.nspecial, len(d)) if t not in ref[:k].tolist())
        out = ref.clone()
        out[:k] = word
        return out

    x = [edited(r, 1) for r in refs]
    z = edited(refs[1], 2)
    rows = [refs[0], x[0], x[0], x[1], z, x[1]]
    crit.decode = lambda module, smp: Decoded(_fixed_candidates(rows, d.pad()), smp)
    model.train()
    loss, sample_size, log = crit(model, sample)

    with torch.no_grad():
        lp = lambda i, h: float(_log_p(model, srcs[i], h, d.eos()))  # noqa: E731
        n = [len(r) - 1 for r in refs]  # words, EOS excluded
        sets = [[(lp(0, refs[0]), 0.0), (lp(0, x[0]), 1 / n[0])],
                [(lp(1, x[1]), 1 / n[1]), (lp(1, z), 2 / n[1]), (lp(1, refs[1]), 0.0)]]
        risk = sum(sum(torch.exp(torch.tensor(alpha * l)).item() * c for l, c in s)
                   / sum(torch.exp(torch.tensor(alpha * l)).item() for l, _ in s) for s in sets)
        nll = sum(-lp(i, refs[i]) / len(refs[i]) for i in range(2))
    assert sample_size == 2 and log["distinct"] == 5
    assert log["risk"] == pytest.approx(risk, rel=1e-5)
    assert log["nll"] == pytest.approx(nll, rel=1e-5)
    assert loss.item() == pytest.approx(risk + w * nll, rel=1e-5)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_pg_greedy_baseline_is_the_greedy_cost(toy_bin):
    task, model, crit, sample = _crit(toy_bin, ["--criterion", "pg", "--pg-task-loss", "edit", "--pg-samples", "2",
                                                "--pg-baseline", "greedy"])
    model.train()
    loss, _, log = crit(model, sample)
    decoded = decode_batch(model, sample, DecodeConfig(max_len_ref_ratio=1.3))
    cand, batch = decoded.candidates, decoded.batch
    greedy_costs, _ = crit.scorer.score(cand.as_list(), cand.source_index, batch)
    assert abs(log["baseline"] - float(greedy_costs.sum())) < 1e-5
    loss.backward()


@pytest.mark.parametrize("extra,message", [
    (["--criterion", "pg", "--pg-samples", "1"], "--pg-baseline loo needs --pg-samples >= 2"),
    (["--criterion", "pg", "--pg-baseline", "moving", "--pg-baseline-decay", "1"], "--pg-baseline-decay"),
    (["--criterion", "pg", "--pg-mle-weight", "-0.1"], "--pg-mle-weight must be >= 0"),
    (["--criterion", "mrt", "--mrt-mle-weight", "-1"], "--mrt-mle-weight must be >= 0"),
])
def test_bad_options_name_the_option(toy_bin, extra, message):
    with pytest.raises(ValueError, match=message):
        _crit(toy_bin, extra)
