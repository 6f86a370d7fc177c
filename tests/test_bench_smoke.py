"""bench/bench_decoding.py --quick runs end to end, writes its rows, and greedy decoding
agrees with SequenceGenerator in every greedy row. Timings are never asserted."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_decoding_quick(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "bench_decoding.py"), "--quick", "--device", "cpu",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows
    greedy = [r for r in rows if r["strategy"] == "greedy"]
    assert {r["model"] for r in greedy} == {"transformer", "lstm", "transformer_lm"}
    assert all(r["identical"] for r in greedy), [r for r in greedy if not r["identical"]]
    assert all(r["ours_ms"] > 0 and r["sg_ms"] > 0 for r in rows)
