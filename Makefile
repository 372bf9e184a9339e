# Two commands do all set-up on a fresh machine:  make demo  and  make test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
PYTEST_WORKERS ?= 2
# $(,): a comma inside $(call ...)'s arguments
, := ,
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: setup setup-dev demo test test-fast lint bench lock clean notebooks
# the instruction set torch dispatches to here, lower case (avx512, avx2, default): the
# demo printouts of results/coda_mlu_demo_isa/ are named by it
CAPABILITY = $(BIN)/python -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
# where the committed demo printouts were made (results/coda_mlu_demo_isa.md)
DEMO_MACHINE := AMD EPYC, 2 cores, AVX-512, torch 2.13.0+cpu, one thread per run, at 878d8b9 (the avx2 and default printouts emulate those builds with ATEN_CPU_CAPABILITY on it)

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

# CoDA Table 6 (MLU) at a CPU scale, both cells at once (on a terminal a live line per cell:
# its step, loss, validation metric, steps/s and time left), then the paper-vs-ours table, the
# demo's learning curves, whether they equal the committed printout of this CPU's kernels
# (results/coda_mlu_demo_isa/<torch's capability>.md) and if not on which machines, the committed 20,000-step curves of the same models and the
# committed runs at the paper's 100K steps (two seeds of each of its three cells); last, how
# long it took here beside the committed run's time (results/coda_mlu_demo.md, the README's).
# DEMO_CONFIG=smoke does the same with the 20-step smoke config (a minute).
DEMO_CONFIG ?= demo
demo: setup
	@start=$$(date +%s) && \
	$(BIN)/python experiments/coda_mlu.py grid table6 --config $(DEMO_CONFIG) --jobs 2 --threads 1 && \
	cap=$$($(CAPABILITY)) && ref=results/coda_mlu_demo_isa/$$cap.md && { test -f $$ref || ref=results/coda_mlu_demo_isa/avx512.md; } && \
	$(BIN)/python experiments/coda_mlu.py report table6 --config $(DEMO_CONFIG) --curve --compare $$ref \
	  --compare-machine "$(DEMO_MACHINE)" && \
	echo && echo "The same models trained 20,000 steps (committed: results/coda_mlu_curve.md):" && \
	cat results/coda_mlu_curve.md && \
	echo && echo "The paper's 100K steps, two seeds of each cell (committed: results/coda_mlu_table6_100k.md):" && \
	cat results/coda_mlu_table6_100k_curves.md && \
	took=$$(( $$(date +%s) - start )) && \
	committed=$$(grep -o -m1 '[0-9]* min [0-9]* s wall' results/coda_mlu_demo.md) && \
	echo && echo "make demo took $$((took / 60)) min $$((took % 60)) s here (config $(DEMO_CONFIG)); the committed run took $${committed% wall} (results/coda_mlu_demo.md: 2 cores, config demo); other work on the machine adds to it"

# results: reruns every committed result that takes under 15 minutes on this 2-core machine
# (2-core AMD EPYC, AVX-512; times measured from each run's logged wall clock, or estimated
# where marked, in results/README.md) with the command its results/*.md names, and writes
# each command's own output over the tracked file that holds it: `git diff results/` then
# shows what changed.  Where a folder names its files by the commit that made them, the
# rerun adds <name>_<commit>.* beside them (`git status` shows it; <commit> ends in -dirty
# when the code differs from HEAD).  The prose and tables of results/*.md are not rewritten:
# compare them with the new output.  No test reads a file written here.  One run at a time:
# do not give make -j, and keep the machine quiet (benchmarks wait up to 20 s for it).
#   included (minutes):  decoding_bench (about 3, estimated), adm_decoder_bench (3-8, est.),
#     attention_kernels_after (4-6, est.), window_kernels_cpp cpp + fallback (4),
#     attention_interleaved (5), model_cost_interleaved SST (2-3) and translation (12),
#     make demo's grid (8: results/coda_mlu_demo_isa/<capability>.md),
#     dwin_classification_cost (8-12, est.), dwin_mt_table4_speed (6-10, est.),
#     CoDA Figure 2 (about 10 by experiments/figures.py: coda_fig2_summary.csv, coda_fig2.png);
#     about 65-81 minutes in all (the sum of results/README.md's minutes; not timed whole).
#   left out:  too long: coda_mlu_curve (20,000 steps x 4 cells, about 2 h),
#     sst_table5_repro (CoDA 52 min, DW about 1.7 h for 2 seeds), coda_ranking_wikiqa_cpu
#     (about 55 min), coda_mt_small (about 50 min), qadm_mt_small (22 + 38 min),
#     coda_mlu_demo_isa's AVX2 and default grids (17 min beside the demo's 8),
#     dwin_mt_cost's one-run-per-cell grid (15-20 min, est.; its interleaved measure is in);
#     not at this code: attention_kernels_before (864994e's kernels);
#     superseded: window_variants_bench (attention_interleaved measures MW and AW).
#   DW Table 5's report is re-derived from results/sst_table5_runs by tests/docs/test_results.py.
RESULTS_SHORT := results-decoding results-adm-decoder results-attention-kernels \
                 results-window-kernels results-attention-interleaved results-model-cost \
                 results-model-cost-translation results-demo results-dwin-classification-cost \
                 results-dwin-mt-speed results-fig2
