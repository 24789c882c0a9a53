# gridrun: `make install` then `make demo` on a fresh machine; `make help` lists the targets.
VENV := .venv
PY := $(VENV)/bin/python
GRIDRUN := $(VENV)/bin/gridrun
# make table1 SWEEP=full_matrix collects one sweep; without it, every sweep under results/.
SWEEP ?=

.DEFAULT_GOAL := help
.PHONY: help install test demo table1 bench lint

help: ## list the targets
	@grep -E '^[a-z0-9]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

install: ## create .venv/ with gridrun and its dev tools (torch first: CPU machines take the CPU build)
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'

test: ## the fast test suite (slow, slurm, vllm and gpu tests are deselected)
	$(VENV)/bin/pytest -q

demo: ## the toy world, the smoke sweep on it (CPU, 11 cells), its status, tables, figures and report
	@# The analysis is written even when a cell failed (it says so); the exit status is the sweep's.
	@# collect's last line is the report's path (results/smoke/report.html).
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=smoke --max-parallel 2; status=$$?; \
		$(GRIDRUN) status conf=smoke && $(GRIDRUN) collect conf=smoke && exit $$status

table1: ## the analysis under results/<sweep>/: cells/metrics.parquet, tables 1-6, figures/, report.html (SWEEP=name for one)
	$(GRIDRUN) collect $(if $(SWEEP),conf=$(SWEEP))

bench: ## benchmarks, one JSON line each
	$(PY) bench/plan.py --json
	$(PY) bench/status.py --json
	$(PY) bench/code_reward.py --json
	$(PY) bench/rollout.py --json
	$(PY) bench/steps.py --json
	$(PY) bench/toy_build.py --json
	$(PY) bench/collect.py --json

lint: ## ruff over the code, tests and benchmarks
	$(VENV)/bin/ruff check gridrun tests bench
