"""bench/bench_mgs.py --quick runs end to end and writes its speed and memory rows.
Timings and memory figures are never asserted."""
import pytest

from conftest import run_bench

SPEED_KEYS = {"batch_size", "candidates", "mgs_ms", "baseline_ms", "ratio", "target_ratio", "baseline_mle_step_ms",
              "baseline_decode_ms", "breakdown_ms", "max_len", "mean_len"}
BREAKDOWN_KEYS = {"decode", "score", "mle_grad", "perturb_restore", "draw", "direction", "surrogate", "other"}
MEMORY_KEYS = {"mode", "k", "params", "build_peak_mib", "peak_mib", "param_copy_mib", "above_mle_mib",
               "above_mle_param_copies", "deep_copy_mib"}
SUMMARY_KEYS = {"k_low", "k_high", "peak_diff_mib", "peak_diff_param_copies", "param_copy_mib", "deep_copy_diff_mib"}


@pytest.mark.slow  # a benchmark run end to end: in make test-full and CI
def test_bench_mgs_quick(tmp_path):
    result = run_bench("bench_mgs.py", tmp_path, "--device", "cpu", timeout=120)
    speed, memory = result["speed"], result["memory"]
    assert speed and all(SPEED_KEYS <= set(r) and BREAKDOWN_KEYS <= set(r["breakdown_ms"]) for r in speed)
    assert all(r["candidates"] == 4 for r in speed)
    assert all(MEMORY_KEYS <= set(r) for r in memory)
    assert [(r["mode"], r["k"]) for r in memory] == [("mle", 0), ("mgs", 2), ("mgs", 8)]
    assert SUMMARY_KEYS <= set(result["memory_summary"])
