"""One GPU per rank on the real SLURM test cluster (its 2 fake gres GPUs), and `gridrun
canary` there (issue 29).

    eval "$(slurm/testcluster/up.sh)" && .venv/bin/pytest -q -m slurm tests/slurm/test_canary.py

`gridrun canary cluster=testcluster --cpu` submits the canary's cell (Voting-IP math on a
random-init Qwen3-1.7B cut to CPU size, canary.CPU_SHAPE) as a real cell job: two tasks,
`--gpus-per-task=1`. Each rank records from inside the job
(ranks/rank<r>.json, by its trainer) the CUDA_VISIBLE_DEVICES it runs with, which is what
its rollout engine inherits; the test reads them back. The fake GPUs are /dev/null-like
character devices, so the trainers stay on the CPU: that the vLLM engine then starts on
that device is reasoned from vLLM's code (it takes the first visible device), not run here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.seam.rundir import RunDir

pytestmark = pytest.mark.slurm


def test_the_canary_runs_two_ranks_each_on_its_own_gpu_and_says_go(toy_world: Path, math_data: Path,
                                                                  tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = {**os.environ, "GRIDRUN_RESULTS": str(results), "GRIDRUN_CACHE": str(tmp_path / "cache"),
           "GRIDRUN_DATA": str(math_data)}
    done = subprocess.run([sys.executable, "-m", "gridrun.cli", "canary", "cluster=testcluster", "--cpu",
                           "--timeout-min", "8"], capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("GO: projected ") and "node-days for full_matrix (72 cells;" in lines[-1]
    (cell,) = (results / "canary" / "cells").iterdir()
    records = RunDir(cell).read_rank_records()
    # Asserted from inside the job: two ranks, each seeing exactly one GPU, a different one.
    assert [r["rank"] for r in records] == [0, 1] and {r["world"] for r in records} == {2}
    visible = [r["cuda_visible_devices"] for r in records]
    assert all(v and "," not in v for v in visible) and len(set(visible)) == 2, visible
    for record in records:
        assert f"rank {record['rank']}/2 on " in done.stdout
        assert f"CUDA_VISIBLE_DEVICES={record['cuda_visible_devices']} (trainer cpu, engine hf" in done.stdout
        # Each step's stages and update were measured on each rank.
        assert [s["step"] for s in record["steps"]] == [1, 2] and all(s["stages"] for s in record["steps"])
    # The job asked for one GPU per task (not a job-wide gres both tasks would see).
    script = next((results / "canary" / "jobs").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --gpus-per-task=1\n" in script and "--gres" not in script