RESULTS_RUNS  := $(CURDIR)/runs/results
COMMIT        := $(shell git rev-parse --short=7 HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- attention benchmarks datamodules experiments lit_models pyproject.toml 2>/dev/null || echo -dirty)
ATTN_BENCH    := $(BIN)/python -m benchmarks.attention --threads 2 --json
# $(call keep,FILE,COMMAND): COMMAND's standard output replaces FILE only if COMMAND succeeds
keep = mkdir -p $(dir $(1)) && $(2) > $(1).part && mv $(1).part $(1)

.PHONY: results $(RESULTS_SHORT)
.NOTPARALLEL:  # the reruns time themselves: one at a time even under make -j
results: $(RESULTS_SHORT)

results-decoding: setup
	$(call keep,results/decoding_bench.jsonl,$(BIN)/python -m benchmarks.decoding --threads 2 --json)
results-adm-decoder: setup
	$(call keep,results/adm_decoder_bench.jsonl,$(ATTN_BENCH) --mechanisms additive$(,)density$(,)structured --contexts decoder$(,)decoder_step)
results-attention-kernels: setup
	$(call keep,results/attention_kernels_after.jsonl,$(ATTN_BENCH) --mechanisms softmax$(,)coda$(,)window --lengths 512$(,)1024 --contexts multihead --wait-quiet 20)
results-window-kernels: setup
	$(call keep,results/window_kernels_cpp/cpp.jsonl,$(ATTN_BENCH) --mechanisms softmax$(,)window --lengths 512$(,)1024 --contexts multihead --wait-quiet 20)
	$(call keep,results/window_kernels_cpp/fallback.jsonl,ATTNREPRO_WINDOW_CPP=0 $(ATTN_BENCH) --mechanisms softmax$(,)window --lengths 512$(,)1024 --contexts multihead --wait-quiet 20)
results-attention-interleaved: setup
	$(call keep,results/attention_interleaved/run_$(COMMIT).jsonl,$(ATTN_BENCH) --mechanisms softmax$(,)coda$(,)window --lengths 512$(,)1024 --contexts multihead --warmup 3 --interleave 30 --wait-quiet 20)
results-model-cost: setup
	$(call keep,results/model_cost_interleaved/run_$(COMMIT).jsonl,$(BIN)/python -m benchmarks.model_cost --threads 2 --json)
results-model-cost-translation: setup
	$(call keep,results/model_cost_interleaved/translation_$(COMMIT).jsonl,$(BIN)/python -m benchmarks.model_cost --model translation --rounds 2 --steps 15 --warmup 3 --threads 2 --json)
results-demo: setup
	ATTNREPRO_RUNS=$(RESULTS_RUNS) $(BIN)/python experiments/coda_mlu.py grid table6 --config demo --jobs 2 --threads 1
	cap=$$($(CAPABILITY)) && \
	$(call keep,results/coda_mlu_demo_isa/$$cap.md,ATTNREPRO_RUNS=$(RESULTS_RUNS) $(BIN)/python experiments/coda_mlu.py report table6 --config demo --curve)
results-dwin-classification-cost: setup
	ATTNREPRO_RUNS=$(RESULTS_RUNS) $(BIN)/python experiments/dwin_classification.py grid cost --config speed --jobs 1 --threads 2 --seeds 3
	$(call keep,results/dwin_classification_cost/report_$(COMMIT).md,ATTNREPRO_RUNS=$(RESULTS_RUNS) $(BIN)/python experiments/dwin_classification.py report cost --config speed)
results-dwin-mt-speed: setup
	ATTNREPRO_RUNS=$(RESULTS_RUNS) $(BIN)/python experiments/dwin_mt.py grid table4 --config speed --jobs 1 --threads 2
	$(call keep,results/dwin_mt_table4_speed/report_$(COMMIT).md,ATTNREPRO_RUNS=$(RESULTS_RUNS) $(BIN)/python experiments/dwin_mt.py report table4 --config speed)
results-fig2: setup
	ATTNREPRO_THREADS=1 $(BIN)/python -m experiments.figures coda_fig2 --out results

test: setup-dev
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q

test-fast: setup-dev
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q -m "not slow"

lint: setup-dev
	$(BIN)/ruff check .

# notebooks: executes every notebook of notebooks/ top to bottom at its full setting (its
# default steps, one thread) and stores its outputs, figures inline, in the .ipynb
# (notebooks/execute.py; docs/notebooks.md); tests/docs/test_notebooks.py fails when they are
# stale.  One notebook: make notebooks NOTEBOOKS=notebooks/results.ipynb.  Open them with
# .venv/bin/jupyter lab
NOTEBOOKS ?= $(sort $(wildcard notebooks/*.ipynb))
notebooks: setup-dev
	ATTNREPRO_THREADS=1 $(BIN)/python notebooks/execute.py $(NOTEBOOKS)

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
