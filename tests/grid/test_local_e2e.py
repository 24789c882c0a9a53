"""End to end through the real trainer on the toy world (slow: `pytest -m slow`).

The smoke sweep runs every cell through the local launcher; a cell killed with -9 is
recorded as failed (or read as lost when its launcher died too) and `gridrun resubmit
--failed` resumes it from its newest complete checkpoint; Ctrl-C cancels cleanly; a cell
deleted while it trains ends `missing` and the others finish. Runs
are shrunk (a few steps, tiny batches) so that each cell takes seconds once the toy world
loads (the shipped one: nothing is built).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gridrun.seam.rundir import RunDir
from tests.conftest import wait_until

pytestmark = pytest.mark.slow

TINY = [
    "train.batch_problems=4",
    "train.ppo_mini_batch=4",
    "grpo.n=2",
    "train.val_problems=16",
    "train.val_samples=2",
]


def gridrun(results: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GRIDRUN_RESULTS=str(results))
    return subprocess.run(
        [sys.executable, "-m", "gridrun.cli", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def start(results: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, GRIDRUN_RESULTS=str(results))
    return subprocess.Popen(
        [sys.executable, "-m", "gridrun.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def freeze_once(cell: RunDir, ready: Callable[[], bool]) -> int | None:
    """SIGSTOP the cell's process as soon as `ready()` holds; its pid, else None."""
    if not ready():
        return None
    pid = cell.read_state().to_json()["pid"]
    os.kill(pid, signal.SIGSTOP)
    return pid


