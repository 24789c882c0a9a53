"""The SLURM launcher without a cluster: job specs from cluster profiles, the sbatch script
of a 1.7B cell against a recorded file (GRIDRUN_REGEN_GOLDEN=1 rewrites it), what sacct and
squeue say mapped to cell states (fake clients on PATH), and bad input. The real cluster's
tests are in tests/slurm/test_launcher.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gridrun.grid import REPO_ROOT
from gridrun.grid.errors import GridError
from gridrun.grid.launchers.slurm import (
    SlurmLauncher,
    SlurmSettings,
    by_job,
    chunks,
    executor_parameters,
    job_spec,
    sbatch_script,
    warning_lead_s,
)
from gridrun.grid.sweepdir import PlanEntry
from gridrun.seam.cellstate import CellState, StateRecord
from tests.grid.conftest import Gridrun
from tests.states import put_state

GOLDEN = Path(__file__).parent / "golden"
CELL = {
    "id": "voting-ip-4b-math-s0",
    "resources": {"gpu_class": "h100", "gpus": 2, "cpus": 16, "mem_gb": 128, "time_limit_h": 48, "partition": "h100"},
}
PAPER = {
    "name": "paper",
    "partitions": {"l40s": "l40s", "h100": "h100"},
    "gpu_types": {"l40s": "l40s", "h100": "h100"},
    "constraints": {"h100": "h100_80gb"},
    "account": "proj",
    "qos": None,
    "tasks_per_cell": None,
    "sbatch_extra": ["--exclusive", "--mail-type=FAIL"],
    "setup": ["module load cuda"],
    "cell_overrides": {"*-4b-*": {"time_limit_h": 72}},
}


def test_sbatch_script_of_a_17b_cell_matches_the_golden_file(tmp_path: Path) -> None:
    from gridrun.cli import main

    results = tmp_path / "results"
    code = main(["plan", "conf=full_matrix", "scale=1.7b", "task=math", "workflow=voting", "policy=isolated",
                 "seed=0", "kind=train", "cluster=paper", "launcher=slurm", "--results-dir", str(results)])
    assert code == 0
    sweep = json.loads((results / "full_matrix" / "sweep.json").read_text())
    (cell,) = sweep["cells"]
    spec = job_spec(cell, sweep["cluster"], env={"SLURM_CONF": "/etc/slurm/slurm.conf"})
    settings = SlurmSettings(**sweep["launcher"])
    lead = warning_lead_s([PlanEntry.from_json(cell)], spec, settings)
    # The plan's step estimate, not the fixed 300 s (shorter than a real 1.7B math step).
    assert lead > 300
    script = sbatch_script(executor_parameters(spec, settings, "gridrun-full_matrix", lead_s=lead),
                           results / "full_matrix" / "jobs" / "%j", python="/venv/bin/python")
    # Paths of this checkout and this test run are placeholders in the recorded file.
    script = script.replace(str(results), "<RESULTS>").replace(str(REPO_ROOT), "<REPO>")
    golden = GOLDEN / "sbatch_voting-ip-1.7b-math-s0.sh"
    if os.environ.get("GRIDRUN_REGEN_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text(), f"sbatch script changed; if on purpose: GRIDRUN_REGEN_GOLDEN=1 pytest {__file__}"
    # One whole 2-GPU H100 node, one rank per GPU (each task bound to its own), the warning
    # signal before the limit; no job-wide --gres, which would show each task both GPUs;
    # any rank's failure ends the job's step at once.
    assert "--gres" not in script and "srun --unbuffered" in script and " --kill-on-bad-exit=1 " in script
    for line in ("--gpus-per-task=h100:1", "--ntasks-per-node=2", "--cpus-per-task=8", "--partition=h100",
                 f"--signal=USR2@{lead}", "--time=2880"):
        assert f"#SBATCH {line}\n" in script


def fake(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def fake_submission(bin_dir: Path, sbatch: str) -> None:
    """A stand-in sbatch, and an srun beside it: submitit looks for srun on the submitting
    machine, which never runs it (a machine without SLURM has neither)."""
    fake(bin_dir, "sbatch", sbatch)
    fake(bin_dir, "srun", "exit 0\n")


def test_a_two_gpu_cell_gets_one_task_per_gpu_typed_gres_and_its_overrides() -> None:
    spec = job_spec(CELL, PAPER, env={"SLURM_CONF": "/etc/slurm.conf", "HOME": "/x"})
    # 16 CPUs over 2 tasks; 72 h from the 4b override instead of the cell's 48.
    assert (spec.partition, spec.ntasks, spec.cpus_per_task, spec.mem) == ("h100", 2, 8, "128G")
    assert (spec.gpus_per_task, spec.constraint, spec.account, spec.time_min) == ("h100:1", "h100_80gb", "proj", 72 * 60)
    assert spec.extra == (("exclusive", None), ("mail-type", "FAIL"))
    assert spec.setup[0] == "export SLURM_CONF=/etc/slurm.conf" and spec.setup[-1] == "module load cuda"
    params = spec.parameters()
    assert params["additional_parameters"] == {"exclusive": True, "mail-type": "FAIL"}


def test_an_untyped_gpu_class_and_a_cpu_cell() -> None:
    cluster = {**PAPER, "gpu_types": {"h100": None}, "cell_overrides": {}}
    assert job_spec(CELL, cluster, env={}).gpus_per_task == "1"
    cpu = {"id": "sa_rl-toy-arith-s0", "resources": {"gpu_class": "cpu", "gpus": 0, "cpus": 1, "mem_gb": 0.5,
                                                     "time_limit_h": 0.25, "partition": "debug"}}
    spec = job_spec(cpu, cluster, env={})
    assert (spec.gpus_per_task, spec.ntasks, spec.mem, spec.time_min) == (None, 1, "512M", 15)
    assert "gpus_per_task" not in spec.parameters()


def test_a_gpu_cell_with_fewer_tasks_than_gpus_is_refused() -> None:
    # One rank with both GPUs would train on one and leave its engine to pick: refused.
    with pytest.raises(GridError, match=r"1 tasks for 2 GPUs, and each rank needs exactly its own GPU: set tasks_per_cell: null"):
        job_spec(CELL, {**PAPER, "tasks_per_cell": 1}, env={})


def test_each_rank_sees_exactly_its_own_gpu() -> None:
    from gridrun.grid.launchers.process import GpuBindingError, bind_gpu

    # The scheduler bound the task (--gpus-per-task): kept as it is.
    assert bind_gpu({"CUDA_VISIBLE_DEVICES": "3"}, 1, 2) == {"CUDA_VISIBLE_DEVICES": "3"}
    # The job was bound, not the task (a site that ignores per-task binding): by local rank.
    assert bind_gpu({"CUDA_VISIBLE_DEVICES": "2,3"}, 0, 2) == {"CUDA_VISIBLE_DEVICES": "2"}
    assert bind_gpu({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, 1, 2) == {"CUDA_VISIBLE_DEVICES": "GPU-b"}
    # A CPU cell: nothing to bind.
    assert bind_gpu({}, 0, 1) == {} and bind_gpu({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 0, 2) == {}
    with pytest.raises(GpuBindingError, match=r"^rank 0 of 2 on this node sees GPUs 0,1,2: each rank needs exactly its own"):
        bind_gpu({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 0, 2)


def test_cells_with_one_spec_share_an_array_cut_to_max_array_size() -> None:
    assert [len(c) for c in chunks(list(range(2500)), 1001)] == [1001, 1001, 498]


def test_bad_profiles_name_the_fix() -> None:
    with pytest.raises(GridError, match=r"no partition for GPU class 'h100'.*add `partitions: \{h100: <partition>\}`"):
        job_spec({**CELL, "resources": {**CELL["resources"], "partition": None}}, PAPER, env={})
    # A key a cell override may not set: the schema names the keys it may (gridrun/grid/gridconfig.py).
    with pytest.raises(GridError, match=r"unknown config key 'grid.cluster.cell_overrides.\*-4b-\*.gpus' \(valid: partition"):
        job_spec(CELL, {**PAPER, "cell_overrides": {"*-4b-*": {"gpus": 4}}}, env={})
    with pytest.raises(GridError, match="must be one long option"):
        job_spec(CELL, {**PAPER, "sbatch_extra": ["-N 2"]}, env={})


# ---------------------------------------------------------------- sweep command, bad input
def test_sbatch_missing_is_one_line_naming_the_fix(gridrun: Gridrun, results: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = gridrun("sweep", "conf=smoke", "cluster=testcluster", "launcher=slurm")
    assert result.code == 2
    assert result.err.strip().count("\n") == 0
    assert "sbatch and srun are not on PATH" in result.err and "slurm/testcluster/up.sh" in result.err
    states = {json.loads(p.read_text())["state"] for p in results.glob("smoke/cells/*/state.json")}
    assert states == {"planned"}  # refused before anything was queued
    # sbatch alone: submitit would refuse to submit later, after the preflight; refused now.
    fake(tmp_path / "bin", "sbatch", "exit 0\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    result = gridrun("sweep", "conf=smoke", "cluster=testcluster", "launcher=slurm")
    assert result.code == 2 and "gridrun: error: srun is not on PATH: run launcher=slurm on a SLURM" in result.err


def test_a_slurm_launcher_on_the_local_profile_or_a_missing_partition(gridrun: Gridrun, results: Path,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake_submission(tmp_path / "bin", "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    result = gridrun("sweep", "conf=smoke", "launcher=slurm")
    assert result.code == 2 and "cluster=local has no partitions: set cluster=testcluster" in result.err
    result = gridrun("sweep", "conf=smoke", "cluster=testcluster", "launcher=slurm", "grid.cluster.partitions.cpu=null",
                     "--replace")
    assert result.code == 2
    assert "cluster profile 'testcluster' names no partition for GPU class 'cpu'" in result.err
    assert "conf/cluster/testcluster.yaml" in result.err


def test_an_unknown_cluster_profile_lists_the_profiles(gridrun: Gridrun, results: Path) -> None:
    result = gridrun("sweep", "conf=smoke", "cluster=testclustr", "launcher=slurm")
    assert result.code == 2 and "unknown cluster 'testclustr' (did you mean 'testcluster'?)" in result.err


# ---------------------------------------------------------------- reconcile: sacct, squeue
def active(job: str, state: str = "running", age_s: float = 3600) -> StateRecord:
    return StateRecord.from_json({"state": state, "job_id": job, "queued_at": time.time() - age_s, "launcher": "slurm"})


def test_scheduler_words_map_to_cell_states_with_one_sacct_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    fake(tmp_path / "bin", "sacct", f"""echo "$@" >> {calls}
cat <<'EOF'
7_0|COMPLETED|0:0|2020-01-01T00:00:00
7_1|CANCELLED by 0|0:15|2020-01-01T00:00:00
7_2|TIMEOUT|0:0|2020-01-01T00:00:00
7_3|NODE_FAIL|0:0|2020-01-01T00:00:00
7_4|OUT_OF_MEMORY|0:125|2020-01-01T00:00:00
7_5|RUNNING|0:0|Unknown
7_[6-8%2]|PENDING|0:0|Unknown
9|PREEMPTED|0:0|2020-01-01T00:00:00
EOF
""")
    fake(tmp_path / "bin", "squeue", "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    states = {f"c{i}": active(f"7_{i}") for i in range(9)} | {"c9": active("9"), "new": active("11", "queued", 5)}
    states["c6"] = states["c6"].with_(state=CellState.QUEUED)
    seen = SlurmLauncher.reconcile(states)
    assert calls.read_text().count("\n") == 1 and "-j 11,7,9" in calls.read_text()
    assert {k: v[0] for k, v in seen.items()} == {
        "c0": "failed", "c1": "cancelled", "c2": "preempted", "c3": "failed", "c4": "failed",
        "c5": "running", "c6": "queued", "c7": "running", "c8": "running", "c9": "preempted",
    }  # "new" was submitted 5 s ago and is not listed yet: left alone
    assert "OUT_OF_MEMORY" in seen["c4"][1] and "mem_gb_per_cell" in seen["c4"][1]
    assert seen["c6"] == ("queued", "PENDING")  # no change, the scheduler's word only


def test_squeue_stands_in_when_accounting_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake(tmp_path / "bin", "sacct", "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1\n")
    fake(tmp_path / "bin", "squeue", "printf '5_0|RUNNING\\n5_1|PENDING\\n'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    seen = SlurmLauncher.reconcile({"a": active("5_0"), "b": active("5_1", "queued"), "c": active("5_2")})
    assert seen["a"] == ("running", "RUNNING") and seen["b"] == ("queued", "PENDING")
    assert seen["c"][0] == "failed" and seen["c"][1].startswith("lost: job 5_2")


def test_status_shows_the_scheduler_state_under_the_job(gridrun: Gridrun, results: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake(tmp_path / "bin", "sacct", "echo '42_0|PENDING|0:0|Unknown'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert gridrun("plan", "conf=smoke", "workflow=voting", "policy=shared", "kind=train").code == 0
    cell = results / "smoke" / "cells" / "voting-sp-toy-arith-s0" / "state.json"
    cell.write_text(json.dumps({**json.loads(cell.read_text()), **active("42_0", "queued").to_json(), "attempt": 1}))
    rows = json.loads(gridrun("status", "conf=smoke", "--json").out)
    assert (rows[0]["state"], rows[0]["job_id"], rows[0]["scheduler"]) == ("queued", "42_0", "PENDING")
    # The job column: the id, and the scheduler's word on the line under it.
    lines = gridrun("status", "conf=smoke").out.splitlines()
    at = next(i for i, line in enumerate(lines) if "voting-sp-toy-arith-s0" in line)
    assert "42_0" in lines[at] and "PENDING" in lines[at + 1] and "voting" not in lines[at + 1]


def test_array_ids_expand() -> None:
    # sacct lists an array's pending elements as one row, `12_[3-5,7%2]` (3 to 5, and 7, at
    # most 2 at once): 4 elements share its state; a job step (13.batch) is not a job.
    rows = "12_[3-5,7%2]|PENDING\n12_0|RUNNING\n13|COMPLETED\n13.batch|COMPLETED\n"
    states = {job: row["State"] for job, row in by_job(("JobID", "State"), rows).items()}
    assert states == {"12_3": "PENDING", "12_4": "PENDING", "12_5": "PENDING", "12_7": "PENDING",
                      "12_0": "RUNNING", "13": "COMPLETED"}


# ---------------------------------------------------------------- the job's bookkeeping
def test_a_requeue_opens_the_next_attempt_once(tmp_path: Path) -> None:
    from gridrun.grid.launchers.slurm_job import CellJob
    from gridrun.seam.rundir import RunDir

    run_dir = RunDir(tmp_path)
    run_dir.config_yaml.write_text("{}\n")  # a planned cell (without it, it reads missing)
    put_state(run_dir, state="running", attempt=1, job_id="7_2", launcher="slurm", step=3)
    job = CellJob(str(tmp_path), time_min=30, signal_delay_s=60)
    job._record_requeue(run_dir, 0, "preempted (SIGUSR2) and requeued")
    job._record_requeue(run_dir, 0, "again")  # the restarted run finds it recorded
    state = run_dir.read_state().to_json()
    assert (state["state"], state["attempt"], state["requeues"], state["slurm_restarts"]) == ("queued", 2, 1, 1)
    assert state["job_id"] == "7_2" and [(a["state"], a["step"]) for a in state["attempts"]] == [("preempted", 3)]
    # The record says where the next attempt starts: no checkpoint was written, so step 0.
    assert state["attempts"][0]["error"] == "preempted (SIGUSR2) and requeued; restarts from step 0: no complete checkpoint"


def test_a_requeues_record_names_the_checkpoint_the_next_attempt_resumes_from(tmp_path: Path) -> None:
    from gridrun.grid.launchers.slurm_job import CellJob
    from gridrun.seam.rundir import COMPLETE_MARKER, RunDir

    run_dir = RunDir(tmp_path)
    run_dir.config_yaml.write_text("{}\n")
    put_state(run_dir, state="preempted", attempt=1, job_id="7_2", launcher="slurm", step=12)
    # Step 8's checkpoint is whole; step 12's was cut short before its marker.
    for step in (8, 12):
        run_dir.checkpoint(step).mkdir(parents=True)
    (run_dir.checkpoint(8) / COMPLETE_MARKER).write_text("8\n")
    CellJob(str(tmp_path), time_min=5, signal_delay_s=60)._record_requeue(run_dir, 0, "requeued near its 5 min time limit (SIGUSR2)")
    (ended,) = run_dir.read_state().to_json()["attempts"]
    assert ended["error"] == "requeued near its 5 min time limit (SIGUSR2); resumes from the checkpoint of step 8"


def test_each_job_spends_its_own_cells_requeue_budget(tmp_path: Path) -> None:
    from gridrun.grid.launchers.slurm_job import CellJob
    from gridrun.seam.rundir import RunDir

    run_dir = RunDir(tmp_path)
    run_dir.config_yaml.write_text("{}\n")
    # The trainer stopped on the warning (no child process here: it has exited).
    put_state(run_dir, state="preempted", attempt=1, job_id="7_2", launcher="slurm", step=3)
    # Under a 5 min limit every warning is the time limit (submitit's rule, `timed_out`): each
    # requeue spends one of the cell's requeues, and with none left the job is not requeued.
    again = CellJob(str(tmp_path), time_min=5, signal_delay_s=60, timeouts_left=1).checkpoint()
    assert again is not None and again.function.timeouts_left == 0
    assert again.function.checkpoint() is None
    # Under a 30 min limit a warning this early is a preemption: nothing is spent.
    preempted = CellJob(str(tmp_path), time_min=30, signal_delay_s=60, timeouts_left=0).checkpoint()
    assert preempted is not None and preempted.function.timeouts_left == 0


def test_every_rank_decides_alike_whether_the_job_runs_the_cell(tmp_path: Path) -> None:
    from gridrun.grid.launchers.slurm_job import CellJob
    from gridrun.seam.rundir import RunDir

    run_dir = RunDir(tmp_path)
    run_dir.config_yaml.write_text("{}\n")  # a planned cell (without it, it reads missing)
    job = CellJob(str(tmp_path), time_min=30, signal_delay_s=60)
    put_state(run_dir, state="queued", attempt=1, job_id="7_2")
    assert job._should_run(run_dir, "7_2", 0, record=False)
    assert not job._should_run(run_dir, "8", 0, record=False)  # the cell belongs to another job
    put_state(run_dir, state="cancelled")
    assert not job._should_run(run_dir, "7_2", 0, record=False)  # cancelled before it started
    # Cancelled by the SIGTERM of a requeue its last run could not record: run, as attempt 2.
    assert job._should_run(run_dir, "7_2", 1, record=True) and run_dir.read_state().to_json()["attempt"] == 2
    put_state(run_dir, state="done")
    assert not job._should_run(run_dir, "7_2", 2, record=True) and run_dir.read_state().to_json()["state"] == "done"


def test_resubmissions_stop_at_max_attempts_failures_and_other_attempts_do_not_count(
    gridrun: Gridrun, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gridrun.grid.sweepdir import SweepDir

    fake_submission(tmp_path / "bin", "exit 0\n")  # sbatch --test-only accepts every spec
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert gridrun("plan", "conf=smoke", "cluster=testcluster", "launcher=slurm", "kind=base").code == 0
    sweep = SweepDir(results, "smoke")
    ids = sweep.cell_ids()[:3]
    # Failed twice; six attempts, one of them failed (the others preempted at the time limit,
    # resubmitted --preempted, or cancelled); failed once.
    histories = (["failed"], ["preempted", "preempted", "cancelled", "failed", "preempted"], [])
    for cell_id, history, now in zip(ids, histories, ("failed", "preempted", "failed")):
        put_state(sweep.cell(cell_id), state=now, attempt=len(history) + 1,
                  attempts=[{"attempt": n + 1, "state": was} for n, was in enumerate(history)])
    admitted = SlurmLauncher({"name": "slurm", "max_attempts": 2}).admit(sweep, ids)
    assert admitted == ids[1:]
    assert f"not resubmitting {ids[0]}: it has failed 2 times (grid.launcher.max_attempts=2)" in caplog.text


def test_a_cells_requeue_budget_follows_from_its_planned_hours_and_time_limit() -> None:
    from gridrun.grid.launchers.slurm import requeue_budget

    def entry(cell_id: str, est_hours: float, total_steps: int = 500, limit_h: float = 48) -> PlanEntry:
        return PlanEntry.from_json({"id": cell_id, "kind": "train", "coords": {}, "est_hours": est_hours,
                                    "total_steps": total_steps, "resources": {**CELL["resources"], "time_limit_h": limit_h}})

    settings = SlurmSettings(signal_delay_s=300)
    # 140 h over 500 steps: 1008 s a step, a lead of 2 x 1008 + 120 = 2136 s; with 300 s to
    # restart a 48 h job trains 48 - 2436 / 3600 = 47.32 h. The plan takes ceil(2.96) = 3 jobs;
    # 1.5 x 140 h would take ceil(4.44) = 5, so 4 requeues.
    budget = requeue_budget(entry("voting-ip-1.7b-math-s0", 140.0), PAPER, settings)
    assert (round(budget.segment_h, 2), budget.segments, budget.requeues, budget.needs_person) == (47.32, 3, 4, False)
    # PAPER's cell_overrides give 4B cells 72 h: ceil(140 / 71.32) = 2 jobs, ceil(2.94) - 1 = 2 requeues.
    assert (requeue_budget(entry("voting-ip-4b-math-s0", 140.0), PAPER, settings).segments,
            requeue_budget(entry("voting-ip-4b-math-s0", 140.0), PAPER, settings).requeues) == (2, 2)
    # An evaluation of minutes: one job, no requeue.
    small = requeue_budget(entry("base-voting-1.7b-math", 0.2, total_steps=0), PAPER, settings)
    assert (small.segments, small.requeues, small.needs_person) == (1, 0, False)
    # One budget for every cell (grid.launcher.max_num_timeout=1): 3 jobs need 2 requeues.
    fixed = requeue_budget(entry("voting-ip-1.7b-math-s0", 140.0), PAPER, SlurmSettings(max_num_timeout=1))
    assert (fixed.requeues, fixed.derived, fixed.needs_person) == (1, False, True)
    # A 5 min test-cluster limit, shorter than the floor lead and a restart: half of it trains.
    short = requeue_budget(entry("voting-ip-1.7b-math-s0", 0.5, 400, limit_h=0.083), PAPER, SlurmSettings(signal_delay_s=60))
    assert (round(short.segment_h * 60, 1), short.segments, short.requeues) == (2.5, 12, 17)


def test_the_dry_run_on_the_paper_profile_shows_each_cells_requeues_and_no_cell_needing_a_person(
    gridrun: Gridrun,
) -> None:
    from gridrun.grid.compose import Composer
    from gridrun.grid.launchers.slurm import requeue_budgets
    from gridrun.grid.plan import make_plan
    from gridrun.grid.spec import load_spec

    result = gridrun("plan", "conf=full_matrix", "cluster=paper", "--dry-run")
    assert result.code == 0, result.err
    out = " ".join(result.out.split())
    composer = Composer()
    plan = make_plan(load_spec("full_matrix", ["cluster=paper"], composer), composer)
    budgets = requeue_budgets([PlanEntry.from_json(pc.entry()) for pc in plan.cells], plan.cluster, plan.launcher)
    assert len(budgets) == 72 and not any(budget.needs_person for budget in budgets.values())
    longest = max(plan.cells, key=lambda pc: pc.est_hours)
    row = next(line.split("│") for line in result.out.splitlines() if longest.id in line)
    # 460 h against 48 h jobs: 10 or more segments, and the requeues for 1.5 times as many hours.
    assert [c.strip() for c in row[13:15]] == [str(budgets[longest.id].segments), str(budgets[longest.id].requeues)]
    assert budgets[longest.id].segments >= 10 and budgets[longest.id].requeues >= 14
    assert "no cell needs a person" in out and f"up to {budgets[longest.id].requeues} ({longest.id})" in out
    # One budget of 3 for every cell, as submitit's default: the long cells would stop preempted.
    fixed = gridrun("plan", "conf=full_matrix", "cluster=paper", "launcher=slurm", "grid.launcher.max_num_timeout=3",
                    "--dry-run")
    stuck = [pc.id for pc in plan.cells if budgets[pc.id].segments > 4]
    assert stuck and f"{len(stuck)} cell(s) need a person to finish ({stuck[0]}," in " ".join(fixed.out.split())


# ---------------------------------------------------------------- issue 30: signals and failures
def test_the_warning_lead_covers_the_slowest_cells_step_and_a_checkpoint() -> None:
    from gridrun.grid.launchers.slurm import CHECKPOINT_S, warning_lead_s

    spec = job_spec(CELL, PAPER, env={})
    settings = SlurmSettings(signal_delay_s=300)
    # 2 h over 10 steps: 720 s a step (more than the fixed 300 s would have left).
    def entry(est_hours: float, total_steps: int) -> PlanEntry:
        coords = {"workflow": "voting", "task": "math", "scale": "4b"}
        return PlanEntry.from_json({**CELL, "kind": "train", "coords": coords, "est_hours": est_hours,
                                    "total_steps": total_steps})

    assert warning_lead_s([entry(2.0, 10), entry(0.1, 10)], spec, settings) == 2 * 720 + CHECKPOINT_S
    assert warning_lead_s([entry(0.01, 100)], spec, settings) == 300  # the floor
    with pytest.raises(GridError, match="more than half of the .* min limit: raise the cluster profile's time_limit_h"):
        warning_lead_s([entry(200.0, 10)], spec, settings)


def test_a_rank_that_fails_ends_the_job_and_its_error_is_the_cells(tmp_path: Path) -> None:
    from gridrun.grid.launchers.slurm_job import CellJob
    from gridrun.seam.rundir import RunDir

    params = job_spec(CELL, PAPER, env={}).parameters()
    assert "--kill-on-bad-exit=1" in params["srun_args"]
    run_dir = RunDir(tmp_path)
    run_dir.config_yaml.write_text("{}\n")
    put_state(run_dir, state="running", attempt=1, job_id="7_2", launcher="slurm", step=3, started_at=time.time() - 5)
    run_dir.write_rank_error(1, "Traceback (most recent call last):\nValueError: rank 1 broke")
    job = CellJob(str(tmp_path), time_min=30, signal_delay_s=60)
    # Rank 0's trainer, killed inside a collective once srun ended the step, recorded nothing.
    with pytest.raises(RuntimeError, match="rank 1 broke"):
        job._finish(run_dir, 0, 0, -9, run_dir.stderr_log)
    state = run_dir.read_state().to_json()
    assert state["state"] == "failed" and state["error"].startswith("rank 1 failed: Traceback")



def test_pending_shows_slurms_reason_and_a_failure_names_the_file_with_its_error(
    gridrun: Gridrun, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake(tmp_path / "bin", "sacct", """cat <<'EOF'
