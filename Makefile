# Two commands do all set-up on a fresh machine:  make demo  and  make test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: setup demo test test-fast lint bench lock clean

setup: $(STAMP)

# torch==2.13.0 is pinned in the lock and installed in the same pip command as lightning,
# so pip takes the CPU wheel on this machine's disk instead of a multi-GB CUDA build.
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# CoDA Table 6 (MLU) at a CPU scale, both cells at once, then the paper-vs-ours table, the
# demo's learning curves and the committed 20,000-step curves of the same models.
demo: setup
	$(BIN)/python experiments/coda_mlu.py grid table6 --config demo --jobs 2
	$(BIN)/python experiments/coda_mlu.py report table6 --config demo --curve
	@echo; echo "The same models trained 20,000 steps (committed: results/coda_mlu_curve.md):"
	@cat results/coda_mlu_curve.md

test: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q

test-fast: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q -m "not slow"

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python -m benchmarks.attention --markdown benchmarks/README.md
	$(BIN)/python -m benchmarks.decoding --markdown benchmarks/README.md

# regenerate the lock from the current environment (after changing pyproject.toml)
lock:
	$(BIN)/python -m pip freeze --all --exclude-editable | grep -v "^pip==" | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/' > requirements.lock

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
