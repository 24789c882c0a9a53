# gridrun: `make install` then `make demo` on a fresh machine; `make help` lists the targets.
VENV := .venv
PY := $(VENV)/bin/python
GRIDRUN := $(VENV)/bin/gridrun
# make table1 SWEEP=full_matrix collects one sweep; without it, every sweep under results/.
SWEEP ?=

.DEFAULT_GOAL := help
.PHONY: help install test demo table1 bench lint wheelhouse gpu-check

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

install: ## create .venv/ with gridrun and its dev tools (torch first: CPU machines take the CPU build)
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'

test: ## the fast test suite (slow, slurm, vllm and gpu tests are deselected)
	$(VENV)/bin/pytest -q

demo: ## the toy world, the smoke sweep on it (CPU, 11 cells), its status and Table 1
	@# Table 1 is written even when a cell failed (it says so); the exit status is the sweep's.
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=smoke --max-parallel 2; status=$$?; \
		$(GRIDRUN) status conf=smoke && $(GRIDRUN) collect conf=smoke && exit $$status

table1: ## cells.parquet, table1.{md,csv,tex} and figures/ under results/<sweep>/ (SWEEP=name for one)
	$(GRIDRUN) collect $(if $(SWEEP),conf=$(SWEEP))

bench: ## benchmarks, one JSON line each
	$(PY) bench/plan.py --json
	$(PY) bench/status.py --json
	$(PY) bench/code_reward.py --json
	$(PY) bench/rollout.py --json
	$(PY) bench/steps.py --json
	$(PY) bench/toy_build.py --json

wheelhouse: ## .wheelhouse/: wheels of the pure-Python dependencies a GPU image may lack, to carry to a machine without network
	$(PY) -m pip wheel -q --no-deps -w .wheelhouse $$($(PY) -m pip freeze | grep -iE '^(math-verify|latex2sympy2.extended|antlr4-python3-runtime|hydra-core|omegaconf|submitit)==')

# On a GPU machine without the venv, the image's python3 (with torch, transformers, peft) runs the check.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check: ## on a GPU machine: one step of every workflow x policy, random-init Qwen3 1.7B and 4B (bench/gpu.py)
	@if [ -d .wheelhouse ] && ls .wheelhouse/*.whl >/dev/null 2>&1; then \
		$(GPU_PY) -m pip install -q --no-index --no-deps --upgrade --target .wheelhouse/site .wheelhouse/*.whl; fi
	PYTHONPATH=$(CURDIR)/.wheelhouse/site:$(CURDIR) $(GPU_PY) bench/gpu.py --rollout-tokens 32

lint: ## ruff over the code, tests and benchmarks
	$(VENV)/bin/ruff check gridrun tests bench