42_0|PENDING|0:0|Unknown|QOSMaxGRESPerUser
42_1|FAILED|1:0|2020-01-01T00:00:00|None
42_2|FAILED|1:0|2020-01-01T00:00:00|None
EOF
""")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    seen = SlurmLauncher.reconcile({"a": active("42_1", "queued"), "b": active("42_2", "running")})
    # Before its trainer started, the error is in the job's own stderr, not in the cell's logs.
    assert seen["a"][1].endswith("see jobs/42_1/42_1_0_log.err in the sweep dir")
    assert seen["b"][1].endswith("see logs/stderr.log in the cell dir")
    assert gridrun("plan", "conf=smoke", "workflow=voting", "policy=shared", "kind=train").code == 0
    cell = results / "smoke" / "cells" / "voting-sp-toy-arith-s0" / "state.json"
    cell.write_text(json.dumps({**json.loads(cell.read_text()), **active("42_0", "queued").to_json(), "attempt": 1}))
    lines = gridrun("status", "conf=smoke").out.splitlines()
    at = next(i for i, line in enumerate(lines) if "voting-sp-toy-arith-s0" in line)
    assert "42_0" in lines[at] and "PENDING (QOSMaxGRESPerUser)" in lines[at + 1]


def test_an_array_rejected_midway_keeps_the_accepted_ids_and_resubmits_only_the_rest(
    gridrun: Gridrun, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real submitit against a stand-in sbatch: the first array is accepted, the second hits
    # a per-user job limit (what `sbatch --test-only` on one job does not see).
    from gridrun.grid.launchers import slurm
    from gridrun.grid.sweepdir import SweepDir

    count = tmp_path / "count"
    limit = "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit)"
    fake_submission(tmp_path / "bin", f"""case "$*" in *--test-only*) exit 0;; esac
