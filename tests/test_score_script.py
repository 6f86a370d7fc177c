"""Runs scripts/score/score.py as a subprocess on hand-written inputs."""
import json
import subprocess
import zlib
from pathlib import Path

import pytest
import torch

from conftest import REPO, cli_env
from fairseq_ext.evaluation import comparison

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "score" / "score.py"

# Ids out of order, log noise, a P- line; D- is the detokenized text that gets scored.
GENERATE_OUTPUT = """\
2024-01-01 12:00:00 | INFO | fairseq_cli.generate | loading model
S-1\tsource one
T-1\tthe cat sat on the mat
H-1\t-0.50\tthe cat sat on the mat
D-1\t-0.50\tthe cat sat on the mat
P-1\t-0.1 -0.2 -0.3 -0.4 -0.5 -0.6 -0.7
S-0\tsource zero
T-0\ta x c d
H-0\t-1.25\ta b c
D-0\t-1.25\ta b c
S-2\tsource two
T-2\tw w w w w
H-2\t-2.00\tw w w w w w w w
D-2\t-2.00\tw w w w w w w w
Generate test with beam=5: BLEU4 = 10.00
"""


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(["python", str(SCRIPT), *args], input=stdin, capture_output=True, text=True, cwd=REPO,
                          env=cli_env())


