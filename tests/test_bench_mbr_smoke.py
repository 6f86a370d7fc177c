"""bench/bench_mbr.py --quick runs end to end and writes its rows; ``ours, full matrix``
chooses what a brute force over sacrebleu's ``sentence_score`` chooses, and so does mbrs
where it is installed. Timings and memory figures are never asserted."""
import importlib.util

from sacrebleu.metrics import BLEU, CHRF

from conftest import run_bench

SCORERS = {"chrf": CHRF(char_order=6, word_order=0, beta=2), "sbleu": BLEU(smooth_method="exp", effective_order=True)}


def brute_force(scorer, strings):
    """(the first string of highest mean utility against all the strings, its lead over the best other one)."""
    mean = {h: sum(scorer.sentence_score(h, [r]).score for r in strings) / len(strings) for h in strings}
    ranked = sorted(mean, key=lambda h: -mean[h])  # stable: the first occurrence wins a tie
    return ranked[0], mean[ranked[0]] - mean[ranked[1]] if len(ranked) > 1 else float("inf")


def test_bench_mbr_quick(tmp_path):
    result = run_bench("bench_mbr.py", tmp_path, timeout=120)
    inputs = [[c for c, k in zip(x["candidates"], x["count"]) for _ in range(k)] for x in result["inputs"]]
    assert [len(s) for s in inputs] == [8, 8, 8]
    rows = {(r["metric"], r["row"]): r for r in result["rows"]}
    for metric, scorer in SCORERS.items():
        full, aggregated = rows[metric, "ours, full matrix"], rows[metric, "ours, reference aggregation"]
        assert full["evaluations"] == 3 * 8 * 8 and aggregated["evaluations"] == 3 * 8
        assert full["evaluations_per_s"] > 0 and aggregated["evaluations_per_s"] > 0
        best = [brute_force(scorer, s) for s in inputs]
        # both sides round utilities to float32, which may break a near-tie either way: the quick
        # candidates have none, so the choice is determined
        assert all(lead > 1e-3 for _, lead in best), best
        assert full["chosen"] == [b for b, _ in best]
        if importlib.util.find_spec("mbrs") is not None:
            assert result["settings"]["mbrs"], result["settings"]["mbrs_unavailable"]
            for (m, row), r in rows.items():
                if m == metric and row.startswith("mbrs, full matrix"):
                    assert r["agreement"] == 1.0, (row, r["chosen"])
    assert [(r["n"], r["metric"]) for r in result["memory"]] == [(16, "chrf"), (16, "sbleu"), (32, "chrf"),
                                                                 (32, "sbleu")]
