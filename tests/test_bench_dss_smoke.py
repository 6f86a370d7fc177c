"""bench/bench_dss.py --quick runs end to end and writes its rows. Timings are
never asserted."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_dss_quick(tmp_path):
    out = tmp_path / "dss.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_dss.py"), "--quick", "--device", "cpu",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = json.loads(out.read_text())
    assert [(r["arch"], r["row"]) for r in rows][:5] == [
        ("transformer", "ce"), ("transformer", "dss soft-argmax"), ("transformer", "dss hard-argmax"),
        ("transformer", "dss soft-argmax P=2"), ("transformer", "dss soft-argmax P=3")]
    assert {r["arch"] for r in rows} == {"transformer", "lstm"}
    assert all(r["ratio"] > 0 and r["ms"] > 0 for r in rows)
    assert all(r["ratio"] == 1.0 for r in rows if r["row"] == "ce")
