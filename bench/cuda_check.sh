#!/usr/bin/env bash
# The CUDA check: the CUDA-only tests and the benchmarks on a CUDA device, and a short report.
# Run `bash bench/cuda_check.sh --help` for the usage; docs/performance.md ("CUDA") for what the
# tests and benchmarks measure and the numbers of one H100.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: bash bench/cuda_check.sh [options] OUT_DIR
       bash bench/cuda_check.sh --report OUT_DIR

Runs on a machine whose torch sees a CUDA device, with fairseq and this package installed
(e.g. make install TORCH_SPEC="torch==2.13.0 --index-url <a CUDA wheel index>"), from any
directory (it works in the checkout that holds it, which comes first on PYTHONPATH):

  1. the CUDA-only tests, tests/test_gpu.py (mixed precision through fairseq-train, every
     criterion's updates in fp16, CUDA decoding and sampling)  -> OUT_DIR/tests.log, tests.xml
  2. the benchmarks with --device cuda, each against its baseline measured in the same run:
     bench_criteria (with --compare-decoding --op-counts), bench_criteria_iwslt (bench_criteria.py
     --size iwslt --compare-decoding: transformer_iwslt_de_en's shape, 4,096-token batches),
     bench_criteria_lstm (bench_criteria.py --arch lstm --compare-decoding --op-counts: the lstm's
     step), bench_criteria_amp (bench_criteria.py --amp), bench_criteria_compile (bench_criteria.py
     --compile --op-counts: DSS's and the soft beam's steps compiled by torch.compile, the
     experimental option off by default), bench_dss, bench_soft_beam,
     bench_mgs, bench_mh, bench_decoding (not bench_residual.py: it times the CPU only)
                                                                -> OUT_DIR/NAME.log, NAME.json
  3. OUT_DIR/report.md: torch / CUDA / GPU versions, the tests' pass / fail / skip counts and
     failures, each benchmark's exit status and ratio table; OUT_DIR/env.txt

options:
  -k EXPR               run only the tests that match EXPR (pytest -k)
  --no-tests            run no test
  --benches "A B ..."   run only these benchmarks (names as in 2.; "" for none)
  --quick               benchmarks with --quick: tiny models, a smoke run
  --workers N           pytest-xdist workers for the tests (default: the cores, at most 12;
                        0: one process; without pytest-xdist installed: one process)
  --test-timeout S      per-test limit in seconds (with pytest-timeout installed; default 300)
  --bench-timeout S     per-benchmark limit in seconds (default 1800)
  --report              only write OUT_DIR/report.md again from the files in OUT_DIR
  -h, --help            this text

environment: PYTHON (the interpreter; default python3, or python where there is no python3)

exit status: 0 every test passed and every benchmark finished; 1 a test failed or errored,
no test passed (all skipped, or none selected), or a benchmark failed or ran out of time; 2 a usage error, or no CUDA device
(nothing is run then).
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$(command -v python3 || command -v python || echo python3)}
ALL_BENCHES="bench_criteria bench_criteria_iwslt bench_criteria_lstm bench_criteria_amp bench_criteria_compile bench_dss bench_soft_beam bench_mgs bench_mh bench_decoding"
BENCHES=$ALL_BENCHES
KEXPR="" TESTS=1 QUICK="" WORKERS="" TEST_TIMEOUT=300 BENCH_TIMEOUT=1800 REPORT_ONLY=0 OUT=""
die() { echo "cuda_check.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -k) [ $# -ge 2 ] || die "-k needs an expression"; KEXPR=$2; shift ;;
    --no-tests) TESTS=0 ;;
    --benches) [ $# -ge 2 ] || die "--benches needs a list (\"\" for none)"; BENCHES=$2; shift ;;
    --quick) QUICK=--quick ;;
    --workers) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--workers needs a number"; WORKERS=$2; shift ;;
    --test-timeout) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--test-timeout needs seconds"; TEST_TIMEOUT=$2; shift ;;
    --bench-timeout) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--bench-timeout needs seconds"; BENCH_TIMEOUT=$2; shift ;;
    --report) REPORT_ONLY=1 ;;
    -*) die "unknown option $1 (--help for the usage)" ;;
    *) [ -z "$OUT" ] || die "one OUT_DIR only (got $OUT and $1)"; OUT=$1 ;;
  esac
  shift
done
[ -n "$OUT" ] || { usage >&2; exit 2; }
for b in $BENCHES; do
  [[ " $ALL_BENCHES " == *" $b "* ]] || die "unknown benchmark $b (known: $ALL_BENCHES)"
done

