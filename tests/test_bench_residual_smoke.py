"""bench/bench_residual.py --quick runs end to end and writes its rows. Timings
are never asserted."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_residual_quick(tmp_path):
    out = tmp_path / "res.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_residual.py"), "--quick", "--json",
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = json.loads(out.read_text())
    assert [r["row"] for r in rows] == ["batched", "one at a time"]
    assert all(r["ms"] > 0 and r["energies_per_s"] > 0 for r in rows)
