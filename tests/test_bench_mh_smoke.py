"""bench/bench_mh.py --quick runs end to end and writes its rows. Timings are never
asserted."""
from conftest import run_bench


def test_bench_mh_quick(tmp_path):
    rows = run_bench("bench_mh.py", tmp_path, "--device", "cpu", timeout=300)
    assert [r["row"] for r in rows] == ["algorithm 4", "ours, one chain at a time", "ours, all chains"]
    # both of ours make one proposal per free position of every chain
    assert rows[1]["proposals"] == rows[2]["proposals"] > rows[0]["proposals"] > 0
