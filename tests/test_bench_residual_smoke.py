"""bench/bench_residual.py --quick runs end to end and writes its rows. Timings
are never asserted."""
from conftest import run_bench


def test_bench_residual_quick(tmp_path):
    rows = run_bench("bench_residual.py", tmp_path, timeout=300)
    assert [r["row"] for r in rows] == ["batched", "one at a time", "joint sampling n=10", "joint sampling n=100"]
    assert all(r["ms"] > 0 and r.get("energies_per_s", 1) > 0 for r in rows)
