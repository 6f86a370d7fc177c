"""bench/bench_mh.py --quick runs end to end and writes its rows. Timings are never
asserted."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_mh_quick(tmp_path):
    out = tmp_path / "mh.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_mh.py"), "--quick", "--device", "cpu",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = json.loads(out.read_text())
    assert [r["row"] for r in rows] == ["algorithm 4", "ours, one chain at a time", "ours, all chains"]
    # both of ours make one proposal per free position of every chain
    assert rows[1]["proposals"] == rows[2]["proposals"] > rows[0]["proposals"] > 0
