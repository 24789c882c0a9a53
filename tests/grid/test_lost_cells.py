"""A cell whose folder is deleted, or whose process dies without a word, is that cell's
problem alone: the sweep finishes every other cell, `gridrun status` names what happened
(`missing`; `failed (lost)` from the run's lock), and the command that repairs it is the
one the message names.

The cells here are tests/grid/fake_cell.py (the run's lock and state.json through the real
writer, no training), started by the real local launcher; tests/grid/test_local_e2e.py runs
the trainer itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gridrun.grid.launchers import process
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.cellstate import CellState
from gridrun.seam.rundir import RunDir
from tests.conftest import wait_until
from tests.grid.conftest import Gridrun
from tests.grid.recording import submissions

FAKE_CELL = Path(__file__).with_name("fake_cell.py")


def fake_cells(monkeypatch: pytest.MonkeyPatch, steps: int, step_s: float) -> None:
    """The local launcher starts tests/grid/fake_cell.py instead of `gridrun run`."""
    monkeypatch.setattr(process, "cell_command",
                        lambda run_dir: [sys.executable, str(FAKE_CELL), str(run_dir), str(steps), str(step_s)])


def rows(gridrun: Gridrun) -> dict[str, dict]:
    result = gridrun("status", "conf=smoke", "--json")
    assert result.code == 0, result.err
    return {row["cell"]: row for row in json.loads(result.out)}


def test_a_cell_deleted_while_it_runs_is_missing_and_the_sweep_goes_on(
    gridrun: Gridrun, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe: four train cells one at a time, `rm -rf` of the running one. Before, the
    # launcher recorded `failed` over the missing state (IllegalTransition: the whole sweep
    # died with a traceback) and the queued cells read lost without ever running.
    fake_cells(monkeypatch, steps=8, step_s=0.2)
    sweep = SweepDir(results, "smoke")
    deleted: list[str] = []

    def delete_the_first_running_cell() -> None:
        def running() -> str | None:
            if not sweep.exists():
                return None
            return next((c for c in sweep.cell_ids() if sweep.cell(c).read_state().to_json().get("step", 0) >= 1), None)

        cell_id = wait_until(running, "a running cell", 60, poll=0.05)
        shutil.rmtree(sweep.cell(cell_id).root)
        deleted.append(cell_id)

    deleter = threading.Thread(target=delete_the_first_running_cell)
    deleter.start()
    result = gridrun("sweep", "conf=smoke", "workflow=eval_opt,voting", "kind=train", "grid.launcher.poll_s=0.05",
                     "--max-parallel", "1")
    deleter.join()
    (gone,) = deleted
    # Exit 1 (not every cell is done), the missing one named on its line with the fix.
    assert result.code == 1, result.err
    line = next(line for line in result.out.splitlines() if line.startswith("missing"))
    assert gone in line and "is gone (deleted?): `gridrun plan conf=smoke` plans the cell again" in line
    states = rows(gridrun)
    assert len(states) == 4 and states[gone]["state"] == "missing"
    assert {row["state"] for cell_id, row in states.items() if cell_id != gone} == {"done"}
    # The dead trainer brought no folder back (its records were refused, nothing written).
    assert not sweep.cell(gone).root.exists()
    # resubmit names the right fix; `gridrun sweep` again plans the missing cell and runs it.
    resubmit = gridrun("resubmit", "conf=smoke", "--cells", gone)
    assert resubmit.code == 0 and f"skip {gone}: missing: " in resubmit.out and "`gridrun plan conf=smoke`" in resubmit.out
    again = gridrun("sweep", "conf=smoke", "workflow=eval_opt,voting", "kind=train", "grid.launcher.poll_s=0.05")
    assert again.code == 0 and "1 new, 3 unchanged" in again.out, again.out + again.err
    assert {row["state"] for row in rows(gridrun).values()} == {"done"}


def test_leftovers_of_a_deleted_cell_are_moved_aside_by_plan(gridrun: Gridrun, results: Path) -> None:
    # What `rm -rf` under an older trainer left: logs and a state.json, no config.yaml, no
    # metrics or checkpoint. Before, plan refused it as "holds a run" until --replace.
    assert gridrun("plan", "conf=smoke", "kind=sa_rl").code == 0
    cell = SweepDir(results, "smoke").cell("sa_rl-toy-arith-s0")
    for path in (cell.config_yaml, cell.cell_json):
        path.unlink()
    cell.stdout_log.parent.mkdir()
    cell.stdout_log.write_text("old log\n")
    assert cell.read_state().to_json()["state"] == "missing"
    result = gridrun("plan", "conf=smoke", "kind=sa_rl")
    assert result.code == 0 and "0 new, 0 unchanged, 1 replaced" in result.out, result.err
    (aside,) = (results / "smoke" / "replaced").iterdir()
    assert (aside / "logs" / "stdout.log").read_text() == "old log\n"
    assert cell.read_state().to_json()["state"] == "planned"


def test_a_hand_run_cell_killed_with_9_reads_lost_from_its_lock(gridrun: Gridrun, smoke: SweepDir) -> None:
    # `gridrun run <cell>` by hand (no launcher recorded), then kill -9: state.json says
    # running for ever; the run's lock, dropped by the OS, says it is not.
    cell_id = "voting-ip-toy-arith-s0"
    cell: RunDir = smoke.cell(cell_id)
    proc = subprocess.Popen([sys.executable, str(FAKE_CELL), str(cell.root), "1000", "0.2"])
    try:
        wait_until(lambda: cell.read_state().to_json().get("step", 0) >= 1, "the hand-run cell at step 1", 60, poll=0.05)
        live = rows(gridrun)[cell_id]
        assert (live["state"], live["lost"]) == ("running", False)
    finally:
        proc.kill()
        proc.wait()
    assert cell.read_state().to_json()["state"] == "running"  # nobody was alive to record the death
    row = rows(gridrun)[cell_id]
    assert (row["state"], row["lost"]) == ("failed", True)
    assert row["error"].startswith(f"lost: its process {proc.pid} on ") and str(cell.run_lock) in row["error"]
    assert "`gridrun resubmit conf=smoke --failed`" in row["error"]
    assert "failed (lost)" in gridrun("status", "conf=smoke").out
    # cancel has nothing to stop; resubmit --failed takes it (to the sweep's launcher).
    cancel = gridrun("cancel", "conf=smoke", "--cells", cell_id)
    assert f"skip {cell_id}: failed, not queued or running" in cancel.out
    assert gridrun("resubmit", "conf=smoke", "--failed").code == 0
    assert submissions(smoke)[-1]["ids"] == [cell_id]
    state = cell.read_state().to_json()
    # A run by hand is no attempt (attempt 0): the first queued one is attempt 1.
    assert (state["state"], state["attempt"], state["attempts"]) == ("queued", 1, [])


def test_a_status_probe_never_makes_a_starting_run_refuse(smoke: SweepDir) -> None:
    # status probes the lock with a shared flock; a run that starts during a probe waits it
    # out instead of exiting "already being run".
    import fcntl
    import os

    cell = smoke.cell("voting-ip-toy-arith-s0")
    cell.run_lock.touch()
    fd = os.open(cell.run_lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a probe, frozen in the middle
    threading.Timer(0.3, os.close, (fd,)).start()
    with cell.hold():
        assert cell.held()
    assert not cell.held()


def test_a_free_lock_is_no_verdict_on_a_cell_a_scheduler_may_requeue(smoke: SweepDir) -> None:
    # SLURM may requeue a killed job (its cell still reads running, its lock is free until the
    # job starts again): sacct, through reconcile, judges it; the lock judges the others.
    from gridrun.grid.launchers.observe import HOST, live_state
    from tests.states import put_state

    by_slurm, by_hand = smoke.cell("voting-ip-toy-arith-s0"), smoke.cell("voting-sp-toy-arith-s0")
    put_state(by_slurm, state="running", launcher="slurm", job_id="5_0", node=HOST, pid=1)
    put_state(by_hand, state="running", node=HOST, pid=1)
    assert live_state(by_slurm).state == CellState.RUNNING
    assert (live_state(by_hand).state, live_state(by_hand).lost) == (CellState.FAILED, True)
