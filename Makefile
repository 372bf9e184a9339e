# Two commands do all set-up on a fresh machine:  make demo  and  make test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
PYTEST_WORKERS ?= 2
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: setup setup-dev demo test test-fast lint bench lock clean

# setup: what running the experiments needs (requirements.lock, the runtime dependencies of
# pyproject.toml pinned); setup-dev adds the tests, lint and notebook tools
# (requirements-dev.lock).  torch==2.13.0 is pinned in the lock and installed in the same pip
# command as lightning, so pip takes the CPU wheel on this machine's disk instead of a
# multi-GB CUDA build.
setup: $(STAMP)
setup-dev: $(DEV)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.lock
	$(PIP) --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(DEV): $(STAMP) requirements-dev.lock
	$(PIP) -r requirements-dev.lock
	touch $(DEV)

# CoDA Table 6 (MLU) at a CPU scale, both cells at once, then the paper-vs-ours table, the
# demo's learning curves and the committed 20,000-step curves of the same models.
demo: setup
	$(BIN)/python experiments/coda_mlu.py grid table6 --config demo --jobs 2 --threads 1
	$(BIN)/python experiments/coda_mlu.py report table6 --config demo --curve
	@echo; echo "The same models trained 20,000 steps (committed: results/coda_mlu_curve.md):"
	@cat results/coda_mlu_curve.md

test: setup-dev
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q

test-fast: setup-dev
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q -m "not slow"

lint: setup-dev
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python -m benchmarks.attention --markdown benchmarks/README.md
	$(BIN)/python -m benchmarks.decoding --markdown benchmarks/README.md

# regenerate both locks (after changing pyproject.toml): the runtime lock from a fresh venv
# holding only the project and its runtime dependencies, at the versions of the current
# environment; the dev lock = everything else the current (dev) environment holds
FREEZE = python -m pip freeze --all --exclude-editable | grep -v "^pip==\|^attnrepro==" | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/'
lock: setup-dev
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	$(BIN)/$(FREEZE) > .lock-all.txt
	.lock-venv/bin/python -m pip install --quiet --disable-pip-version-check -c .lock-all.txt .
	.lock-venv/bin/$(FREEZE) > requirements.lock
	(echo "# Development tools (tests, lint, notebooks) on top of the runtime lock; make test installs both."; \
	 echo "-r requirements.lock"; grep -v -i -x -F -f requirements.lock .lock-all.txt) > requirements-dev.lock
	rm -rf .lock-venv .lock-all.txt

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
