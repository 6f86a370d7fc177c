"""The ``comet`` cost (1 - COMET) through fairseq-train, with a stand-in of the
``unbabel-comet`` package built locally (tests/stand_ins/comet: its interface, a tiny torch
model, no download): the model option reaches COMET's loader, hypotheses go in batches of
``batch_size`` without gradients on the training device with their sources and references
as detokenized text, and the logged cost is the mean of 1 - the scores COMET returned."""
import json
import os
import sys

import pytest

from conftest import REPO, run_cli

STAND_INS = os.path.join(REPO, "tests", "stand_ins")
TINY = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings", "--seed", "1",
        "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "300", "--max-update", "1", "--disable-validation",
        "--no-save", "--num-workers", "0", "--log-format", "json", "--log-interval", "1"]


def test_stand_in_scores_by_its_rule():
    sys.path.insert(0, STAND_INS)
    try:
        import comet

        sample = {"src": "a b c d", "mt": "x y z", "ref": "x q"}
        model = comet.load_from_checkpoint("m.ckpt")
        assert model.predict([sample], gpus=0).scores == [pytest.approx(0.5 / 1.1)] == [comet.score(sample)]
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)


def stand_in_score(sample):
    """The stand-in's rule, by hand: the share of the reference's words found in the hypothesis
    (words compared by their hash bucket), over 1 + |len(mt) - len(src)| / 10."""
    sys.path.insert(0, STAND_INS)
    try:
        from comet import bucket
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)
    mt, ref, src = sample["mt"].split(), sample["ref"].split(), sample["src"].split()
    found = sum(bucket(w) in {bucket(v) for v in mt} for w in ref)
    return found / max(len(ref), 1) / (1 + abs(len(mt) - len(src)) / 10)


@pytest.fixture
def comet_cost():
    sys.path.insert(0, STAND_INS)
    try:
        from fairseq_ext.core.text_costs import CometCost

        yield CometCost(model="tiny/local-comet", batch_size=2)
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)


def test_aggregation_scores_against_the_mean_reference_embedding(comet_cost):
    """Hand-computed: references "x q" and "x y z w", hypothesis "y z", source "a b c" (all
    words in distinct buckets). Mean bag of the references, uniform: x 1, q y z w 0.5 (3
    words); the hypothesis finds y and z: overlap 1/3, over 1 + |2 - 3| / 10. Weights (3/4,
    1/4): x 1, q 0.75, y z w 0.25 (2.5 words): overlap 0.5 / 2.5 = 0.2. One reference: the
    plain cost, for every hypothesis, batched by batch_size."""
    refs, src = ["x q", "x y z w"], "a b c"
    assert comet_cost.aggregatable
    uniform = comet_cost.aggregated_cost(["y z"], refs, None, src)
    assert float(uniform[0]) == pytest.approx(1 - (1 / 3) / 1.1)
    weighted = comet_cost.aggregated_cost(["y z"], refs, [0.75, 0.25], src)
    assert float(weighted[0]) == pytest.approx(1 - 0.2 / 1.1)
    hyps = ["x", "x q", "y z w", "a b c x", "q q q q q"]
    one = comet_cost.aggregated_cost(hyps, ["x q"], None, src)
    plain = comet_cost(hyps, ["x q"] * len(hyps), [src] * len(hyps))
    assert one.tolist() == pytest.approx(plain.tolist())
    assert one.tolist() == pytest.approx([1 - stand_in_score({"src": src, "mt": h, "ref": "x q"}) for h in hyps])


def test_a_model_without_an_estimator_has_no_aggregate():
    sys.path.insert(0, STAND_INS)
    try:
        from fairseq_ext.core.text_costs import CometCost

        assert not CometCost(model="tiny/xcomet").aggregatable
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)


@pytest.mark.parametrize("criterion", ["mrt", "mgs"])
def test_comet_cost_through_fairseq_train(criterion, toy_bin, tmp_path):
    log = tmp_path / "comet.jsonl"
    extra = ["--mrt-candidates", "4"] if criterion == "mrt" else ["--mgs-candidates", "2"]
    proc = run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY, "--criterion", criterion,
                    f"--{criterion}-task-loss", "comet(model=tiny/local-comet,batch_size=5)", *extra,
                    "--save-dir", str(tmp_path / "save")],
                   env={"PYTHONPATH": os.pathsep.join([REPO, STAND_INS]), "COMET_STAND_IN_LOG": str(log)})
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0] == {"call": "download_model", "model": "tiny/local-comet"}
    assert calls[1] == {"call": "load_from_checkpoint", "path": "/stand-in/tiny/local-comet/checkpoints/model.ckpt"}
    predicts = [c for c in calls if c["call"] == "predict"]
    assert predicts and all(1 <= c["n"] <= 5 and c["gpus"] == 0 and c["devices"] is None for c in predicts)
    assert all(not c["training"] and not c["grad"] for c in predicts)
    for c in predicts:
        for sample, value in zip(c["samples"], c["scores"]):
            assert set(sample) == {"src", "mt", "ref"} and all(isinstance(v, str) for v in sample.values())
            assert value == pytest.approx(stand_in_score(sample))
    (train,) = [json.loads(line.split("| train_inner | ", 1)[1]) for line in (proc.stdout + proc.stderr).splitlines()
                if "| train_inner | " in line]
    scores = [s for c in predicts for s in c["scores"]]
    if criterion == "mrt":  # cost_mean: the mean cost of the drawn candidates
        assert float(train["cost_mean"]) == pytest.approx(1 - sum(scores) / len(scores), abs=1e-4)
    else:  # loss: C(theta), the first decode's mean cost
        first = predicts[0]["scores"]
        n = sum(c["n"] for c in predicts) // 3  # theta and its 2 candidates decode the same inputs
        theta = [s for c in predicts for s in c["scores"]][:n]
        assert float(train["loss"]) == pytest.approx(1 - sum(theta) / n, abs=1e-4) and first


def test_comet_without_the_package_is_one_line(toy_bin, tmp_path):
    """Without unbabel-comet: one line naming the option and what to install, nothing written."""
    import subprocess

    from conftest import cli_env

    proc = subprocess.run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY, "--criterion", "mrt",
                           "--mrt-task-loss", "comet", "--save-dir", str(tmp_path / "save")], cwd=REPO,
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode == 2 and lines == [
        "fairseq-train: error: --mrt-task-loss must be a task loss or a weighted sum of them (sbleu; edit=1,rep=0.5; "
        "my_costs:MyCost=1,sbleu=0.5): 'comet': the unbabel-comet package is not installed "
        "(pip install unbabel-comet)"], proc.stderr[-2000:]
    assert not (tmp_path / "save").exists()


def test_a_quality_estimation_model_is_a_reference_free_cost():
    """A COMET model that says it reads no reference (CometKiwi's interface, the stand-in's "kiwi"):
    the cost needs no reference, no reference reaches the model (the stand-in refuses a sample with
    one), it has no aggregated form, and its values are 1 - the QE score by hand."""
    sys.path.insert(0, STAND_INS)
    try:
        from fairseq_ext.core.text_costs import CometCost

        qe, full = CometCost(model="tiny/cometkiwi"), CometCost(model="tiny/local-comet")
        assert not qe.needs_reference and not qe.aggregatable and full.needs_reference
        hyps, srcs = ["a b c", "a b c d e f g h i j k l"], ["x y z", "x y"]
        costs = qe(hyps, None, srcs)
        assert costs.tolist() == pytest.approx([1 - 1.0, 1 - 1 / (1 + 10 / 10)])
        assert qe(hyps, ["refs", "ignored"], srcs).tolist() == costs.tolist()
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)
