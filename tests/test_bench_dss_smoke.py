"""bench/bench_dss.py --quick runs end to end and writes its rows. Timings are
never asserted."""
from conftest import run_bench


def test_bench_dss_quick(tmp_path):
    rows = run_bench("bench_dss.py", tmp_path, "--device", "cpu", timeout=120)
    assert [(r["arch"], r["row"]) for r in rows][:5] == [
        ("transformer", "ce"), ("transformer", "dss soft-argmax"), ("transformer", "dss hard-argmax"),
        ("transformer", "dss soft-argmax P=2"), ("transformer", "dss soft-argmax P=3")]
    assert {r["arch"] for r in rows} == {"transformer", "lstm"}
    assert all(r["ratio"] > 0 and r["ms"] > 0 for r in rows)
    assert all(r["ratio"] == 1.0 for r in rows if r["row"] == "ce")
