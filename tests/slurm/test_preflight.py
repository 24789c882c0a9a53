"""`gridrun preflight` as a job on the real SLURM test cluster (issue 30 item 3): the cells' job
shape on their partition, each task probing with the python the cells' jobs run.

    eval "$(slurm/testcluster/up.sh)" && .venv/bin/pytest -q -m slurm tests/slurm/test_preflight.py

Injected here: a node python that cannot import gridrun, one that lacks vLLM, a job whose
tasks share the node's GPUs (`--gres` instead of `--gpus-per-task`), and cells asking more
GPUs than a node has (the scheduler refuses the shape); `gridrun sweep` then queues nothing.
The test cluster's 2 GPUs are fake devices, so torch sees none: the GPU cells here are
checked with `--cpu` canaries' rule (binding only) or fail on CUDA, as a GPU cell must.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.grid.canary import CPU_SHAPE
from gridrun.grid.compose import Composer
from gridrun.grid.launchers.slurm import job_spec
from gridrun.grid.plan import make_plan
from gridrun.grid.preflight import Needs, run_slurm
from gridrun.grid.spec import load_spec
from tests.test_preflight import python_without

pytestmark = pytest.mark.slurm
# The canary's cell on the test cluster's GPU partition (2 tasks, a GPU each), on the CPU
# canary's random-init model (no hub).
GPU_CELL = ["cluster=testcluster", "launcher=slurm", *CPU_SHAPE]


def gridrun(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gridrun.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600, check=False)


def gpu_job(overrides: list[str] = ()) -> tuple:  # type: ignore[assignment]
    composer = Composer()
    plan = make_plan(load_spec("canary", [*GPU_CELL, *overrides], composer), composer)
    return job_spec(plan.cells[0].entry(), plan.cluster), plan


def test_a_smoke_sweep_passes_its_preflight_job(toy_world: Path, tmp_path: Path) -> None:
    env = {"GRIDRUN_RESULTS": str(tmp_path / "results")}
    done = gridrun("preflight", "conf=smoke", "cluster=testcluster", "launcher=slurm", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("cell(s) of 'smoke', checked on a job on the cells' partition")
    (script,) = (tmp_path / "results" / ".preflight").glob("preflight-*.sh")
    assert "#SBATCH --partition=debug\n" in script.read_text()


def test_each_task_sees_its_own_gpu_and_a_shared_gpu_is_named(math_data: Path, tmp_path: Path) -> None:
    spec, _ = gpu_job()
    assert spec.ntasks == 2 and spec.gpus_per_task == "1"
    assert run_slurm(spec, "testcluster", Needs(gpus=2), tmp_path, 5) == []
    # Both GPUs as one job-wide gres: each task sees both.
    shared = dataclasses.replace(spec, gpus_per_task=None, extra=(("gres", "gpu:2"),))
    lines = run_slurm(shared, "testcluster", Needs(gpus=2), tmp_path, 5)
    assert len(lines) == 2 and all(" sees GPUs '0,1' (CUDA_VISIBLE_DEVICES): each rank needs exactly its own" in line
                                   for line in lines), lines


def test_more_gpus_than_a_node_has_is_refused_by_the_scheduler(math_data: Path, tmp_path: Path) -> None:
    spec, _ = gpu_job(["grid.gpu.gpus_per_cell=3"])
    (line,) = run_slurm(spec, "testcluster", Needs(gpus=3), tmp_path, 5)
    assert line.startswith("sbatch rejects the jobs of partition 'gpu' (")
    assert "the cells ask 3 tasks with --gpus-per-task=1 on one node: set grid.gpu.gpus_per_cell" in line


def test_a_node_python_without_gridrun_or_without_vllm_is_named(tmp_path: Path) -> None:
    spec, _ = gpu_job()
    (line,) = run_slurm(spec, "testcluster", Needs(gpus=2), tmp_path, 5, python=python_without("gridrun", tmp_path))
    assert line.startswith("2 of 2 tasks of the preflight job ") and "did not run gridrun's probe with " in line
    assert "the repository and its venv must be on shared storage at the same path on every node" in line
    (line,) = run_slurm(spec, "testcluster", Needs(gpus=2, vllm=True), tmp_path, 5,
                        python=python_without("vllm", tmp_path))
    assert line.startswith("vllm does not import in ") and "install vLLM into the venv, or set engine=hf" in line


def test_a_sweep_whose_preflight_fails_queues_nothing(math_data: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = {"GRIDRUN_RESULTS": str(results), "GRIDRUN_DATA": str(math_data)}
    # A GPU cell: the test cluster's GPUs are fake, so torch sees none on them.
    done = gridrun("sweep", "conf=canary", *GPU_CELL, env=env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert any(line.startswith("preflight: torch ") and " sees no GPU on " in line for line in lines), lines
    assert lines[-1].startswith("gridrun: error: the preflight found 1 problem(s), listed above: nothing was queued")
    (cell,) = (results / "canary" / "cells").iterdir()
    assert '"state": "planned"' in (cell / "state.json").read_text()
    assert not (results / "canary" / "jobs").exists()