report() {  # OUT_DIR/report.md from env.txt, tests.xml (or tests.log), benches.tsv and the benchmarks' JSON
  "$PY" - "$OUT" <<'PY'
import json, os, re, sys
import xml.etree.ElementTree as ET

out = sys.argv[1]
lines = ["# CUDA check", ""]
env = os.path.join(out, "env.txt")
if os.path.exists(env):
    lines += ["Environment:", "", "```", open(env).read().strip(), "```", ""]

# tests: counts from the JUnit XML, or from the summary line of the log
xml, log = os.path.join(out, "tests.xml"), os.path.join(out, "tests.log")
failed_names = []
if os.path.exists(xml):
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    root = ET.parse(xml).getroot()
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for k in counts:
            counts[k] += int(suite.get(k, 0))
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed_names.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    lines.append(f"Tests (tests/test_gpu.py): {passed} passed, {counts['failures']} failed, "
                 f"{counts['errors']} errors, {counts['skipped']} skipped, of {counts['tests']}.")
elif os.path.exists(log):
    summary = [l for l in open(log, errors="replace") if re.search(r"\d+ (passed|failed|error)", l)]
    lines.append("Tests (tests/test_gpu.py): " + (summary[-1].strip(" =\n") if summary else "no summary line in tests.log"))
    failed_names = [l.split()[1] for l in open(log, errors="replace") if l.startswith(("FAILED ", "ERROR "))]
else:
    lines.append("Tests: not run.")
lines += [f"- failed: `{n}`" for n in failed_names]
lines.append("")

# benchmarks: exit status and time, then each one's ratios
status = {}
tsv = os.path.join(out, "benches.tsv")
if os.path.exists(tsv):
    for l in open(tsv):
        name, rc, secs = l.split()
        status[name] = (int(rc), int(secs))


def f(x, d=2):
    return "" if x is None else f"{x:.{d}f}"


def table(head, rows):
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def bench_rows(name, data):
    """(head, rows) of a benchmark's JSON: its times and its ratios to the baseline of the same run."""
    if name == "bench_mgs":
        rows = [[f"MGS K = {r['candidates']}, batch {r['batch_size']}", f(r["mgs_ms"], 1), f(r["baseline_ms"], 1),
                 f(r["ratio"])] for r in data.get("speed", [])]
        rows += [[f"memory, K = {r['k']}", f(r["peak_mib"], 1), "", f"{r['above_mle_param_copies']:.2f} parameter copies above MLE"]
                 for r in data.get("memory", []) if r.get("mode") == "mgs"]
        return ["row", "ms (MiB for memory)", "baseline ms", "ratio"], rows
    if name == "bench_decoding":
        return (["model", "regime", "strategy", "inputs", "ours ms", "incremental ms", "inc / ours",
                 "eager steps / ours", "SequenceGenerator ms", "SG / ours", "memory SG / ours"],
                [[r.get("model"), r.get("regime"), r.get("strategy"), r.get("inputs"), f(r["ours_ms"]),
                  f(r.get("inc_ms")), f(r.get("speedup_vs_incremental")), f(r.get("speedup_vs_eager")), f(r["sg_ms"]),
                  f(r["speedup"]), f(r.get("mem_ratio"))] for r in data.get("rows", [])])
    if name == "bench_mh":
        return (["row", "ms", "proposals / s", "vs algorithm 4"],
                [[r["row"], f(r["ms"], 1), f(r["proposals_per_s"], 1), f(r["speedup"], 1)] for r in data])
    group = next((k for k in ("model", "arch") if data and k in data[0]), None)
    peak = bool(data) and data[0].get("peak_ratio") is not None
    calls = bool(data) and "calls_ratio" in data[0]
    head = (([group] if group else []) + ["row", "ms / step", "ratio to CE"] + (["peak memory / CE"] if peak else [])
            + (["operator calls / CE"] if calls else []))
    return head, [([r[group]] if group else []) + [r["row"], f(r["ms"], 1), f(r["ratio"])]
                  + ([f(r["peak_ratio"])] if peak else []) + ([f(r["calls_ratio"])] if calls else []) for r in data]


names = sorted(set(status) | {p[:-5] for p in os.listdir(out) if p.startswith("bench_") and p.endswith(".json")},
               key=lambda n: (n not in status, n))
lines.append("Benchmarks (`--device cuda`; ratios against the baseline measured in the same run):" if names
             else "Benchmarks: not run.")
for name in names:
    rc, secs = status.get(name, (None, None))
    how = "" if rc is None else (f", finished in {secs} s" if rc == 0 else
                                 f", out of time after {secs} s" if rc in (124, 137) else f", FAILED (exit {rc}) after {secs} s")
    lines += ["", f"### {name}{how}", ""]
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        lines.append(f"no {name}.json (see {name}.log)")
        continue
    try:
        head, rows = bench_rows(name, json.load(open(path)))
        lines += table(head, rows)
    except (KeyError, TypeError, ValueError) as e:
        lines.append(f"{name}.json not read ({type(e).__name__}: {e})")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "report.md"), "w").write(text)
