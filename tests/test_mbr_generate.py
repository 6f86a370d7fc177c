"""``fairseq-generate --task translation_mbr`` on a trained tiny transformer: every kind of
candidate, pseudo-references, the user's own and the COMET-style cost, reference
aggregation, pruning and QE reranking; the printed choice against the costs recomputed
from the printed texts with sacrebleu; the output read by the scoring script; shards; errors."""
import json
import os
import subprocess
import sys

import pytest
import sacrebleu

from conftest import REPO, assert_shards_make_one_run, cli_env, hypotheses_by_id, run_cli
from fairseq_ext.synthetic import tiny_models

USER = ["--user-dir", os.path.join(REPO, "fairseq_ext")]
TESTS = os.path.join(REPO, "tests")
STAND_INS = os.path.join(REPO, "tests", "stand_ins")


@pytest.fixture(scope="module")
def checkpoint(toy_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("mbr_ck")
    run_cli(["fairseq-train", toy_bin, *USER, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
             "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "400",
             "--max-update", "120", "--num-workers", "0", "--save-dir", str(save), "--no-epoch-checkpoints",
             "--disable-validation", "--seed", "1"])
    return str(save / "checkpoint_last.pt")


def generate(toy_bin, checkpoint, tmp_path, *extra, env=None, name="mbr"):
    """(stdout, the records of --mbr-output-file) of one MBR run on the 40 valid sentences."""
    out = tmp_path / f"{name}.jsonl"
    proc = run_cli(["fairseq-generate", toy_bin, *USER, "--task", "translation_mbr", "--path", checkpoint,
                    "--gen-subset", "valid", "--batch-size", "16", "--mbr-num-candidates", "8",
                    "--mbr-output-file", str(out), *extra], env=env)
    return proc.stdout, {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}


def chosen_text(stdout):
    return {sid: lines[0].split("\t", 1)[1] for sid, lines in hypotheses_by_id(stdout).items()}


def risks_from_matrix(record):
    """Each candidate's expected cost from the printed matrix and reference counts, by loops."""
    counts = record["reference_count"]
    return [sum(c * v for c, v in zip(counts, row)) / sum(counts) for row in record["matrix"]]


def test_the_printed_choice_is_the_least_expected_cost_of_the_printed_matrix(toy_bin, checkpoint, tmp_path):
    """Default candidates (epsilon sampling) and cost (chrF): 40 sentences, one hypothesis each;
    each matrix entry is 1 - sacrebleu's chrF of the printed candidate and reference; the
    printed hypothesis is the brute-force argmin of the expected cost (first of equals), and
    the scoring script reads the output."""
    stdout, records = generate(toy_bin, checkpoint, tmp_path, "--mbr-output-matrix")
    chosen = chosen_text(stdout)
    assert len(chosen) == len(records) == 40
    chrf = sacrebleu.metrics.CHRF()
    several = 0
    for sid, record in records.items():
        assert sum(record["count"]) == 8 and sum(record["reference_count"]) == 8
        for hyp, row in zip(record["candidates"], record["matrix"]):
            for ref, value in zip(record["references"], row):
                assert value == pytest.approx(1 - chrf.sentence_score(hyp, [ref]).score / 100, abs=1e-6)
        risks = risks_from_matrix(record)
        best = min(range(len(risks)), key=lambda i: (round(risks[i], 9), i))
        assert chosen[sid] == record["candidates"][best]
        assert record["risk"] == pytest.approx(risks, abs=1e-6)
        several += len(record["candidates"]) > 1
    assert several >= 10  # the samples differ: a real choice in most sentences
    for record in records.values():  # each stage's time; no pre-filter here
        assert record["seconds"]["prefilter"] == 0 and record["seconds"]["sampling"] > 0
        assert record["seconds"]["utility"] > 0 and record["seconds"]["selection"] >= 0
    (tmp_path / "out.txt").write_text(stdout)
    score = run_cli(["python", "scripts/score/score.py", str(tmp_path / "out.txt")]).stdout
    assert "BLEU" in score


def test_beam_and_file_candidates(toy_bin, checkpoint, tmp_path):
    """--mbr-candidates beam: the candidates are fairseq's own 4-best of a beam of 4; the same
    candidates from a file (fairseq-generate's H- lines) give the same choices."""
    fairseq = run_cli(["fairseq-generate", toy_bin, *USER, "--path", checkpoint, "--gen-subset", "valid",
                       "--batch-size", "16", "--beam", "4", "--nbest", "4"]).stdout
    nbest = {sid: sorted(x.split("\t", 1)[1] for x in lines) for sid, lines in hypotheses_by_id(fairseq).items()}
    beam_out, beam = generate(toy_bin, checkpoint, tmp_path, "--mbr-candidates", "beam", "--mbr-num-candidates", "4",
                              name="beam")
    for sid, record in beam.items():
        expanded = sorted(c for c, n in zip(record["candidates"], record["count"]) for _ in range(n))
        assert expanded == nbest[sid]
    path = tmp_path / "candidates.txt"
    path.write_text(fairseq)
    file_out, from_file = generate(toy_bin, checkpoint, tmp_path, "--mbr-candidates", "file",
                                   "--mbr-candidates-file", str(path), name="file")
    assert chosen_text(file_out) == chosen_text(beam_out)
    assert all(from_file[s]["risk"] == pytest.approx(beam[s]["risk"]) for s in beam if beam[s]["candidates"] ==
               from_file[s]["candidates"])


def test_separate_references_aggregation_and_pruning(toy_bin, checkpoint, tmp_path):
    """--mbr-references sample draws 6 references apart from the candidates; with
    --mbr-aggregate each candidate's risk is sBLEU's aggregated cost against them (recomputed
    here from the printed texts and counts); pruning computes fewer entries than the full
    matrix and, where nothing was pruned, ranks as the full matrix does."""
    from fairseq_ext.core.task_losses import build_task_loss

    common = ["--mbr-task-loss", "sbleu", "--mbr-references", "sample", "--mbr-num-references", "6"]
    _, agg = generate(toy_bin, checkpoint, tmp_path, *common, "--mbr-aggregate", name="agg")
    bleu = build_task_loss("sbleu")
    for record in agg.values():
        assert sum(record["reference_count"]) == 6
        expected = bleu.aggregated_cost(record["candidates"], record["references"], record["reference_count"])
        assert record["risk"] == pytest.approx(expected.tolist(), abs=1e-6)
        assert record["evaluations"] == len(record["candidates"])
    _, full = generate(toy_bin, checkpoint, tmp_path, "--mbr-task-loss", "sbleu", "--mbr-num-candidates", "16",
                       name="full")
    _, pruned = generate(toy_bin, checkpoint, tmp_path, "--mbr-task-loss", "sbleu", "--mbr-num-candidates", "16",
                         "--mbr-prune-alpha", "0.9", "--mbr-prune-schedule", "2,4", "--mbr-prune-bootstrap", "50",
                         name="pruned")
    assert sum(r["evaluations"] for r in pruned.values()) < sum(r["evaluations"] for r in full.values())
    for sid, record in pruned.items():
        assert record["candidates"] == full[sid]["candidates"]
        if None not in record["risk"]:
            assert record["order"] == full[sid]["order"]


def test_qe_reranking_and_the_users_own_cost(toy_bin, checkpoint, tmp_path):
    """A cost that reads no reference (the user's own, by import path) reranks: each risk is the
    cost itself, |words - source words| / 10, and no reference is drawn."""
    stdout, records = generate(toy_bin, checkpoint, tmp_path, "--mbr-task-loss", "user_costs:LengthGap",
                               env={"PYTHONPATH": os.pathsep.join([REPO, TESTS])}, name="qe")
    sources = {sid: lines[0] for sid, lines in __import__("fairseq_ext.evaluation.generate_output",
                                                          fromlist=["parse"]).parse(stdout)["S"].items()}
    chosen = chosen_text(stdout)
    for sid, record in records.items():
        assert "references" not in record
        gap = [abs(len(c.split()) - len(sources[sid].split())) / 10 for c in record["candidates"]]
        assert record["risk"] == pytest.approx(gap, abs=1e-6)
        assert chosen[sid] == record["candidates"][min(range(len(gap)), key=lambda i: (gap[i], i))]
    # a neural reference-free cost whose prepare encodes the source once (as in training)
    _, records = generate(toy_bin, checkpoint, tmp_path, "--mbr-task-loss", "user_costs:EmbeddingDistance",
                          env={"PYTHONPATH": os.pathsep.join([REPO, TESTS])}, name="qe_neural")
    for record in records.values():
        risks = [record["risk"][i] for i in record["order"]]
        assert None not in risks and risks == sorted(risks) and record["evaluations"] == len(risks)


def test_the_comet_style_cost_decodes(toy_bin, checkpoint, tmp_path):
    """The comet cost through MBR, with the local stand-in of unbabel-comet: every matrix entry
    is 1 - the stand-in's score of (source, candidate, reference)."""
    log = tmp_path / "stand_in_calls.jsonl"
    stdout, records = generate(toy_bin, checkpoint, tmp_path, "--mbr-task-loss",
                               "comet(model=tiny/local-comet,batch_size=7)", "--mbr-output-matrix",
                               env={"PYTHONPATH": os.pathsep.join([REPO, STAND_INS]), "COMET_STAND_IN_LOG": str(log)},
                               name="comet")
    import sys

    sys.path.insert(0, STAND_INS)
    try:
        import comet

        sources = __import__("fairseq_ext.evaluation.generate_output", fromlist=["parse"]).parse(stdout)["S"]
        for sid, record in records.items():
            for hyp, row in zip(record["candidates"], record["matrix"]):
                for ref, value in zip(record["references"], row):
                    sample = {"src": sources[sid][0], "mt": hyp, "ref": ref}
                    assert value == pytest.approx(1 - comet.score(sample), abs=1e-5)
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)
    predicts = [json.loads(line) for line in log.read_text().splitlines() if '"predict"' in line]
    assert predicts and all(1 <= p["n"] <= 7 and not p["grad"] for p in predicts)


