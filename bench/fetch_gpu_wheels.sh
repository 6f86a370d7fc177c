#!/bin/bash
# Run HERE (not on the GPU machine) before a GPU session: downloads into .whl/ the wheels that
# bench/gpu_env.sh installs there (the machine has Python 3.12 and torch, but no fairseq), at
# the versions this checkout's .venv uses where it has them. .whl/ is listed in
# .git/info/exclude (the device tool carries it with carry [".whl"]: about 22 MB).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any"
for pkg in fairseq-fixed hydra-core omegaconf bitarray cffi editdistance; do
  v=$(version "$pkg")
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
    -d .whl "$pkg${v:+==$v}" 2>&1 | grep -v "^WARNING: Location" || true
done
# antlr4-python3-runtime 4.9.3 (omegaconf's pin) has no wheel: build its pure-Python one
ls .whl/antlr4_python3_runtime-*.whl > /dev/null 2>&1 || \
  "$PY" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(version antlr4-python3-runtime)" 2>&1 | grep -v "^WARNING: Location" || true
ls .whl
