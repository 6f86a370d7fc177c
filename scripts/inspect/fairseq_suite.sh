#!/usr/bin/env bash
# fairseq's own tests, run on this environment once without the plugin and once with it loaded (an
# `import fairseq_ext` in a conftest.py, what --user-dir does), and the tests whose outcome differs.
# The contract (docs/fairseq.md): no test fails with the plugin that passes without it, apart from the
# deliberate differences listed there.
#
# usage: scripts/inspect/fairseq_suite.sh FAIRSEQ_SRC [OUT_DIR]
#   FAIRSEQ_SRC: a checkout of https://github.com/facebookresearch/fairseq (its tests/ is used, not its code:
#   the tests run against the fairseq installed here). OUT_DIR (default: a temporary directory) receives
#   without.xml / with.xml (JUnit), without.log / with.log and differences.txt. A rerun keeps a run whose
#   XML is there (the run without the plugin does not change with the plugin's code: delete with.xml alone).
# env: FILES (the ten test files below), PYTHON (python), PYTEST_ARGS (extra pytest arguments)
# Both runs set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (fairseq 0.12 needs it under torch >= 2.6), so the
# only difference between them is the plugin. About 15 minutes on two cores.
set -euo pipefail
SRC=${1:?usage: $0 FAIRSEQ_SRC [OUT_DIR]}
OUT=${2:-$(mktemp -d)}
PYTHON=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
[ -d "$SRC/tests" ] || { echo "$0: $SRC/tests: no such directory (FAIRSEQ_SRC is a fairseq checkout)" >&2; exit 2; }
: "${FILES:=test_binaries.py test_checkpoint_utils.py test_train.py test_reproducibility.py test_amp_optimizer.py
test_iterators.py test_sequence_generator.py test_dictionary.py test_valid_subset_checks.py
test_checkpoint_utils_for_task_level_attributes.py}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

run() {  # name, conftest text
  if [ -s "$OUT/$1.xml" ]; then echo "==> $1 the plugin: $OUT/$1.xml is kept (delete it to rerun)"; return; fi
  local dir="$OUT/$1"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$SRC/tests" "$dir/tests"
  printf '%s\n' "$2" > "$dir/tests/conftest.py"
  local files=()
  for f in $FILES; do files+=("tests/$f"); done
  echo "==> $(date +%H:%M:%S) $1 the plugin"
  (cd "$dir" && "$PYTHON" -m pytest -q -p no:cacheprovider --junitxml "$OUT/$1.xml" ${PYTEST_ARGS:-} "${files[@]}" \
    > "$OUT/$1.log" 2>&1) || true
  tail -n 1 "$OUT/$1.log"
}
run without "# fairseq's tests as they are"
run with "import sys; sys.path.insert(0, '$HERE'); import fairseq_ext  # noqa: E402,F401  (what --user-dir does)"
"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/differences.txt"
import sys
import xml.etree.ElementTree as ET

def outcomes(path):
    out = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return out

without, with_ = (outcomes(f"{sys.argv[1]}/{n}.xml") for n in ("without", "with"))
for label, o in (("without the plugin", without), ("with the plugin", with_)):
    counts = {k: sum(v == k for v in o.values()) for k in ("passed", "failed", "skipped")}
    print(f"{label}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
for name in sorted(set(without) | set(with_)):
    a, b = without.get(name, "absent"), with_.get(name, "absent")
    if a != b:
        print(f"{a} without, {b} with: {name}")
EOF
