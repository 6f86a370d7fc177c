"""bench/bench_soft_beam.py --quick runs end to end and writes its rows. Timings
and memory are never asserted."""
import pytest

from conftest import run_bench


@pytest.mark.slow  # a benchmark run end to end: in make test-full and CI
def test_bench_soft_beam_quick(tmp_path):
    rows = run_bench("bench_soft_beam.py", tmp_path, "--device", "cpu", "--compare-decoding", timeout=300)
    beams = ("ce", "soft beam k=3", "soft beam k=5")
    assert [(r["model"], r["row"]) for r in rows] == [("tagging", r) for r in beams] + [
        ("transformer", r) for r in beams + ("soft beam k=3, fairseq decoding", "soft beam k=5, fairseq decoding")]
    assert all(r["ms"] > 0 and "peak_mib" in r for r in rows)