print(text, end="")
PY
}

if [ "$REPORT_ONLY" = 1 ]; then
  [ -d "$OUT" ] || die "--report: no directory $OUT"
  report
  exit $?
fi

# refuse before anything is written when torch sees no CUDA device
cuda=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null) \
  || die "torch does not import with $PY; nothing run"
[ "$cuda" -gt 0 ] 2>/dev/null || die "no CUDA device visible to torch ($PY: torch.cuda.is_available() is False); nothing run"
"$PY" -c 'import fairseq, fairseq_ext' 2>/dev/null \
  || die "fairseq or fairseq_ext does not import with $PY (install them first: docs/performance.md, \"CUDA\")"

mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
# the checkout's package first; the tests' commands as fresh interpreters (no fork server: a process
# forked from one that has initialised CUDA cannot use it); unbuffered logs
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} FAIRSEQ_EXT_FORKSERVER=0 PYTHONUNBUFFERED=1

{
  date -u
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c '
import sys, numpy, torch, fairseq
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuDNN", torch.backends.cudnn.version(), "| numpy", numpy.__version__, "| fairseq", fairseq.__version__)
print("devices:", ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))'
  git -C "$ROOT" rev-parse --short HEAD 2>/dev/null | sed 's/^/fairseq-ext commit /'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

status=0
if [ "$TESTS" = 1 ]; then
  args=(-m pytest tests/test_gpu.py -v -rfE -p no:cacheprovider --junitxml "$OUT/tests.xml")
  [ -z "$KEXPR" ] || args+=(-k "$KEXPR")
  if [ -z "$WORKERS" ]; then WORKERS=$(env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 1); [ "$WORKERS" -le 12 ] || WORKERS=12; fi
  if [ "$WORKERS" -gt 1 ] && "$PY" -c 'import xdist' 2>/dev/null; then args+=(-n "$WORKERS" --dist load); fi
  if "$PY" -c 'import pytest_timeout' 2>/dev/null; then args+=(--timeout "$TEST_TIMEOUT"); fi
  echo "==> tests: $PY ${args[*]}"
  t0=$SECONDS
  "$PY" "${args[@]}" > "$OUT/tests.log" 2>&1
  rc=$?
  echo "==> tests: exit $rc after $((SECONDS - t0)) s (log: $OUT/tests.log)"
  [ "$rc" = 0 ] || status=1  # failures, errors, or (5) no test collected
  passed=$("$PY" -c '
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
n = lambda k: sum(int(s.get(k, 0)) for s in ([root] if root.tag == "testsuite" else root.iter("testsuite")))
print(n("tests") - n("failures") - n("errors") - n("skipped"))' "$OUT/tests.xml" 2>/dev/null)
  [ "${passed:-0}" -gt 0 ] 2>/dev/null || { echo "==> tests: none passed (all skipped?)"; status=1; }
fi

: > "$OUT/benches.tsv"
for b in $BENCHES; do
  script=bench/${b%_amp}.py
  extra=()
  [ "$b" = "${b%_amp}" ] || extra+=(--amp)
  [ "$b" != bench_criteria ] || extra+=(--compare-decoding --op-counts)
  [ "$b" != bench_criteria_iwslt ] || { script=bench/bench_criteria.py; extra+=(--size iwslt --compare-decoding); }
  [ "$b" != bench_criteria_lstm ] || { script=bench/bench_criteria.py; extra+=(--arch lstm --compare-decoding --op-counts); }
  [ "$b" != bench_criteria_compile ] || { script=bench/bench_criteria.py; extra+=(--compile --op-counts); }
  [ -z "$QUICK" ] || extra+=("$QUICK")
  echo "==> $b: $PY $script --device cuda ${extra[*]:-} --json $OUT/$b.json"
  t0=$SECONDS
  timeout "$BENCH_TIMEOUT" "$PY" "$script" --device cuda ${extra[@]+"${extra[@]}"} --json "$OUT/$b.json" > "$OUT/$b.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$b" "$rc" "$((SECONDS - t0))" >> "$OUT/benches.tsv"
  echo "==> $b: exit $rc after $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || status=1
done

echo
report || status=1
exit "$status"
