"""bench/bench_soft_beam.py --quick runs end to end and writes its rows. Timings
and memory are never asserted."""
import pytest

from conftest import run_bench


@pytest.mark.slow  # a benchmark run end to end: in make test-full and CI
def test_bench_soft_beam_quick(tmp_path):
    rows = run_bench("bench_soft_beam.py", tmp_path, "--device", "cpu", timeout=300)
    assert [(r["model"], r["row"]) for r in rows] == [
        (m, r) for m in ("tagging", "transformer") for r in ("ce", "soft beam k=3", "soft beam k=5")]
    assert all(r["ms"] > 0 and "peak_mib" in r for r in rows)
