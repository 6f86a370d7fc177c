"""bench/bench_soft_beam.py --quick runs end to end and writes its rows. Timings
and memory are never asserted."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_soft_beam_quick(tmp_path):
    out = tmp_path / "sb.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_soft_beam.py"), "--quick", "--device",
                           "cpu", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = json.loads(out.read_text())
    assert [(r["model"], r["row"]) for r in rows] == [
        (m, r) for m in ("tagging", "transformer") for r in ("ce", "soft beam k=3", "soft beam k=5")]
    assert all(r["ms"] > 0 and "peak_mib" in r for r in rows)
