"""The SLURM test cluster (slurm/testcluster/) works with submitit.

Run with the cluster up:
    eval "$(slurm/testcluster/up.sh)" && .venv/bin/pytest tests/slurm -q -m slurm
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cloudpickle
import pytest
import submitit
from submitit.core.utils import UncompletedJobError

from tests.conftest import wait_until

pytestmark = pytest.mark.slurm

# Pickle this module's functions by value: the job then does not need to
# import `tests.slurm...` (which only works if it runs from the repo root).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT_S = 60.0


# ---------------------------------------------------------------- helpers (test side)
def _wait_until(predicate: Callable[[], object], what: str, timeout: float = TIMEOUT_S) -> object:
    return wait_until(predicate, what, timeout, poll=0.2)


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    return out.splitlines()[0] if out else ""


def _wait_sacct(job_id: str, prefix: str) -> str:
    return str(
        _wait_until(
            lambda: (s := _sacct_state(job_id)).startswith(prefix) and s,
            f"sacct to show job {job_id} as {prefix} (last: {_sacct_state(job_id)!r})",
        )
    )


def _count_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _executor(folder: Path, **params: object) -> submitit.SlurmExecutor:
    ex = submitit.SlurmExecutor(folder=folder / "%j")
    ex.update_parameters(**{"partition": "debug", "time": 5, **params})
    return ex


# ---------------------------------------------------------------- job functions (run on the cluster)
def add(a: int, b: int) -> int:
    return a + b


def square(x: int) -> int:
    return x * x


def gpu_env() -> dict[str, str | None]:
    keys = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_JOB_PARTITION")
    return {k: os.environ.get(k) for k in keys}


def sleep_then(seconds: float, started: str) -> str:
    Path(started).touch()
    time.sleep(seconds)
    return "finished"


def append_run(runs_file: str) -> int:
    with open(runs_file, "a") as f:
        f.write(f"{os.environ.get('SLURM_RESTART_COUNT', '0')}\n")
    return len(Path(runs_file).read_text().splitlines())


def run_until_requeued(runs_file: str) -> int:
    """First run: record it and block (until requeued). Later runs: return the count."""
    runs = append_run(runs_file)
    if runs == 1:
        time.sleep(120)
    return runs


class Preemptible(submitit.helpers.Checkpointable):
    """Blocks on its first run; submitit's USR2 handler checkpoints and requeues it."""

    def __call__(self, runs_file: str) -> int:
        return run_until_requeued(runs_file)


def barrier(shared_dir: str, name: str, parties: int, timeout: float) -> bool:
    """True once `parties` jobs are running at the same time."""
    Path(shared_dir, name).touch()
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(list(Path(shared_dir).iterdir())) >= parties:
            return True
        time.sleep(0.2)
    return False


def ranks() -> dict[str, int]:
    env = submitit.JobEnvironment()
    return {"global_rank": env.global_rank, "local_rank": env.local_rank, "num_tasks": env.num_tasks}


# ---------------------------------------------------------------- tests
def test_submit_function_and_get_result(tmp_path: Path) -> None:
    ex = _executor(tmp_path, partition="debug", gres="gpu:2")
    job = ex.submit(add, 2, 3)
    assert job.result() == 5


def test_job_array_of_three(tmp_path: Path) -> None:
    ex = _executor(tmp_path, cpus_per_task=1)
    jobs = ex.map_array(square, [1, 2, 3])
    assert len(jobs) == 3
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1  # one array job
    assert [j.result() for j in jobs] == [1, 4, 9]


def test_job_sees_two_fake_gpus_in_gpu_partition(tmp_path: Path) -> None:
    ex = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    ex.update_parameters(slurm_partition="gpu", slurm_gres="gpu:2", timeout_min=5)
    seen = ex.submit(gpu_env).result()
    print("job environment:", seen)
    assert seen["SLURM_JOB_PARTITION"] == "gpu"
    visible = [seen[k] for k in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS") if seen[k]]
    assert visible, f"no GPU variables in the job: {seen}"
    assert all(len(v.split(",")) == 2 for v in visible), seen


def test_several_one_cpu_jobs_run_concurrently(tmp_path: Path) -> None:
    shared = tmp_path / "barrier"
    shared.mkdir()
    ex = _executor(tmp_path, cpus_per_task=1)
    with ex.batch():
        jobs = [ex.submit(barrier, str(shared), f"job{i}", 4, 30.0) for i in range(4)]
    assert [j.result() for j in jobs] == [True] * 4


def test_sacct_shows_completed_and_job_can_be_reattached(tmp_path: Path) -> None:
    job = _executor(tmp_path).submit(add, 40, 2)
    assert job.result() == 42
    assert _wait_sacct(job.job_id, "COMPLETED") == "COMPLETED"
    again = submitit.SlurmJob(folder=tmp_path / "%j", job_id=job.job_id)
    assert again.result() == 42
    assert again.state == "COMPLETED"


def test_scontrol_requeue_runs_the_job_again(tmp_path: Path) -> None:
    runs = tmp_path / "runs.txt"
    job = _executor(tmp_path).submit(run_until_requeued, str(runs))
    _wait_until(lambda: _count_lines(runs) >= 1, "the first run")
    subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=30)
    assert job.result() == 2
    assert runs.read_text().split() == ["0", "1"]  # SLURM_RESTART_COUNT per run
    assert _wait_sacct(job.job_id, "COMPLETED") == "COMPLETED"


def test_usr2_preemption_signal_checkpoints_and_requeues(tmp_path: Path) -> None:
    runs = tmp_path / "runs.txt"
    # time >= 15 min: with shorter limits submitit counts every USR2 as a timeout.
    job = _executor(tmp_path, time=60).submit(Preemptible(), str(runs))
    _wait_until(lambda: _count_lines(runs) >= 1, "the first run")
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True, timeout=30)
    assert job.result() == 2
    log = job.stdout() or ""
    assert "this job is preempted" in (job.stderr() or "") + log
    assert "Requeued job" in log  # submitit's handler ran `scontrol requeue`


def test_two_tasks_get_ranks_0_and_1(tmp_path: Path) -> None:
    job = _executor(tmp_path, ntasks_per_node=2, cpus_per_task=1).submit(ranks)
    results = job.results()
    assert sorted(r["global_rank"] for r in results) == [0, 1]
    assert sorted(r["local_rank"] for r in results) == [0, 1]
    assert all(r["num_tasks"] == 2 for r in results)


# Last on purpose: a cancelled submitit job ignores SIGTERM, so the node stays
# COMPLETING (no new job starts) until slurmd kills it ~5 s later.
def test_scancel_shows_cancelled_and_result_does_not_hang(tmp_path: Path) -> None:
    started = tmp_path / "started"
    job = _executor(tmp_path).submit(sleep_then, 120, str(started))
    _wait_until(started.exists, "the job to start")
    job.cancel()  # scancel <id>
    assert _wait_sacct(job.job_id, "CANCELLED").startswith("CANCELLED")
    _wait_until(
        lambda: job.get_info(mode="force").get("State", "").startswith("CANCELLED"),
        "submitit to see the job as CANCELLED",
    )  # submitit's state reads "CANCELLED by 0"
    job._results_timeout_s = 2  # submitit waits 15 s for a result file by default
    t0 = time.monotonic()
    with pytest.raises(UncompletedJobError):
        job.result()
    assert time.monotonic() - t0 < 30
