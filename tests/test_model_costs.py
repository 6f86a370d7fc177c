"""fairseq checkpoints as costs (costs/model_costs.py), on small models trained here through
fairseq-train on the toy corpus: ``reverse`` (a tgt -> src model), ``paraphrase`` (a model with one
joined vocabulary) and ``fluency`` (a ``transformer_lm``) equal fairseq's own scoring of the same
pairs (``SequenceScorer`` on a ``LanguagePairDataset`` batch; a language model one prefix at a
time); and they run as the task loss of ``fairseq-train --criterion mrt`` and as the QE reranker of
``fairseq-generate --task translation_mbr``."""
import json
import os

import pytest
import torch

from conftest import REPO, run_cli
from fairseq_ext.core.task_losses import build_task_loss
from fairseq_ext.synthetic import tiny_models

USER = ["--user-dir", os.path.join(REPO, "fairseq_ext")]
TRAIN = ["--optimizer", "adam", "--lr", "0.01", "--max-tokens", "400", "--max-update", "20", "--num-workers", "0",
         "--no-epoch-checkpoints", "--disable-validation", "--seed", "1"]


@pytest.fixture(scope="module")
def checkpoints(toy_bin, toy_lm_bin, tmp_path_factory):
    """{"forward": src -> tgt, "reverse": tgt -> src (both one joined dictionary), "lm": a transformer_lm
    of the target side}: checkpoint paths, 20 updates each."""
    root = tmp_path_factory.mktemp("model_costs")
    out = {}
    for name, argv in (("forward", [toy_bin, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"]]),
                       ("reverse", [toy_bin, "--task", "translation", "--source-lang", "tgt", "--target-lang", "src",
                                    *tiny_models.TINY_ARCHS["transformer"]]),
                       ("lm", [toy_lm_bin, "--task", "language_modeling", "--tokens-per-sample", "64",
                               *tiny_models.TINY_ARCHS["transformer_lm"]])):
        run_cli(["fairseq-train", *argv, *USER, "--criterion", "cross_entropy", *TRAIN, "--save-dir",
                 str(root / name)])
        out[name] = str(root / name / "checkpoint_last.pt")
    return out


@pytest.fixture(scope="module")
def pairs(toy_raw):
    """(6 sources, 6 references, 6 hypotheses: the references of other sentences) of the toy text."""
    src = open(os.path.join(toy_raw, "valid.src")).read().splitlines()[:6]
    tgt = open(os.path.join(toy_raw, "valid.tgt")).read().splitlines()[:6]
    return src, tgt, tgt[1:] + tgt[:1]


def _fairseq_scores(path, sources, targets):
    """Per pair, fairseq's mean log-probability of ``targets[i]`` given ``sources[i]``:
    SequenceScorer (what fairseq-generate --score-reference runs) on a LanguagePairDataset batch."""
    from fairseq import checkpoint_utils
    from fairseq.data import LanguagePairDataset
    from fairseq.sequence_scorer import SequenceScorer

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path])
    model = models[0].eval()
    enc = lambda d, s: d.encode_line(s, add_if_not_exist=False).long()  # noqa: E731
    src = [enc(task.source_dictionary, s) for s in sources]
    tgt = [enc(task.target_dictionary, t) for t in targets]
    ds = LanguagePairDataset(src, [len(x) for x in src], task.source_dictionary, tgt, [len(y) for y in tgt],
                             task.target_dictionary)
    batch = ds.collater([ds[i] for i in range(len(src))])
    hypos = SequenceScorer(task.target_dictionary).generate([model], batch)
    by_id = {int(i): h[0]["positional_scores"] for i, h in zip(batch["id"], hypos)}
    return torch.stack([by_id[i].mean() for i in range(len(src))])


def test_reverse_cost_is_fairseqs_score_of_the_source_given_the_hypothesis(checkpoints, pairs):
    src, _, hyps = pairs
    cost = build_task_loss(f"reverse(model={checkpoints['reverse']})")
    got = cost(hyps, None, src)
    want = -_fairseq_scores(checkpoints["reverse"], hyps, src)
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-5)
    assert len(set(round(x, 4) for x in got.tolist())) == len(src)
    summed = build_task_loss(f"reverse(model={checkpoints['reverse']},normalize=false)")(hyps, None, src)
    lengths = torch.tensor([len(s.split()) + 1 for s in src], dtype=torch.float)  # EOS counted
    assert summed.tolist() == pytest.approx((got * lengths).tolist(), rel=1e-5)


def test_paraphrase_cost_is_the_mean_of_both_directions(checkpoints, pairs):
    """Prism's score under one model with a joined vocabulary (the forward model here):
    -(log p(hyp | ref) / |hyp| + log p(ref | hyp) / |ref|) / 2."""
    _, refs, hyps = pairs
    cost = build_task_loss(f"paraphrase(model={checkpoints['forward']})")
    got = cost(hyps, refs)
    want = -(_fairseq_scores(checkpoints["forward"], refs, hyps) + _fairseq_scores(checkpoints["forward"], hyps, refs)) / 2
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-5)