n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); echo $n > {count}
if [ $n -eq 2 ] && [ ! -e {tmp_path / "lifted"} ]; then echo "{limit}" >&2; exit 1; fi
echo "Submitted batch job $((100 * n))"
""")
    fake(tmp_path / "bin", "scontrol", "echo 'MaxArraySize            = 4'\n")
    fake(tmp_path / "bin", "scancel", "exit 0\n")
    fake(tmp_path / "bin", "sacct", "exit 0\n")
    fake(tmp_path / "bin", "squeue", "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    slurm.max_array_size.cache_clear()
    monkeypatch.setattr(slurm, "max_array_size", lambda: 4)
    # The launcher's submission is under test, not the preflight (tests/slurm/test_preflight.py).
    result = gridrun("sweep", "conf=smoke", "cluster=testcluster", "launcher=slurm", "kind=base,sa_rl", "--no-preflight")
    sweep = SweepDir(results, "smoke")
    states = {cell_id: sweep.cell(cell_id).read_state().to_json() for cell_id in sweep.cell_ids()}
    accepted = {c: s["job_id"] for c, s in states.items() if s["state"] == "queued"}
    rejected = [c for c, s in states.items() if s["state"] != "queued"]
    # 5 cells (4 base, 1 sa_rl): the base array (4, the first chunk) went out, the next did not.
    assert sorted(accepted.values()) == ["100_0", "100_1", "100_2", "100_3"]
    assert len(rejected) == 1 and states[rejected[0]]["state"] == "failed"
    assert "job submit limit" in states[rejected[0]]["error"] and "gridrun resubmit conf=smoke --failed" in states[rejected[0]]["error"]
    # One line naming SLURM's error and the cells it left out.
    assert result.code == 2 and result.err.strip().count("\n") == 0, result.err
    assert "job submit limit" in result.err and "gridrun resubmit" in result.err
    # The limit lifted, `resubmit --failed` submits the rejected cell only: no duplicate job.
    (tmp_path / "lifted").touch()
    assert gridrun("resubmit", "conf=smoke", "--failed").code == 0
    after = {cell_id: sweep.cell(cell_id).read_state().to_json() for cell_id in sweep.cell_ids()}
    assert {c: s["job_id"] for c, s in after.items() if c in accepted} == accepted
    assert after[rejected[0]]["state"] == "queued" and after[rejected[0]]["job_id"] == "300"  # the third sbatch


def test_an_sbatch_that_hangs_fails_the_submission_by_its_deadline(
    gridrun: Gridrun, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # submitit's own sbatch call has no timeout: gridrun's runs under one (GRIDRUN_SLURM_TIMEOUT).
    import time

    from gridrun.grid.launchers import slurm
    from gridrun.grid.sweepdir import SweepDir

    fake(tmp_path / "bin", "sbatch", 'case "$*" in *--test-only*) exit 0;; esac\nsleep 300\n')
    fake(tmp_path / "bin", "srun", "exit 0\n")  # submitit looks for it
    fake(tmp_path / "bin", "scontrol", "echo 'MaxArraySize            = 4'\n")
    for client in ("scancel", "sacct", "squeue"):
        fake(tmp_path / "bin", client, "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("GRIDRUN_SLURM_TIMEOUT", "2")
    slurm.max_array_size.cache_clear()
    started = time.monotonic()
    result = gridrun("sweep", "conf=smoke", "cluster=testcluster", "launcher=slurm", "kind=base", "--no-preflight")
    assert time.monotonic() - started < 60
    assert result.code == 2 and result.err.strip().count("\n") == 0, result.err
    assert "sbatch did not answer in 2 s" in result.err and "GRIDRUN_SLURM_TIMEOUT" in result.err
    sweep = SweepDir(results, "smoke")
    assert {sweep.cell(c).read_state().state for c in sweep.cell_ids()} == {"failed"}


def test_a_preflight_whose_sbatch_hangs_ends_by_its_timeout(
    gridrun: Gridrun, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    fake(tmp_path / "bin", "sbatch", 'case "$*" in *--test-only*) exit 0;; esac\nsleep 300\n')
    for client in ("srun", "scancel", "sacct", "squeue", "scontrol"):
        fake(tmp_path / "bin", client, "exit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    started = time.monotonic()
    result = gridrun("preflight", "conf=smoke", "cluster=testcluster", "launcher=slurm", "kind=base", "--timeout-min", "0.1")
    assert time.monotonic() - started < 60
    assert result.code != 0 and "sbatch did not answer within the preflight's 0.1 min" in result.out, result.out
