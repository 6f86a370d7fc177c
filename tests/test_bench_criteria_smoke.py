"""bench/bench_criteria.py --quick runs every criterion row end to end and writes
its rows. Timings are never asserted."""
from conftest import run_bench


def test_bench_criteria_quick(tmp_path):
    rows = run_bench("bench_criteria.py", tmp_path, "--device", "cpu", timeout=300)
    assert [r["row"] for r in rows][0] == "ce" and len(rows) == 8
    assert all(r["ms"] > 0 for r in rows)