def test_comet_reference_aggregation(toy_bin, checkpoint, tmp_path):
    """--mbr-aggregate with the comet cost: each candidate against the count-weighted mean of
    the references' sentence embeddings. The stand-in's embedding is a bag of hashed words,
    so each risk is, by hand, 1 - (sum_j w_j found_j / sum_j w_j len_j) / (1 + |len(mt) -
    len(src)| / 10), found_j the words of reference j found in the candidate; the encoder
    runs without gradients and no pair goes through predict. A model without an estimator
    (COMET's unified models) is refused in one line."""
    import sys

    log = tmp_path / "stand_in_calls.jsonl"
    env = {"PYTHONPATH": os.pathsep.join([REPO, STAND_INS]), "COMET_STAND_IN_LOG": str(log)}
    stdout, records = generate(toy_bin, checkpoint, tmp_path, "--mbr-task-loss",
                               "comet(model=tiny/local-comet,batch_size=5)", "--mbr-aggregate", env=env, name="agg")
    sys.path.insert(0, STAND_INS)
    try:
        from comet import bucket
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)
    sources = __import__("fairseq_ext.evaluation.generate_output", fromlist=["parse"]).parse(stdout)["S"]
    for sid, record in records.items():
        src, w = sources[sid][0].split(), record["reference_count"]
        for hyp, risk in zip(record["candidates"], record["risk"]):
            mt = {bucket(v) for v in hyp.split()}
            found = sum(c * sum(bucket(v) in mt for v in ref.split()) for c, ref in zip(w, record["references"]))
            words = max(sum(c * len(ref.split()) for c, ref in zip(w, record["references"])), 1)
            assert risk == pytest.approx(1 - found / words / (1 + abs(len(hyp.split()) - len(src)) / 10), abs=1e-5)
        assert record["evaluations"] == len(record["candidates"])
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    embeds = [c for c in calls if c["call"] == "get_sentence_embedding"]
    assert embeds and all(1 <= c["n"] <= 5 and not c["grad"] for c in embeds)
    assert not [c for c in calls if c["call"] == "predict"]
    proc = subprocess.run(["fairseq-generate", toy_bin, *USER, "--task", "translation_mbr", "--path", checkpoint,
                           "--gen-subset", "valid", "--mbr-task-loss", "comet(model=tiny/xcomet)", "--mbr-aggregate"],
                          cwd=REPO, env=cli_env(**env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "fairseq-generate: error: --mbr-aggregate: comet(model=tiny/xcomet) has no aggregated form"), proc.stderr[-500:]


def test_shards_make_one_run_and_the_seed_decides(toy_bin, checkpoint, tmp_path):
    base = ["fairseq-generate", toy_bin, *USER, "--task", "translation_mbr", "--path", checkpoint, "--gen-subset",
            "valid", "--batch-size", "8", "--mbr-num-candidates", "6"]
    whole = assert_shards_make_one_run(base)
    other = hypotheses_by_id(run_cli(base + ["--seed", "7"]).stdout)
    assert other != whole and other.keys() == whole.keys()


@pytest.mark.parametrize("bad,message", [
    (["--mbr-candidates", "file"], "--mbr-candidates file needs --mbr-candidates-file"),
    (["--mbr-candidates", "file", "--mbr-candidates-file", "/nonexistent/c.txt"],
     "--mbr-candidates-file /nonexistent/c.txt: cannot read it"),
    (["--mbr-aggregate", "--mbr-task-loss", "edit"], "--mbr-aggregate: edit has no aggregated form"),
    (["--mbr-num-references", "4"], "--mbr-num-references needs --mbr-references sample"),
    (["--mbr-num-candidates", "0"], "--mbr-num-candidates must be >= 1, got 0"),
    (["--mbr-epsilon", "1.0"], "--mbr-epsilon must be in (0, 1), got 1.0"),
    (["--mbr-task-loss", "nosuchcost"], "--mbr-task-loss must be a task loss"),
    (["--mbr-prefilter-k", "4"], "--mbr-prefilter-task-loss and --mbr-prefilter-k go together"),
    (["--mbr-prefilter-task-loss", "chrf", "--mbr-prefilter-k", "4"],
     "--mbr-prefilter-task-loss chrf: the pre-filter ranks the candidates without a reference"),
])
def test_bad_options_end_with_one_line(toy_bin, checkpoint, tmp_path, bad, message):
    out = tmp_path / "never.jsonl"
    proc = subprocess.run(["fairseq-generate", toy_bin, *USER, "--task", "translation_mbr", "--path", checkpoint,
                           "--gen-subset", "valid", *bad, "--mbr-output-file", str(out)],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-generate: error: " + message), last
    assert "Traceback" not in proc.stderr and not out.exists()


def test_mbr_score_model_scores_with_the_given_checkpoint(toy_bin, checkpoint, tmp_path):
    """--mbr-score-model: the lm cost (QE reranking by the per-token NLL) under the named checkpoint.
    Naming the decoded checkpoint itself gives the default's risks (the default scores with the decoded
    model); another checkpoint (5 updates) scores the same candidates otherwise, and reranks them."""
    other = tmp_path / "other"
    run_cli(["fairseq-train", toy_bin, *USER, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
             "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "400",
             "--max-update", "5", "--num-workers", "0", "--save-dir", str(other), "--no-epoch-checkpoints",
             "--disable-validation", "--seed", "2"])
    lm = ["--mbr-task-loss", "lm(normalize=true)"]
    _, default = generate(toy_bin, checkpoint, tmp_path, *lm, name="lm_default")
    _, itself = generate(toy_bin, checkpoint, tmp_path, *lm, "--mbr-score-model", checkpoint, name="lm_itself")
    _, scored = generate(toy_bin, checkpoint, tmp_path, *lm, "--mbr-score-model", str(other / "checkpoint_last.pt"),
                         name="lm_other")
    for sid, record in default.items():
        assert itself[sid]["candidates"] == scored[sid]["candidates"] == record["candidates"]
        assert itself[sid]["risk"] == pytest.approx(record["risk"], abs=1e-5)
    assert all(abs(a - b) > 1e-3 for sid in default for a, b in zip(default[sid]["risk"], scored[sid]["risk"]))
    assert any(default[sid]["order"] != scored[sid]["order"] for sid in default)


def test_mbr_post_process_is_what_the_text_cost_reads(toy_bin, checkpoint, tmp_path):
    """--mbr-post-process: the text the cost reads. The toy dictionary is whole words, so the default
    (auto: none detected) scores the words as printed; sentencepiece, the wrong scheme here, glues each
    sentence's words into one (its pieces carry no word marks), and sBLEU scores those strings."""
    bleu = sacrebleu.metrics.BLEU(effective_order=True)

    def expected(record, glue):
        return [[1 - bleu.sentence_score(glue(h), [glue(r)]).score / 100 for r in record["references"]]
                for h in record["candidates"]]
    sbleu = ["--mbr-task-loss", "sbleu", "--mbr-output-matrix"]
    _, words = generate(toy_bin, checkpoint, tmp_path, *sbleu, name="pp_default")
    _, glued = generate(toy_bin, checkpoint, tmp_path, *sbleu, "--mbr-post-process", "sentencepiece", name="pp_sp")
    differ = 0
    for sid, record in words.items():
        for got, want in ((record, expected(record, lambda s: s)),
                          (glued[sid], expected(glued[sid], lambda s: s.replace(" ", "")))):
            assert [v for row in got["matrix"] for v in row] == pytest.approx([v for row in want for v in row], abs=1e-6)
        differ += glued[sid]["matrix"] != record["matrix"]
    assert differ >= 10


def test_qe_prefilter_keeps_the_k_best_then_mbr_chooses_among_them(toy_bin, checkpoint, tmp_path):
    """--mbr-prefilter-task-loss (a reference-free cost, here the user's |words - source words| / 10)
    with --mbr-prefilter-k: K = N is plain MBR (the same outputs and risks); K = 3 keeps the 3
    distinct candidates of lowest pre-filter cost (recomputed from the text; ties by order), and the
    choice is the brute-force argmin, over those, of the expected cost of the printed matrix against
    every pseudo-reference."""
    env = {"PYTHONPATH": os.pathsep.join([REPO, TESTS])}
    qe = ["--mbr-prefilter-task-loss", "user_costs:LengthGap"]
    plain_out, plain = generate(toy_bin, checkpoint, tmp_path, env=env, name="plain")
    all_out, everything = generate(toy_bin, checkpoint, tmp_path, *qe, "--mbr-prefilter-k", "8", env=env, name="k8")
    assert chosen_text(all_out) == chosen_text(plain_out)
    assert all(everything[sid]["risk"] == plain[sid]["risk"] for sid in plain)
    stdout, records = generate(toy_bin, checkpoint, tmp_path, *qe, "--mbr-prefilter-k", "3", "--mbr-output-matrix",
                               env=env, name="k3")
    sources = {sid: lines[0] for sid, lines in __import__("fairseq_ext.evaluation.generate_output",
                                                          fromlist=["parse"]).parse(stdout)["S"].items()}
    chosen, screened = chosen_text(stdout), 0
    for sid, record in records.items():
        pre = record["prefilter"]
        gap = [abs(len(c.split()) - len(sources[sid].split())) / 10 for c in pre["candidates"]]
        assert pre["cost"] == pytest.approx(gap, abs=1e-6)
        best = sorted(sorted(range(len(gap)), key=lambda i: (gap[i], i))[:3])
        assert pre["kept"] == best and record["candidates"] == [pre["candidates"][i] for i in best]
        risks = risks_from_matrix(record)
        assert chosen[sid] == record["candidates"][min(range(len(risks)), key=lambda i: (round(risks[i], 9), i))]
        assert sum(record["reference_count"]) == 8  # every pseudo-reference, also those filtered as candidates
        screened += len(pre["candidates"]) > 3
        seconds = record["seconds"]  # each stage's time for this sentence
        assert set(seconds) == {"sampling", "prefilter", "utility", "selection"}
        assert all(v >= 0 for v in seconds.values()) and seconds["prefilter"] > 0 and seconds["utility"] > 0
    assert screened >= 10


def test_mbr_with_a_quality_estimation_comet_model_is_qe_reranking(toy_bin, checkpoint, tmp_path):
    """--mbr-task-loss comet(model=...) with a quality-estimation model (the stand-in's CometKiwi):
    QE reranking, one evaluation per distinct candidate (N, not N x N), no reference drawn or passed
    to the model, each risk 1 - the QE score of the printed candidate and source (by hand)."""
    sys.path.insert(0, STAND_INS)
    try:
        from comet import qe_score
    finally:
        sys.path.remove(STAND_INS)
        sys.modules.pop("comet", None)
    log = tmp_path / "comet.jsonl"
    stdout, records = generate(toy_bin, checkpoint, tmp_path, "--mbr-task-loss", "comet(model=tiny/cometkiwi)",
                               env={"PYTHONPATH": os.pathsep.join([REPO, STAND_INS]), "COMET_STAND_IN_LOG": str(log)},
                               name="kiwi")
    sources = {sid: lines[0] for sid, lines in __import__("fairseq_ext.evaluation.generate_output",
                                                          fromlist=["parse"]).parse(stdout)["S"].items()}
    for sid, record in records.items():
        assert "references" not in record and record["evaluations"] == len(record["candidates"])
        want = [1 - qe_score({"src": sources[sid], "mt": c}) for c in record["candidates"]]
        assert record["risk"] == pytest.approx(want, abs=1e-5)
    predicts = [json.loads(line) for line in log.read_text().splitlines() if '"predict"' in line]
    assert predicts and all(set(s) == {"src", "mt"} for c in predicts for s in c["samples"])
