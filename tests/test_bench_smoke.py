"""bench/bench_decoding.py --quick runs end to end, writes its rows, greedy decoding
agrees with SequenceGenerator in every greedy row, and the static-cache step gives
fairseq's incremental path's tokens in every row. Timings are never asserted."""
from conftest import run_bench


def test_bench_decoding_quick(tmp_path):
    rows = run_bench("bench_decoding.py", tmp_path, "--device", "cpu", timeout=120)["rows"]
    assert rows
    greedy = [r for r in rows if r["strategy"] == "greedy"]
    assert {r["model"] for r in greedy} == {"transformer", "lstm", "transformer_lm"}
    assert all(r["identical"] for r in greedy), [r for r in greedy if not r["identical"]]
    assert all(r["ours_ms"] > 0 and r["sg_ms"] > 0 and r["inc_ms"] > 0 for r in rows)
    assert all(r["same_as_incremental"] for r in rows), [r for r in rows if not r["same_as_incremental"]]