def status(results: Path) -> dict[str, dict]:
    proc = gridrun(results, "status", "conf=smoke", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {row["cell"]: row for row in json.loads(proc.stdout)}


def train_steps(run_dir: RunDir) -> list[int]:
    return [row["step"] for row in run_dir.read_metrics() if row["split"] == "train"]


def test_smoke_sweep_runs_every_cell_and_table1_has_every_number(results: Path) -> None:
    proc = gridrun(results, "sweep", "conf=smoke", "train.total_steps=2", *TINY, "--max-parallel", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = status(results)
    assert len(rows) == 11 and {row["state"] for row in rows.values()} == {"done"}
    assert rows["voting-ip-toy-arith-s0"]["step"] == 2 and rows["voting-ip-toy-arith-s0"]["peak_val_acc"] is not None
    proc = gridrun(results, "collect", "conf=smoke", timeout=120)
    assert proc.returncode == 0, proc.stderr
    # Greedy validation of one base model: every cell's step 0 equals its base control.
    assert "disagrees" not in proc.stdout
    table = list(csv.DictReader((results / "smoke" / "table1.csv").open()))
    assert [row["workflow"] for row in table] == ["eval_opt", "voting", "orch_workers"]
    for row in table:
        for column in ("base", "sa_rl", "ip", "sp", "ip_minus_sa", "sp_minus_sa"):
            float(row[column])  # a number, not a state


def test_kill_9_of_a_cell_then_resubmit_resumes_from_its_checkpoint(results: Path) -> None:
    args = ["conf=smoke", "kind=sa_rl", "train.total_steps=12", "train.save_every=2", "train.val_every=6", *TINY]
    launcher = start(results, "sweep", *args)
    cell = RunDir(results / "smoke" / "cells" / "sa_rl-toy-arith-s0")
    # Frozen the moment the predicate holds: a toy step takes a fraction of a second, so a
    # cell left running between the poll and the kill could finish first.
    pid = wait_until(lambda: freeze_once(cell, lambda: (cell.latest_checkpoint() or (0,))[0] >= 2
                                         and cell.read_state().to_json().get("step", 0) >= 3),
                     "a checkpoint at step 2 and step 3 under way", 900)
    assert cell.read_state().to_json()["state"] == "running"
    os.kill(pid, signal.SIGKILL)
    assert launcher.wait(120) == 1, launcher.stdout.read() if launcher.stdout else ""
    state = cell.read_state().to_json()
    assert state["state"] == "failed" and "killed by SIGKILL" in state["error"]
    checkpoint = cell.latest_checkpoint()
    assert checkpoint is not None
    assert status(results)["sa_rl-toy-arith-s0"]["state"] == "failed"

    proc = gridrun(results, "resubmit", "conf=smoke", "--failed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = cell.read_state().to_json()
    assert (state["state"], state["attempt"], state["step"]) == ("done", 2, 12)
    assert state["attempts"][0]["state"] == "failed"
    assert f"resumed from {checkpoint[1]}" in cell.stderr_log.read_text()
    # Resuming replays from the checkpoint: each training step is recorded once.
    assert train_steps(cell) == list(range(1, 13))


def test_a_cell_whose_launcher_and_process_died_is_lost_and_resubmittable(results: Path) -> None:
    args = ["conf=smoke", "kind=sa_rl", "train.total_steps=12", "train.save_every=2", "train.val_every=6", *TINY]
    launcher = start(results, "sweep", *args)
    cell = RunDir(results / "smoke" / "cells" / "sa_rl-toy-arith-s0")
    # Frozen first, so the cell cannot finish (and record `done`) while its launcher is killed.
    pid = wait_until(lambda: freeze_once(cell, lambda: (cell.latest_checkpoint() or (0,))[0] >= 2),
                     "a checkpoint at step 2", 900)
    assert cell.read_state().to_json()["state"] == "running"
    launcher.kill()
    launcher.wait(30)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: status(results)["sa_rl-toy-arith-s0"]["state"] == "failed", "the cell marked failed", 30)
    row = status(results)["sa_rl-toy-arith-s0"]
    assert row["lost"] and row["error"].startswith("lost: ")
    # state.json itself still says running: nobody was alive to record the death.
    assert cell.read_state().to_json()["state"] == "running"
    proc = gridrun(results, "resubmit", "conf=smoke", "--failed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (cell.read_state().to_json()["state"], cell.read_state().to_json()["attempt"]) == ("done", 2)
    assert train_steps(cell) == list(range(1, 13))


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_ctrl_c_cancels_running_and_waiting_cells(results: Path, signum: int, code: int) -> None:
    # One slot: the train cell runs (train cells come first in the plan) and the SA-RL cell
    # waits. No base cells: they are dispatched first and would be done before the signal.
    # A closed terminal (SIGHUP) stops the sweep as Ctrl-C does: no cell is orphaned.
    args = ["conf=smoke", "kind=train,sa_rl", "workflow=voting", "policy=shared", "train.total_steps=50", *TINY,
            "--max-parallel", "1"]
    launcher = start(results, "sweep", *args)
    cell = RunDir(results / "smoke" / "cells" / "voting-sp-toy-arith-s0")
    wait_until(lambda: cell.read_state().to_json().get("step", 0) >= 1, "step 1", 900)
    pid = cell.read_state().to_json()["pid"]
    launcher.send_signal(signum)
    assert launcher.wait(120) == code
    rows = status(results)
    assert len(rows) == 2 and {row["state"] for row in rows.values()} == {"cancelled"}, rows
    assert cell.read_state().to_json()["error"] == "stopped by SIGTERM"
    assert rows["sa_rl-toy-arith-s0"]["step"] in (None, 0)  # it never started
    with pytest.raises(ProcessLookupError):  # the cell's process ended with the sweep
        os.kill(pid, 0)


def test_transfer_cells_wait_for_their_sa_rl_a_failed_one_blocks_them_and_resubmitting_it_releases_them(
    results: Path,
) -> None:
    args = ["conf=smoke", "kind=sa_rl,transfer", "train.total_steps=2", *TINY, "--max-parallel", "2"]
    assert gridrun(results, "plan", *args[:-2]).returncode == 0
    cells = results / "smoke" / "cells"
    sa_rl = RunDir(cells / "sa_rl-toy-arith-s0")
    transfers = [RunDir(cells / f"transfer-{w}-toy-arith-s0") for w in ("eval_opt", "voting", "orch_workers")]
    # A file where its checkpoints go: the sa_rl cell fails at its first checkpoint (planning
    # repairs a damaged config, so the failure has to come from the run itself).
    sa_rl.checkpoints_dir.write_text("not a folder\n")
    proc = gridrun(results, "sweep", *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = status(results)
    assert rows["sa_rl-toy-arith-s0"]["state"] == "failed"
    # Two slots were free, yet no transfer cell started: each waited, then was given up.
    assert [rows[t.root.name]["state"] for t in transfers] == ["blocked"] * 3
    assert all(t.read_state().to_json().get("started_at") is None and not t.metrics_jsonl.exists() for t in transfers)

    sa_rl.checkpoints_dir.unlink()
    proc = gridrun(results, "resubmit", "conf=smoke", "--failed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resubmitted 4 cells" in proc.stdout
    rows = status(results)
    assert {row["state"] for row in rows.values()} == {"done"}
    finished = sa_rl.read_state().to_json()["finished_at"]
    for transfer in transfers:
        state = transfer.read_state().to_json()
        # Started only after the sa_rl cell had finished, on the adapter of its final checkpoint.
        assert state["started_at"] >= finished and state["attempt"] == 2
        assert [(row["split"], row["step"]) for row in transfer.read_metrics()] == [("val", 0), ("test", 0)]
    adapter = f"generator runs on the adapter in {sa_rl.checkpoint(2).resolve()}/adapters/shared"
    assert all(adapter in t.stderr_log.read_text() for t in transfers[:2])
    # As in the paper, Orch-Workers has no generator: its transfer cell is the base model throughout.
    assert "orch_workers has no generator role" in transfers[2].stderr_log.read_text()
    # The analysis reads a sweep holding transfer cells.
    proc = gridrun(results, "collect", "conf=smoke", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_cell_deleted_while_it_trains_is_missing_and_the_others_finish(results: Path) -> None:
    # The probe, on the real trainer: before, the sweep died with a traceback
    # (IllegalTransition from the launcher) and the queued cells read lost without running.
    # Eight steps: the folder goes while its cell trains, however fast a toy step is here.
    args = ["conf=smoke", "workflow=eval_opt,voting", "kind=train", "train.total_steps=8", *TINY, "--max-parallel", "1"]
    launcher = start(results, "sweep", *args)
    cells = results / "smoke" / "cells"

    def training() -> Path | None:
        return next((p.parent for p in cells.glob("*/state.json") if RunDir(p.parent).read_state().to_json().get("step")), None)

    deleted = wait_until(training, "a cell at step 1", 900)
    shutil.rmtree(deleted)
    out, _ = launcher.communicate(timeout=900)
    assert launcher.returncode == 1, out
    assert f"missing   {deleted.name}  its folder is gone (deleted?): `gridrun plan conf=smoke` plans the cell again" in out
    rows = status(results)
    assert rows.pop(deleted.name)["state"] == "missing"
    assert len(rows) == 3 and {row["state"] for row in rows.values()} == {"done"}
    # Its trainer's last records were refused: nothing brought the folder back, or at most
    # what it wrote outside state.json (a validation's samples), which a plan moves aside.
    assert not (deleted / "state.json").exists() and not (deleted / "config.yaml").exists()
