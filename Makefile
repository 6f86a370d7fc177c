# Set-up and entry points. Every target is idempotent: a step whose stamp file
# exists in $(VENV) is skipped. `make clean-venv` starts over.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Default: the CPU wheel. For a CUDA build: make test TORCH_SPEC="torch==2.13.0 --index-url <a CUDA wheel index>"
TORCH_SPEC ?= torch==2.13.0
# fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed is its patched successor.
FAIRSEQ_SPEC ?= $(shell $(PYTHON) -c 'import sys; print("fairseq-fixed==0.12.3.1" if sys.version_info >= (3, 11) else "fairseq==0.12.2")')
PYTEST_ARGS ?=
# test workers (pytest-xdist): one per core; the tests of one module run in one worker (tests/conftest.py)
PYTEST_WORKERS ?= auto
DEMO_DIR ?= demo_work

.PHONY: test test-full demo bench install clean-venv

$(VENV)/.stamp-venv:
	@echo "==> [1/5] creating virtualenv $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@touch $@

$(VENV)/.stamp-torch: $(VENV)/.stamp-venv
	@echo "==> [2/5] installing $(TORCH_SPEC)"
	$(PIP) install $(TORCH_SPEC)
	$(PY) -c 'import torch; print("torch==" + torch.__version__)' > $(VENV)/torch-constraint.txt
	@touch $@

$(VENV)/.stamp-build-deps: $(VENV)/.stamp-torch
	@echo "==> [3/5] installing build dependencies (numpy, cython)"
	$(PIP) install -c $(VENV)/torch-constraint.txt numpy cython wheel
	@touch $@

$(VENV)/.stamp-fairseq: $(VENV)/.stamp-build-deps
	@echo "==> [4/5] installing $(FAIRSEQ_SPEC) (compiles C++ extensions, a few minutes)"
	$(PIP) install --no-build-isolation -c $(VENV)/torch-constraint.txt $(FAIRSEQ_SPEC)
	@touch $@

$(VENV)/.stamp-package: $(VENV)/.stamp-fairseq setup.py
	@echo "==> [5/5] installing fairseq-ext (editable, with test extra)"
	$(PIP) install --no-build-isolation -c $(VENV)/torch-constraint.txt -e ".[test]"
	@touch $@

install: $(VENV)/.stamp-package

PYTEST := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest tests -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: install
	@echo "==> running the test suite (the tests marked slow are left out: make test-full)"
	$(PYTEST) $(PYTEST_ARGS)

# also the tests marked slow (minutes of training each: methods against their controls, recipes end to end)
test-full: install
	@echo "==> running the full test suite"
	FAIRSEQ_EXT_FULL=1 $(PYTEST) $(PYTEST_ARGS)

demo: install
	@echo "==> running the demo (generated text-completion data, tiny transformer_lm: MLE, continued MLE, MGS)"
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/mgs/demo.sh $(DEMO_DIR)

bench: install
	$(PY) bench/bench_decoding.py
	$(PY) bench/bench_mgs.py
	$(PY) bench/bench_dss.py
	$(PY) bench/bench_soft_beam.py
	$(PY) bench/bench_mh.py
	$(PY) bench/bench_residual.py
	$(PY) bench/bench_criteria.py

clean-venv:
	rm -rf $(VENV)