def test_fluency_cost_is_the_language_models_score_one_prefix_at_a_time(checkpoints, pairs):
    from fairseq import checkpoint_utils

    _, refs, _ = pairs
    got = build_task_loss(f"fluency(model={checkpoints['lm']})")(refs)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoints["lm"]])
    model, d = models[0].eval(), task.target_dictionary
    with torch.no_grad():
        for value, text in zip(got.tolist(), refs):
            tokens = d.encode_line(text, add_if_not_exist=False).long()
            logps = []
            for t in range(len(tokens)):  # the full forward of each prefix, its last position read
                prefix = torch.cat([torch.tensor([d.eos()]), tokens[:t]]).unsqueeze(0)
                logps.append(model.get_normalized_probs(model(prefix), log_probs=True)[0, -1, tokens[t]])
            assert value == pytest.approx(-float(torch.stack(logps).mean()), abs=1e-5)


def test_bad_model_costs_are_refused_naming_the_checkpoint(checkpoints, tmp_path):
    with pytest.raises(ValueError, match="no such checkpoint"):
        build_task_loss(f"reverse(model={tmp_path / 'none.pt'})")
    with pytest.raises(ValueError, match="needs a language model"):
        build_task_loss(f"fluency(model={checkpoints['forward']})")


def test_mrt_trains_on_the_reverse_model_mixed_with_sbleu(toy_bin, checkpoints, tmp_path):
    """fairseq-train --criterion mrt with 'reverse(model=...)=1,sbleu=0.5': it trains, and each update's
    log has the mean of each term of the sum."""
    log = tmp_path / "train.json"
    run_cli(["fairseq-train", toy_bin, *USER, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
             "--criterion", "mrt", "--mrt-task-loss", f"reverse(model={checkpoints['reverse']})=1,sbleu=0.5",
             "--mrt-candidates", "2", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "400", "--max-update",
             "2", "--num-workers", "0", "--seed", "1", "--log-format", "json", "--log-interval", "1",
             "--disable-validation", "--save-dir", str(tmp_path / "ck"), "--no-save", "--log-file", str(log)])
    records = [json.loads(line[line.index('{"'):]) for line in log.read_text().splitlines() if '{"' in line]
    updates = [r for r in records if "update" in r and "num_updates" in r]  # one line an update (--log-interval 1)
    assert len(updates) == 2
    assert all(float(r["cost_reverse"]) > 0 and 0 <= float(r["cost_sbleu"]) <= 1 for r in updates), updates


def test_mbr_reranks_by_the_reverse_model(toy_bin, checkpoints, tmp_path):
    """fairseq-generate --task translation_mbr --mbr-task-loss reverse(...): QE reranking, each
    candidate's risk its reverse-model cost (recomputed here from the printed text and source)."""
    out = tmp_path / "mbr.jsonl"
    proc = run_cli(["fairseq-generate", toy_bin, *USER, "--task", "translation_mbr", "--path", checkpoints["forward"],
                    "--gen-subset", "valid", "--batch-size", "8", "--mbr-num-candidates", "4",
                    "--mbr-task-loss", f"reverse(model={checkpoints['reverse']})", "--mbr-output-file", str(out)])
    from fairseq_ext.evaluation.generate_output import parse

    sources = {sid: lines[0] for sid, lines in parse(proc.stdout)["S"].items()}
    cost = build_task_loss(f"reverse(model={checkpoints['reverse']})")
    records = [json.loads(line) for line in out.read_text().splitlines()][:8]
    for record in records:
        assert "references" not in record
        want = cost(record["candidates"], None, [sources[record["id"]]] * len(record["candidates"]))
        assert record["risk"] == pytest.approx(want.tolist(), abs=1e-4)


@pytest.mark.parametrize("evaluation", ["batched", "sequential"])
def test_mgs_logs_each_term_of_its_cost(toy_bin, tmp_path, evaluation):
    """MGS with a weighted cost logs each term's mean over theta's candidates every update; the
    weighted sum of the terms is the logged task loss C(theta)."""
    log = tmp_path / "train.json"
    run_cli(["fairseq-train", toy_bin, *USER, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
             "--criterion", "mgs", "--mgs-task-loss", "edit=1,rep=0.5", "--mgs-candidates", "2",
             "--mgs-candidate-evaluation", evaluation, "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "400",
             "--max-update", "2", "--num-workers", "0", "--seed", "1", "--log-format", "json", "--log-interval", "1",
             "--disable-validation", "--save-dir", str(tmp_path / "ck"), "--no-save", "--log-file", str(log)])
    records = [json.loads(line[line.index('{"'):]) for line in log.read_text().splitlines() if '{"' in line]
    updates = [r for r in records if "update" in r and "num_updates" in r]
    assert len(updates) == 2
    for r in updates:
        assert float(r["loss"]) == pytest.approx(float(r["cost_edit"]) + 0.5 * float(r["cost_rep"]), abs=2e-4)