def test_generate_output_metrics(tmp_path):
    gen = tmp_path / "gen.out"
    gen.write_text(GENERATE_OUTPUT)
    out = tmp_path / "scores.json"
    proc = run(str(gen), "--max-len", "8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "corpus BLEU" in proc.stdout and "non-termination" in proc.stdout
    scores = json.loads(out.read_text())
    assert scores["n_sentences"] == 3
    # edit: "a b c" vs "a x c d" = 2/4; exact match 0; 8 w vs 5 w = 3/5
    assert scores["edit"] == pytest.approx((0.5 + 0.0 + 0.6) / 3, abs=1e-6)
    # rep-4: 8 "w" give 5 4-grams, 1 unique -> 0.8; the others repeat nothing
    assert scores["rep4"] == pytest.approx(0.8 / 3, abs=1e-6)
    # only the 8-token hypothesis reached --max-len 8
    assert scores["nonterm"] == pytest.approx(1 / 3, abs=1e-6)
    assert scores["avg_hyp_len"] == pytest.approx((3 + 6 + 8) / 3)
    assert 0.0 < scores["bleu"] < 100.0
    assert 0.0 < scores["sentence_bleu"] < 100.0


def test_generate_output_from_stdin_without_max_len():
    proc = run("--json", "-", stdin=GENERATE_OUTPUT)
    assert proc.returncode == 0, proc.stderr
    scores = json.loads(proc.stdout)
    assert scores["nonterm"] is None and scores["n_sentences"] == 3


def test_precisions_length_ratio_and_source_length_buckets(tmp_path):
    """Tables 5.5-5.6 breakdowns by hand: sentence 0 (source of 1 token) is exact,
    sentence 1 (source of 3 tokens) shares nothing. Matches / totals per n: 6/10,
    5/8, 4/6, 3/4; lengths 10 / 10; BLEU 100 in bucket 0-2, 0 in 2-4, none in 4+."""
    gen = tmp_path / "gen.out"
    gen.write_text("S-0\ta\nT-0\tthe cat sat on the mat\nH-0\t-1.0\tthe cat sat on the mat\n"
                   "S-1\tb b b\nT-1\tx y z w\nH-1\t-1.0\tp q r s\n")
    proc = run(str(gen), "--length-buckets", "2,4", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    scores = json.loads(proc.stdout)
    assert scores["precisions"] == pytest.approx([60.0, 62.5, 400 / 6, 75.0])
    assert scores["length_ratio"] == pytest.approx(1.0)
    buckets = scores["bleu_by_source_length"]
    assert list(buckets) == ["0-2", "2-4", "4+"]
    assert buckets["0-2"] == pytest.approx(100.0) and buckets["2-4"] == pytest.approx(0.0) and buckets["4+"] is None
    table = run(str(gen), "--length-buckets", "2,4").stdout
    assert "n-gram precisions" in table and "BLEU, source 4+" in table
    for bad, message in (("4,2", "increasing"), ("a", "integers")):
        proc = run(str(gen), "--length-buckets", bad)
        assert proc.returncode != 0 and "--length-buckets" in proc.stderr and message in proc.stderr
    no_src = tmp_path / "nosrc.out"
    no_src.write_text("T-0\ta b\nH-0\t-1.0\ta b\n")
    proc = run(str(no_src), "--length-buckets", "2")
    assert proc.returncode != 0 and "needs sources" in proc.stderr and str(no_src) in proc.stderr
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b\n")
    ref.write_text("a b\n")
    proc = run("--hyp", str(hyp), "--ref", str(ref), "--length-buckets", "2")
    assert proc.returncode != 0 and "needs sources" in proc.stderr and str(hyp) in proc.stderr


def test_identical_text_files_with_sentencepiece(tmp_path):
    lines = ["\u2581the \u2581c at \u2581sat", " ".join("\u2581" + w for w in "abcdabcd")]
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("\n".join(lines) + "\n")
    ref.write_text("\n".join(lines) + "\n")
    proc = run("--hyp", str(hyp), "--ref", str(ref), "--bpe-symbol", "sentencepiece", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    scores = json.loads(proc.stdout)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["sentence_bleu"] == pytest.approx(100.0)
    assert scores["edit"] == 0.0
    assert scores["rep4"] == pytest.approx(0.2 / 2, abs=1e-6)  # "a b c d a b c d": 1 - 4/5
    assert scores["avg_hyp_len"] == pytest.approx((3 + 8) / 2)  # "c at" was joined into "cat"
    assert scores["n_sentences"] == 2


@pytest.mark.parametrize("ref_line,scheme", [
    ("\u2581the \u2581c at \u2581sat \u2581on \u2581the \u2581m at", "sentencepiece"),
    ("the c@@ at sat on the m@@ at", "subword_nmt"),
])
def test_subword_pieces_without_bpe_symbol_warn(tmp_path, ref_line, scheme):
    """Text that still carries subword marks is scored (as asked) but said to be pieces."""
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text(ref_line + "\n")
    ref.write_text(ref_line + "\n")
    proc = run("--hyp", str(hyp), "--ref", str(ref), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert "warning" in proc.stderr and f"pass --bpe-symbol {scheme}" in proc.stderr
    assert json.loads(proc.stdout)["avg_hyp_len"] == 8  # pieces, not the 6 words
    proc = run("--hyp", str(hyp), "--ref", str(ref), "--bpe-symbol", scheme, "--json", "-")
    assert "warning" not in proc.stderr and json.loads(proc.stdout)["avg_hyp_len"] == 6


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.out"
    proc = run(str(missing))
    assert proc.returncode != 0
    assert f"{missing}: no such file" in proc.stderr


def test_file_without_hypotheses_is_named(tmp_path):
    gen = tmp_path / "empty.out"
    gen.write_text("S-0\tsource\nT-0\ttarget\n")
    proc = run(str(gen))
    assert proc.returncode != 0
    assert f"{gen}: no H- lines" in proc.stderr


def test_mismatched_line_counts(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b\nc d\n")
    ref.write_text("a b\n")
    proc = run("--hyp", str(hyp), "--ref", str(ref))
    assert proc.returncode != 0
    assert f"{hyp} has 2 lines but {ref} has 1" in proc.stderr


def test_dss_table_columns_per_suffix(tmp_path):
    """examples/dss/table.py: one dev / test column pair per --suffix, mean [min, max] over seeds; a seed
    counts only with every suffix scored."""
    table = Path(__file__).resolve().parents[1] / "examples" / "dss" / "table.py"
    for seed, f1 in ((1, 80.0), (2, 82.0)):
        d = tmp_path / f"run.s{seed}"
        d.mkdir()
        for split in ("valid", "test"):
            for mode, bonus in ((".greedy", 0.0), (".soft", 1.0)):
                (d / f"{split}{mode}.json").write_text(json.dumps({"scheme": "chunk", "f1": f1 + bonus}))
    (tmp_path / "run.s3").mkdir()
    (tmp_path / "run.s3" / "valid.greedy.json").write_text(json.dumps({"scheme": "chunk", "f1": 0.0}))
    out = subprocess.run(["python", str(table), str(tmp_path), "run", "--suffix", ".greedy", "--suffix", ".soft",
                          "--markdown"], check=True, capture_output=True, text=True, env=cli_env()).stdout.splitlines()
    assert out[0] == "| run | greedy dev | greedy test | soft dev | soft test | seeds |"
    assert out[2] == ("| run | 81.00 [80.00, 82.00] | 81.00 [80.00, 82.00] | 82.00 [81.00, 83.00] "
                      "| 82.00 [81.00, 83.00] | 2 |")
    std = subprocess.run(["python", str(table), str(tmp_path), "run", "--suffix", ".greedy", "--std"],
                         check=True, capture_output=True, text=True, env=cli_env()).stdout.splitlines()
    assert std[2].split() == ["run", "81.00", "+-", "1.41", "81.00", "+-", "1.41", "2"]  # sample std of 80, 82


def test_dss_table_protocol_selects_on_the_tuning_seed(tmp_path):
    """examples/dss/table.py --select / --protocol (the thesis's rule): the config is chosen by the tuning
    seed's dev F1 alone (k10 wins on seed 1 although k1 has the best dev over all seeds); the reported
    restart is the best on dev among that config's seeds (seed 3: test 70, not the best test 75); the mean
    +- sample std is over all its restarts; --prefix restricts the choice; --best names that restart."""
    table = Path(__file__).resolve().parents[1] / "examples" / "dss" / "table.py"
    runs = {("k1", 1): (80.0, 70.0), ("k1", 2): (90.0, 71.0), ("k10", 1): (81.0, 75.0), ("k10", 2): (79.0, 72.0),
            ("k10", 3): (83.0, 70.0)}
    for (cfg, seed), (dev, test) in runs.items():
        d = tmp_path / f"ss.{cfg}.s{seed}"
        d.mkdir()
        for split, f1 in (("valid", dev), ("test", test)):
            (d / f"{split}.json").write_text(json.dumps({"scheme": "chunk", "f1": f1}))

    def out(*args):
        return subprocess.run(["python", str(table), str(tmp_path), "ss", *args], check=True,
                              capture_output=True, text=True, env=cli_env()).stdout.splitlines()

    assert out("--select") == ["k10"]
    assert out("--select", "--tune-seed", "2") == ["k1"]
    assert out("--select", "--tune-seed", "2", "--prefix", "k10") == ["k10"]
    proc = subprocess.run(["python", str(table), str(tmp_path), "ss", "--select", "--prefix", "k1_"],
                          capture_output=True, text=True, env=cli_env())
    assert proc.returncode != 0 and "no scored ss.CONFIG.s1 run" in proc.stderr
    rows = out("--protocol", "--markdown", "--grid")
    # k10: dev 81, 79, 83 -> mean 81, std 2; test 75, 72, 70 -> mean 72.33, std 2.52
    assert rows[2] == "| ss | k10 | 83.00 | 70.00 | 81.00 +- 2.00 | 72.33 +- 2.52 | 3 |"
    assert rows[-2:] == ["| ss | k1 | 80.00 | 70.00 |", "| ss | k10 | 81.00 | 75.00 |"]
    assert out("--protocol", "--markdown", "--tune-seed", "2")[2] == \
        "| ss | k1 | 90.00 | 71.00 | 85.00 +- 7.07 | 70.50 +- 0.71 | 2 |"
    # --best: the reported run itself (k10's best dev is seed 3's 83; with tuning seed 2, k1's is seed 2's 90)
    assert out("--best") == ["k10 3"]
    assert out("--best", "--tune-seed", "2") == ["k1 2"]


def _generate_output(hyps, refs):
    return "".join(f"S-{i}\tsrc\nT-{i}\t{r}\nH-{i}\t-0.5\t{h}\nD-{i}\t-0.5\t{h}\n" for i, (h, r) in enumerate(zip(hyps, refs)))


def test_compare_runs_bleu_details_by_hand(tmp_path):
    """--bleu-details: a system that drops the last of 6 reference words in every
    sentence has every n-gram precision 100, length ratio 5/6 and brevity penalty
    exp(1 - 6/5) = 0.819; the exact copy has 1, 1 and 100."""
    from conftest import run_cli

    refs = [f"w{i} a b c d e" for i in range(30)]
    exact, short = tmp_path / "exact.out", tmp_path / "short.out"
    exact.write_text(_generate_output(refs, refs))
    short.write_text(_generate_output([r.rsplit(" ", 1)[0] for r in refs], refs))
    out = run_cli(["python", str(Path(__file__).resolve().parents[1] / "scripts" / "score" / "compare_runs.py"),
                   "--control", "exact", f"exact={exact}", f"short={short}", "--bleu-details", "--bootstrap", "50"]
                  ).stdout.splitlines()
    assert out[-2] == "| exact | 1.000 | 1.000 | 100.00 | 100.00 | 100.00 | 100.00 |"
    assert out[-1] == "| short | 0.819 | 0.833 | 100.00 | 100.00 | 100.00 | 100.00 |"


def test_compare_runs_means_and_paired_tests(tmp_path):
    """scripts/score/compare_runs.py on written runs of 60 sentences, two seeds each: a
    system equal to the references has BLEU 100, edit 0 and length 6 in every seed
    (std 0); the control is right in 1 sentence of 3 (the others are the reference
    reversed, edit > 0.5 on average); the perfect system beats it with pooled p < 0.01
    and its edit difference is minus the control's; a copy of the control differs by
    0 with p = 1 on the sentence-level metrics; seed counts must match."""
    import random

    from conftest import run_cli

    words = "a man in a red shirt is riding a bike down the street".split()
    rng = random.Random(0)
    refs = [" ".join(rng.sample(words, 6)) for _ in range(60)]
    wrong = [" ".join(r.split()[::-1]) for r in refs]
    files = {}
    for name, hyps in (("ctrl", [r if i % 3 == 0 else w for i, (r, w) in enumerate(zip(refs, wrong))]),
                       ("perfect", refs)):
        files[name] = []
        for seed in (1, 2):
            path = tmp_path / f"{name}{seed}.out"
            path.write_text(_generate_output(hyps, refs))
            files[name].append(str(path))
    out = tmp_path / "cmp.json"
    run_cli(["python", "scripts/score/compare_runs.py", "--control", "ctrl", f"ctrl={','.join(files['ctrl'])}",
             f"perfect={','.join(files['perfect'])}", f"copy={','.join(files['ctrl'])}", "--json", str(out),
             "--bootstrap", "200"])
    res = json.loads(out.read_text())
    assert res["perfect"]["mean"]["bleu"] == pytest.approx(100.0) and res["perfect"]["std"]["bleu"] == 0.0
    assert res["perfect"]["mean"]["edit"] == 0.0 and res["perfect"]["mean"]["avg_hyp_len"] == 6.0
    # a reversed 6-word sentence: positions 0-5 against 5-0, every token moved
    assert res["ctrl"]["mean"]["edit"] > 0.5 and res["perfect"]["diff"]["edit"] == pytest.approx(
        -res["ctrl"]["mean"]["edit"])
    assert res["perfect"]["p_value_pooled"]["bleu"] < 0.01 and res["perfect"]["p_value_pooled"]["edit"] < 0.01
    assert res["copy"]["diff"]["sentence_bleu"] == 0.0 and res["copy"]["p_value_pooled"]["sentence_bleu"] == 1.0
    with pytest.raises(AssertionError, match="paired by position"):
        run_cli(["python", "scripts/score/compare_runs.py", "--control", "ctrl", f"ctrl={','.join(files['ctrl'])}",
                 f"one={files['perfect'][0]}"])
    # text completion's non-termination (--max-len 8): a continuation of 8 tokens did not end; "long" has
    # 8 tokens in every other sentence of seed 1 and in none of seed 2
    long_hyps = [r + " a a" if i % 2 == 0 else r for i, r in enumerate(refs)]
    (tmp_path / "long1.out").write_text(_generate_output(long_hyps, refs))
    run_cli(["python", "scripts/score/compare_runs.py", "--control", "perfect", f"perfect={','.join(files['perfect'])}",
             f"long={tmp_path / 'long1.out'},{files['perfect'][1]}", "--max-len", "8", "--metrics", "nonterm",
             "--json", str(out), "--bootstrap", "200"])
    res = json.loads(out.read_text())
    assert res["long"]["per_seed"][0]["nonterm"] == 0.5 and res["long"]["per_seed"][1]["nonterm"] == 0.0
    assert res["perfect"]["mean"]["nonterm"] == 0.0 and res["long"]["diff"]["nonterm"] == pytest.approx(0.25)
    assert res["long"]["p_value"]["nonterm"][0] < 0.01 and res["long"]["p_value"]["nonterm"][1] == 1.0


def test_compare_runs_chrf_is_sacrebleus_corpus_chrf(tmp_path):
    """compare_runs.py's chrF on two hand-written runs (punctuation, different lengths)
    is sacrebleu.corpus_chrf of the same strings (chrF2: character 6-grams, no word
    n-grams), per seed, as the mean, as the difference and in the printed cell; the
    header line states those settings."""
    import sacrebleu

    from conftest import run_cli

    refs = ["the cat sat on the mat .", "a man is riding a red bike down the street", "two dogs play in the snow",
            "she reads a book at home"]
    hyps = {"a": ["the cat sat on a mat", "a man rides a bike on the street", "dogs are playing in snow",
                  "she is reading at home"],
            "b": ["the cat is on the mat .", "a man is riding a bike down the road", "two dogs play in the white snow",
                  "she reads a book"]}
    for name, h in hyps.items():
        (tmp_path / f"{name}.out").write_text(_generate_output(h, refs))
    out = tmp_path / "cmp.json"
    stdout = run_cli(["python", "scripts/score/compare_runs.py", "--control", "a", f"a={tmp_path / 'a.out'}",
                      f"b={tmp_path / 'b.out'}", "--bootstrap", "50", "--json", str(out)]).stdout.splitlines()
    res = json.loads(out.read_text())
    chrf = {name: sacrebleu.corpus_chrf(h, [refs]).score for name, h in hyps.items()}
    for name in hyps:
        assert res[name]["per_seed"][0]["chrf"] == pytest.approx(chrf[name], abs=1e-9)
        assert res[name]["mean"]["chrf"] == pytest.approx(chrf[name], abs=1e-9)
    assert res["b"]["diff"]["chrf"] == pytest.approx(chrf["b"] - chrf["a"], abs=1e-9)
    assert stdout[1] == ("chrf: sacrebleu chrF2 (char order 6, word order 0, beta 2), "
                         f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{sacrebleu.__version__}")
    assert stdout[3].split(" | ")[3] == "chrf"
    assert stdout[-1].split(" | ")[3].startswith(f"{chrf['b']:.2f} +- 0.00 ({chrf['b'] - chrf['a']:+.2f}; p = ")


def test_compare_runs_chrf_bootstrap_scores_resamples_from_summed_statistics(monkeypatch):
    """The paired bootstrap's chrF of a resample, computed from the summed per-sentence
    statistics, is sacrebleu.corpus_chrf of the resampled sentences, for the system and
    the baseline on each of 5 resamples (drawn as sacrebleu draws them, seed 12345):
    the summed statistics are the resampled corpus's exactly; the score, which
    sacrebleu computes from a float32 sum, to float32 rounding, and from the exact
    integer sum to 1e-9."""
    import random

    import numpy as np
    import sacrebleu
    from sacrebleu.metrics import CHRF

    class RecordedCHRF(CHRF):
        """CHRF recording every (summed statistics, score) it computes."""

        def __init__(self):
            super().__init__()
            self.scored = {}

        def _compute_score_from_stats(self, stats):
            score = super()._compute_score_from_stats(stats)
            self.scored[tuple(int(x) for x in stats)] = score.score
            return score

    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    words = "a man in a red shirt is riding a bike down the street , two dogs play .".split()
    rng = random.Random(0)
    refs = [" ".join(rng.sample(words, rng.randint(3, 9))) for _ in range(25)]
    hyps = [" ".join(rng.sample(r.split(), len(r.split())) + rng.sample(words, i % 3)) for i, r in enumerate(refs)]
    base = [" ".join(r.split()[: len(r.split()) // 2]) for r in refs]
    metric = RecordedCHRF()
    comparison.paired_bootstrap_corpus(hyps, base, refs, 5, metric)
    resamples = np.random.default_rng(12345).choice(len(refs), size=(5, len(refs)), replace=True)
    for idx in resamples:
        for sents in (hyps, base):
            h, r = [sents[i] for i in idx], [refs[i] for i in idx]
            stats = tuple(int(x) for x in np.sum(CHRF()._extract_corpus_statistics(h, [r]), 0))
            expected = sacrebleu.corpus_chrf(h, [r]).score
            assert stats in metric.scored, "a resample the bootstrap did not score"
            assert metric.scored[stats] == pytest.approx(expected, abs=1e-4)
            assert CHRF()._compute_score_from_stats(list(stats)).score == pytest.approx(expected, abs=1e-9)


def test_compare_runs_chrf_paired_bootstrap_floor_and_sign(tmp_path):
    """A system equal to the references (chrF 100) against a control of random letters
    (chrF near 0), two seeds: the difference is 100 minus the control's chrF, positive,
    with p at the bootstrap's floor 1 / (50 + 1) per seed and pooled; against a
    control of references the garbage system's difference is negative; a copy of the
    control differs by 0."""
    import random

    import sacrebleu

    from conftest import run_cli

    words = "a man in a red shirt is riding a bike down the street".split()
    rng = random.Random(1)
    refs = [" ".join(rng.sample(words, 6)) for _ in range(30)]
    files = {"garbage": [], "perfect": []}
    garbage = []
    for seed in (1, 2):
        garbage.append([" ".join("".join(rng.choice("qxzjvk") for _ in range(5)) for _ in range(4)) for _ in refs])
        for name, hyps in (("garbage", garbage[-1]), ("perfect", refs)):
            path = tmp_path / f"{name}{seed}.out"
            path.write_text(_generate_output(hyps, refs))
            files[name].append(str(path))
    out = tmp_path / "cmp.json"
    spec = {name: f"{name}={','.join(paths)}" for name, paths in files.items()}
    run_cli(["python", "scripts/score/compare_runs.py", "--control", "garbage", spec["garbage"], spec["perfect"],
             f"copy={','.join(files['garbage'])}", "--bootstrap", "50", "--json", str(out)])
    res = json.loads(out.read_text())
    garbage_chrf = [sacrebleu.corpus_chrf(g, [refs]).score for g in garbage]
    assert max(garbage_chrf) < 5 and res["perfect"]["mean"]["chrf"] == pytest.approx(100.0)
    assert res["perfect"]["diff"]["chrf"] == pytest.approx(100.0 - sum(garbage_chrf) / 2, abs=1e-9)
    assert res["perfect"]["diff"]["chrf"] > 0
    assert res["perfect"]["p_value"]["chrf"] == [1 / 51, 1 / 51] and res["perfect"]["p_value_pooled"]["chrf"] == 1 / 51
    assert res["copy"]["diff"]["chrf"] == 0.0
    run_cli(["python", "scripts/score/compare_runs.py", "--control", "perfect", spec["perfect"], spec["garbage"],
             "--bootstrap", "50", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["garbage"]["diff"]["chrf"] == pytest.approx(sum(garbage_chrf) / 2 - 100.0, abs=1e-9)
    assert res["garbage"]["p_value_pooled"]["chrf"] == 1 / 51


def test_dss_table_welch_p_values_match_t_tables(tmp_path):
    """dss_table.py --control: Welch's two-sided p (fairseq_ext.evaluation.comparison's incomplete beta) against printed t tables
    (df 1, 4, 10 at their 5% / 1% critical values) and a hand-computed Welch case (1,2,3 vs 4,5,6: t = -3.674,
    df = 4, p = 0.0213), and the column it prints for two runs."""
    for df, t, p in ((1, 12.706, 0.05), (4, 2.776, 0.05), (10, 3.169, 0.01), (4, 4.604, 0.01)):
        assert comparison.betainc(df / 2, 0.5, df / (df + t * t)) == pytest.approx(p, abs=2e-4)
    diff, p = comparison.welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert diff == -3.0 and p == pytest.approx(0.0213, abs=1e-4)
    assert comparison.welch([1.0], [2.0, 3.0])[1] is None
    for name, f1s in (("ce_ft", (75.0, 76.0, 74.0)), ("dl", (77.0, 78.0, 76.0))):
        for seed, f1 in enumerate(f1s, 1):
            run = tmp_path / f"{name}.s{seed}"
            run.mkdir()
            for split in ("valid", "test"):
                (run / f"{split}.hard.json").write_text(json.dumps({"scheme": "chunk", "f1": f1}))
    script = Path(__file__).resolve().parents[1] / "examples" / "dss" / "table.py"
    rows = subprocess.run(["python", str(script), str(tmp_path), "ce_ft", "dl", "--suffix", ".hard", "--std",
                           "--control", "ce_ft", "--markdown"], check=True, capture_output=True,
                          text=True, env=cli_env()).stdout.splitlines()
    # t = 2 / sqrt(2/3) = 2.449, df = 4: two-sided p = 0.070
    assert rows[3] == "| dl | 77.00 +- 1.00 | 77.00 +- 1.00 | +2.00, p = 0.07 | 3 |"


def test_task_loss_of_the_users_own_cost_reads_the_sources(tmp_path):
    """--task-loss as the criteria take it: a cost from the user's module (tests/user_costs.py,
    |words(hyp) - words(source)| / 10 on the S- lines) weighted with edit; by hand:
    LengthGap (0.4 + 0.1 + 0.6) / 3, edit (0 + 2/4 + 3/5) / 3, total 2 x 0.3667 + 0.3667."""
    gen = tmp_path / "gen.out"
    gen.write_text(GENERATE_OUTPUT)
    env = cli_env(PYTHONPATH=f"{REPO}:{REPO}/tests")
    proc = subprocess.run(["python", str(SCRIPT), str(gen), "--task-loss", "user_costs:LengthGap=2,edit=1",
                           "--json", "-"], capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["cost_user_costs:LengthGap"] == pytest.approx(1.1 / 3)
    assert out["cost_edit"] == pytest.approx(1.1 / 3)
    assert out["task_loss"] == pytest.approx(1.1)
    # a neural cost that encodes its sources in prepare (examples/mgs/my_costs.py): set up and
    # prepared as the criteria do; by hand, 1 - cosine of the mean rows of the hashed words
    env = cli_env(PYTHONPATH=f"{REPO}:{REPO}/tests:{REPO}/examples/mgs")
    proc = subprocess.run(["python", str(SCRIPT), str(gen), "--task-loss", "my_costs:EmbeddingSimilarity",
                           "--json", "-"], capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    table = torch.empty(4096, 32)
    torch.nn.init.normal_(table, generator=torch.Generator().manual_seed(0))

    def mean_row(sentence):
        return torch.stack([table[zlib.crc32(w.encode()) % 4096] for w in sentence.split()]).mean(0)
    pairs = [("a b c", "source zero"), ("the cat sat on the mat", "source one"), ("w w w w w w w w", "source two")]
    by_hand = [1 - torch.nn.functional.cosine_similarity(mean_row(h), mean_row(x), dim=0).item() for h, x in pairs]
    assert json.loads(proc.stdout)["cost_my_costs:EmbeddingSimilarity"] == pytest.approx(sum(by_hand) / 3, abs=1e-6)
    for spec, message in (("nosuchcost", "--task-loss must be a task loss or a weighted sum of them"),
                          ("lm", "--task-loss: 'lm' takes token ids")):
        proc = subprocess.run(["python", str(SCRIPT), str(gen), "--task-loss", spec], capture_output=True,
                              text=True, cwd=REPO, env=env)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
            f"score.py: error: {message}"), proc.stderr


def test_compare_runs_scores_the_raw_references_with_ref_and_prints_only_its_table(tmp_path):
    """fairseq-generate's T- lines are rebuilt from the binarized data (here: a double space
    collapsed, a tab dropped); --ref scores the raw reference file instead, line i for sentence
    id i. Without --ref the T- lines are scored. stdout holds the table only (no sacrebleu INFO)."""
    import sacrebleu

    from conftest import run_cli

    raw = ["the cat  sat on the mat .", "a man is riding\ta bike", "two dogs play in the snow"]
    t_lines = ["the cat sat on the mat .", "a man is ridinga bike", "two dogs play in the snow"]
    hyps = {"a": ["the cat sat on the mat", "a man is riding a bike", "two dogs play"],
            "b": ["the cat sat on the mat .", "a man rides a bike", "dogs play in the snow"]}
    for name, h in hyps.items():
        (tmp_path / f"{name}.out").write_text(_generate_output(h, t_lines))
    (tmp_path / "ref.txt").write_text("\n".join(raw) + "\n")
    for refs, extra in ((raw, ["--ref", str(tmp_path / "ref.txt")]), (t_lines, [])):
        out = tmp_path / "cmp.json"
        proc = run_cli(["python", "scripts/score/compare_runs.py", "--control", "a", f"a={tmp_path / 'a.out'}",
                        f"b={tmp_path / 'b.out'}", "--bootstrap", "20", "--json", str(out), *extra])
        res = json.loads(out.read_text())
        for name, h in hyps.items():
            assert res[name]["per_seed"][0]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(h, [refs]).score, abs=1e-9)
        assert "INFO" not in proc.stdout
    assert sacrebleu.corpus_bleu(hyps["b"], [raw]).score != sacrebleu.corpus_bleu(hyps["b"], [t_lines]).score


def test_selection_table_reads_the_kept_records(tmp_path):
    """scripts/report/selection_table.py: the validation columns are the selection.json records
    as written by fairseq_ext.finetune, the test columns compare_runs.py's numbers (sacrebleu's
    corpus BLEU of the written outputs), the control first, the start last."""
    import sacrebleu

    from conftest import run_cli

    refs = ["the cat sat on the mat .", "a man is riding a bike", "two dogs play in the snow", "she reads a book"]
    hyps = {"mle_lr3e-4": ["the cat sat on a mat", "a man rides a bike", "two dogs play in snow", "she reads"],
            "mrt_lr1e-4": ["the cat sat on the mat .", "a man is riding a bike", "dogs play", "she reads a book"],
            "start": ["a cat", "a man is riding", "two dogs play in the snow", "she reads a book ."]}
    for name, h in hyps.items():
        (tmp_path / f"{name}.out").write_text(_generate_output(h, refs))
    results = tmp_path / "results"
    results.mkdir()
    run_cli(["python", "scripts/score/compare_runs.py", "--control", "mle_lr3e-4",
             *[f"{n}={tmp_path / n}.out" for n in hyps], "--bootstrap", "20", "--json",
             str(results / "compare.test.json")])
    records = {"mle_lr3e-4": {"start": 36.63, "best": 37.29, "best_update": 90, "last": 37.0, "last_update": 300,
                              "selected": "update 90"},
               "mrt_lr1e-4": {"start": 36.63, "best": 36.63, "best_update": 0, "last": 35.1, "last_update": 300,
                              "selected": "start"}}
    for name, r in records.items():
        (results / f"{name}.s1.selection.json").write_text(json.dumps(r))
    out = run_cli(["python", "scripts/report/selection_table.py", str(results)]).stdout.splitlines()
    bleu = {n: sacrebleu.corpus_bleu(h, [refs]).score for n, h in hyps.items()}
    assert out[0].startswith("| run | seeds | valid BLEU: start | best (update) | last | checkpoint_best.pt |")
    assert out[2].startswith(f"| mle, lr 3e-4 | 1 | 36.63 | 37.29 (90) | 37.00 | update 90 | {bleu['mle_lr3e-4']:.2f} "
                             "(control) |"), out[2]
    diff = bleu["mrt_lr1e-4"] - bleu["mle_lr3e-4"]
    assert out[3].startswith(f"| mrt, lr 1e-4 | 1 | 36.63 | 36.63 (0) | 35.10 | start | {bleu['mrt_lr1e-4']:.2f} "
                             f"({diff:+.2f}, p "), out[3]
    assert out[4].startswith(f"| start (MLE, best validation loss) |") and f"{bleu['start']:.2f}" in out[4]
