#!/bin/bash
# One GPU session's checks, as run through the workplace's device tool (docs/performance.md, "GPU"):
# the CUDA tests (tests/test_gpu.py: fp16 / memory-efficient fp16 / amp through fairseq-train, every
# criterion's updates in fp16, CUDA decoding and sampling) and the benchmarks on CUDA. Each step has
# its own time limit and writes under OUT, so a step that fails or hangs leaves the others' results.
#
# The machine has torch but not fairseq: bench/gpu_env.sh installs the wheels carried in .whl/
# (fetch them here first: bash bench/fetch_gpu_wheels.sh; then the device call carries [".whl"]).
# Run: OUT=DIR [BENCHES="bench_dss ..."] [TEST_LIMIT=seconds] bash bench/gpu_session.sh [pytest -k expression]
set -u
OUT=${OUT:?set OUT to a directory for the logs}
. bench/gpu_env.sh

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/bench.log, say how it ended
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "==> $name" >> "$OUT/bench.log"
    timeout "$limit" "$@" >> "$OUT/bench.log" 2>&1
    echo "==> $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/bench.log"
}

t0=$SECONDS
timeout ${TEST_LIMIT:-300} python3 -m pytest tests/test_gpu.py -n 12 --dist load -v -p no:cacheprovider -rfE --timeout 150 ${1:+-k "$1"} \
    > "$OUT/gpu_tests.log" 2>&1
echo "==> tests/test_gpu.py: exit $? after $((SECONDS - t0)) s"
tail -n 40 "$OUT/gpu_tests.log"
# a subset: BENCHES="bench_dss ..."; NAME_amp runs bench/NAME.py --amp (every step under autocast)
BENCHES=${BENCHES:-bench_criteria bench_dss bench_soft_beam bench_mgs}
declare -A LIMIT=([bench_criteria]=80 [bench_criteria_amp]=80 [bench_dss]=70 [bench_soft_beam]=150 [bench_mgs]=100)
for b in $BENCHES; do
    script=${b%_amp}
    step "$b" "${LIMIT[$b]}" python3 "bench/$script.py" --device cuda $([ "$b" = "$script" ] || echo --amp) \
        --json "$OUT/$b.json"
done
grep -v -E "Warning|key_padding_mask|r = re.compile|^  " "$OUT/bench.log" | tail -n 45
