"""bench/bench_criteria.py --quick runs every criterion row end to end and writes
its rows. Timings are never asserted."""
from conftest import run_bench


def test_bench_criteria_quick(tmp_path):
    rows = run_bench("bench_criteria.py", tmp_path, "--device", "cpu", "--op-counts", "--compare-decoding",
                     timeout=300)
    assert [r["row"] for r in rows][0] == "ce" and len(rows) == 14
    assert all(r["ms"] > 0 for r in rows)
    # operator calls per step (the GPU launch-bound proxy): CE's step is one teacher-forced
    # pass; every criterion that decodes step by step makes several times its calls, and
    # self-normalised CE adds only a logsumexp to CE
    calls = {r["row"]: r["aten_calls"] for r in rows}
    assert calls["ce"] < calls["self_normalized_ce"] < 1.5 * calls["ce"]
    assert all(calls[row] > 2 * calls["ce"] for row in calls if row not in ("ce", "self_normalized_ce"))
    # the static-cache decoding step makes fewer calls than fairseq's incremental path
    for row in ("dss soft-argmax", "soft_beam_direct_loss k=3", "soft_beam_hinge k=3", "mrt 4 samples",
                "pg 4 samples", "mgs K=4"):
        assert calls[row] < calls[f"{row}, fairseq decoding"], row
