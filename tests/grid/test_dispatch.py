"""Queueing: the lock against double submission, skipping finished and active cells,
attempts, lost local cells, cancel, and status's JSON."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gridrun.grid.errors import GridError
from gridrun.grid.launchers.base import make_launcher
from gridrun.grid.launchers.dispatch import queue, runnable
from gridrun.grid.launchers.observe import HOST
from gridrun.grid.sweepdir import SweepDir
from tests.grid.conftest import Gridrun
from tests.grid.recording import submissions
from tests.states import put_state

pytestmark = pytest.mark.usefixtures("recording_launcher")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _submit_all(results: str, started: float) -> None:
    sweep = SweepDir(Path(results), "smoke")
    launcher = make_launcher({"name": "record", "delay_s": 0.3})
    time.sleep(max(0.0, started - time.time()))
    with sweep.lock():
        queue(sweep, sweep.cell_ids(), launcher)


def test_two_concurrent_submitters_cannot_double_submit(smoke: SweepDir) -> None:
    # Both start at the same instant; the scheduler is slow (0.3 s). Without the lock both
    # would read every cell as planned and submit all 11.
    start = time.time() + 0.5
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_submit_all, args=(str(smoke.results), start)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    handed = [cell_id for record in submissions(smoke) for cell_id in record["ids"]]
    assert sorted(handed) == sorted(smoke.cell_ids())
    assert {smoke.cell(c).read_state().to_json()["attempt"] for c in smoke.cell_ids()} == {1}


def test_a_held_lock_times_out_with_the_fix(smoke: SweepDir) -> None:
    context = multiprocessing.get_context("fork")
    ready = context.Event()

    def hold() -> None:
        with smoke.lock():
            ready.set()
            time.sleep(3)

    holder = context.Process(target=hold)
    holder.start()
    assert ready.wait(10)
    with pytest.raises(GridError, match="another gridrun command holds .*wait for it to finish"), smoke.lock(timeout_s=0.2):
        pass
    holder.join()


def test_a_rerun_skips_done_queued_and_running_cells(gridrun: Gridrun, smoke: SweepDir) -> None:
    ids = smoke.cell_ids()
    put_state(smoke.cell(ids[0]), state="done")
    put_state(smoke.cell(ids[1]), state="running", pid=os.getpid(), node=HOST, started_at=time.time())
    put_state(smoke.cell(ids[2]), state="queued", launcher="record", job_id="rec-1")
    put_state(smoke.cell(ids[3]), state="failed", attempt=1)
    put_state(smoke.cell(ids[4]), state="cancelled", attempt=1)
    with smoke.cell(ids[1]).hold():  # its run holds the lock (without it, it reads lost)
        assert runnable(smoke, ids) == ids[3:]
        result = gridrun("sweep", "conf=smoke", "grid.launcher.name=record")
        assert result.code == 0 and "skipping 3 done, queued or running" in result.out
        # The plan lists train cells first; the base controls (cheap, the reference of every
        # delta) are handed over first, the others in plan order.
        bases = [cell_id for cell_id in ids[3:] if cell_id.startswith("base-")]
        assert len(bases) == 4 and ids.index(bases[0]) > 3
        assert submissions(smoke)[-1]["ids"] == bases + [cell_id for cell_id in ids[3:] if cell_id not in bases]
        assert smoke.cell(ids[3]).read_state().to_json()["attempt"] == 2
        # Nothing left to do: a third run submits nothing.
        again = gridrun("sweep", "conf=smoke", "grid.launcher.name=record")
        assert again.code == 0 and "dispatching 0 cells" in again.out


def test_resubmit_counts_attempts_and_keeps_their_history(gridrun: Gridrun, smoke: SweepDir) -> None:
    cell = smoke.cell("voting-ip-toy-arith-s0")
    put_state(cell, state="failed", attempt=1, job_id="rec-9", error="boom", step=7)
    result = gridrun("resubmit", "conf=smoke", "--failed")
    assert result.code == 0 and "resubmitted 1 cells" in result.out
    state = cell.read_state().to_json()
    assert (state["state"], state["attempt"], state["job_id"]) == ("queued", 2, f"rec-{os.getpid()}")
    assert state["attempts"] == [
        {"attempt": 1, "state": "failed", "launcher": None, "job_id": "rec-9", "node": None, "step": 7,
         "started_at": None, "finished_at": None, "error": "boom"}
    ]
    # Queued now: resubmitting it again is skipped, not doubled.
    again = gridrun("resubmit", "conf=smoke", "--cells", "voting-ip-toy-arith-s0")
    assert again.code == 0 and "skip voting-ip-toy-arith-s0: queued" in again.out


def test_a_killed_local_cell_reads_as_lost_and_is_resubmittable(gridrun: Gridrun, smoke: SweepDir) -> None:
    running = smoke.cell("voting-ip-toy-arith-s0")
    put_state(running, state="running", launcher="local", job_id=f"{os.getpid()}@{HOST}", pid=dead_pid(),
                         node=HOST, started_at=time.time(), attempt=1)
    # A recycled pid: alive, but started after the cell did (a day ago).
    recycled = smoke.cell("voting-sp-toy-arith-s0")
    put_state(recycled, state="running", launcher="local", pid=os.getpid(), node=HOST,
                          started_at=time.time() - 86400, attempt=1)
    # Queued by a gridrun process that has exited.
    orphan = smoke.cell("sa_rl-toy-arith-s0")
    put_state(orphan, state="queued", launcher="local", job_id=f"{dead_pid()}@{HOST}", queued_at=time.time(), attempt=1)
    # Queued by a live one (this process, started before the cell was queued): not lost.
    waiting = smoke.cell("base-single-toy-arith")
    put_state(waiting, state="queued", launcher="local", job_id=f"{os.getpid()}@{HOST}", queued_at=time.time(), attempt=1)
    # Running on another host: cannot be judged from here.
    elsewhere = smoke.cell("base-voting-toy-arith")
    put_state(elsewhere, state="running", launcher="local", pid=dead_pid(), node="other-host", started_at=time.time())

    result = gridrun("status", "conf=smoke", "--json")
    rows = {row["cell"]: row for row in json.loads(result.out)}
    for cell_id in ("voting-ip-toy-arith-s0", "voting-sp-toy-arith-s0", "sa_rl-toy-arith-s0"):
        assert rows[cell_id]["state"] == "failed" and rows[cell_id]["lost"], rows[cell_id]
        assert rows[cell_id]["error"].startswith("lost: ")
    assert rows["base-single-toy-arith"]["state"] == "queued" and not rows["base-single-toy-arith"]["lost"]
    assert rows["base-voting-toy-arith"]["state"] == "running"

    table = gridrun("status", "conf=smoke")
    assert "failed (lost)" in table.out and "3 failed" in table.out
    failed = gridrun("status", "conf=smoke", "--failed")
    assert "resubmit conf=smoke --failed" in failed.out and "lost: its process" in failed.out

    # The sweep's launcher is `record`: resubmitting hands the three lost cells to it.
    assert gridrun("resubmit", "conf=smoke", "--failed").code == 0
    assert sorted(submissions(smoke)[-1]["ids"]) == sorted(
        ["voting-ip-toy-arith-s0", "voting-sp-toy-arith-s0", "sa_rl-toy-arith-s0"]
    )
    assert running.read_state().to_json()["attempts"][-1]["error"].startswith("lost: ")


def test_cancel_stops_running_local_cells_and_unstarted_ones(gridrun: Gridrun, smoke: SweepDir) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    running = smoke.cell("voting-ip-toy-arith-s0")
    put_state(running, state="running", launcher="local", pid=sleeper.pid, node=HOST, started_at=time.time())
    queued = smoke.cell("voting-sp-toy-arith-s0")
    put_state(queued, state="queued", launcher="local", job_id=f"{os.getpid()}@{HOST}", queued_at=time.time())
    with running.hold():  # as the sleeper's `gridrun run` would
        result = gridrun("cancel", "conf=smoke", "--cells", "voting-ip-toy-arith-s0", "voting-sp-toy-arith-s0",
                         "sa_rl-toy-arith-s0")
    assert result.code == 0
    assert f"sent SIGTERM to process {sleeper.pid}" in result.out
    assert "skip sa_rl-toy-arith-s0: planned" in result.out
    assert sleeper.wait(10) == -signal.SIGTERM
    assert queued.read_state().to_json()["state"] == "cancelled"


def test_a_cell_that_finished_since_cancel_read_it_stays_done(smoke: SweepDir) -> None:
    # cancel read it queued with no live process; by the time it records, the cell is done:
    # cancelled may not overwrite done (the state machine refuses it), and the line says so.
    cell_id = "voting-ip-toy-arith-s0"
    put_state(smoke.cell(cell_id), state="done", launcher="local", pid=None, attempt=1)
    (line,) = make_launcher({"name": "local"}).cancel(smoke, [cell_id])
    assert line == f"{cell_id}: not cancelled: cancelled from done is refused: only an active cell is cancelled"
    assert smoke.cell(cell_id).read_state().to_json()["state"] == "done"


def test_resubmit_failed_names_the_cancelled_cells_it_leaves(gridrun: Gridrun, smoke: SweepDir) -> None:
    # After a SIGTERM to the sweep every cell reads cancelled: --failed took none, silently.
    for cell_id in ("voting-ip-toy-arith-s0", "sa_rl-toy-arith-s0"):
        put_state(smoke.cell(cell_id), state="cancelled", attempt=1, error="stopped by SIGTERM")
    result = gridrun("resubmit", "conf=smoke", "--failed")
    assert result.code == 0 and " ".join(result.out.split()) == (
        "not resubmitting 2 cancelled cell(s); to resume them too: gridrun resubmit conf=smoke --cells "
        "voting-ip-toy-arith-s0 sa_rl-toy-arith-s0 nothing to resubmit")
    assert submissions(smoke) == []


def test_a_clock_ahead_of_this_one_never_shows_a_negative_elapsed_time(gridrun: Gridrun, smoke: SweepDir) -> None:
    # The node's clock is an hour ahead: its cell started "in the future".
    ahead = time.time() + 3600
    put_state(smoke.cell("voting-ip-toy-arith-s0"), state="failed", started_at=ahead, finished_at=ahead + 60)
    put_state(smoke.cell("voting-sp-toy-arith-s0"), state="running", started_at=ahead, node="elsewhere")
    rows = {row["cell"]: row for row in json.loads(gridrun("status", "--json").out)}
    assert rows["voting-ip-toy-arith-s0"]["elapsed_s"] == 60  # its own clock's difference stands
    assert rows["voting-sp-toy-arith-s0"]["elapsed_s"] == 0
    lines = gridrun("status").out.splitlines()
    elapsed = _column(lines, "elapsed")
    shown = [line.split("│")[elapsed] for line in lines if "│ voting-" in line]
    assert all(column.strip() and "-" not in column for column in shown), shown


def test_status_json_lists_every_cell_with_its_fields(gridrun: Gridrun, smoke: SweepDir) -> None:
    put_state(
        smoke.cell("voting-ip-toy-arith-s0"),
        state="running", step=12, total_steps=40, last_val_acc=0.41, peak_val_acc=0.45, peak_step=10,
        alerts=["aggregator terse rate 0.12 < 0.5"], attempt=2, job_id="rec-1", launcher="record",
    )
    rows = json.loads(gridrun("status", "--json").out)
    assert len(rows) == 11
    assert {"cell", "kind", "state", "step", "total_steps", "attempt", "job_id"} <= set(rows[0])
    row = next(r for r in rows if r["cell"] == "voting-ip-toy-arith-s0")
    assert (row["state"], row["step"], row["total_steps"], row["attempt"], row["job_id"]) == ("running", 12, 40, 2, "rec-1")
    assert (row["last_val_acc"], row["peak_val_acc"], row["alerts"]) == (0.41, 0.45, ["aggregator terse rate 0.12 < 0.5"])
    assert row["peak_test_acc"] is None  # measured as the run ends
    table = gridrun("status")
    assert "12/40" in table.out and "45.0 @10" in table.out and "aggregator terse rate" in table.out


def test_status_shows_the_peaks_test_accuracy_once_measured(gridrun: Gridrun, smoke: SweepDir) -> None:
    put_state(smoke.cell("voting-ip-toy-arith-s0"), state="done", step=40, total_steps=40, last_val_acc=0.41,
              peak_val_acc=0.45, peak_step=10, peak_test_acc=0.4375)
    row = next(r for r in json.loads(gridrun("status", "--json").out) if r["cell"] == "voting-ip-toy-arith-s0")
    assert row["peak_test_acc"] == 0.4375
    lines = gridrun("status").out.splitlines()
    test = _column(lines, "test %")
    assert next(line for line in lines if "voting-ip-toy-arith-s0" in line).split("│")[test].strip() == "43.8"


def _column(table: list[str], name: str) -> int:
    """The index of the column `name` in a drawn status table's rows split on their rules."""
    return [part.strip() for part in next(line for line in table if "┃" in line).split("┃")].index(name)


def test_status_shows_each_peak_against_its_base_control_and_sorts_by_it(gridrun: Gridrun, smoke: SweepDir) -> None:
    # Voting's base control 30%: IP peaked at 45% (+15.0 points), SP at 28% (-2.0); SA-RL's
    # base is `single`'s (done, 35%): SA-RL at 40% is +5.0. Eval-Opt's base is not done: no Δ.
    for cell_id, state, peak in (("base-voting-toy-arith", "done", 0.30), ("voting-ip-toy-arith-s0", "running", 0.45),
                                 ("voting-sp-toy-arith-s0", "done", 0.28), ("base-single-toy-arith", "done", 0.35),
                                 ("sa_rl-toy-arith-s0", "done", 0.40), ("eval_opt-ip-toy-arith-s0", "done", 0.50)):
        put_state(smoke.cell(cell_id), state=state, peak_val_acc=peak, peak_step=0 if cell_id.startswith("base") else 10)
    rows = json.loads(gridrun("status", "--json", "--sort", "delta").out)
    deltas = [(row["cell"], None if row["delta_pp"] is None else round(row["delta_pp"], 6)) for row in rows]
    assert deltas[:3] == [("voting-ip-toy-arith-s0", 15.0), ("sa_rl-toy-arith-s0", 5.0), ("voting-sp-toy-arith-s0", -2.0)]
    assert all(delta is None for _, delta in deltas[3:]) and len(deltas) == 11
    assert dict(deltas)["eval_opt-ip-toy-arith-s0"] is None and dict(deltas)["base-voting-toy-arith"] is None
    table = gridrun("status", "--sort", "delta").out
    assert "Δ base" in table and "+15.0" in table and table.index("+15.0") < table.index("-2.0")


def test_status_imports_nothing_heavy(smoke: SweepDir) -> None:
    # Must stay fast from a login node: no torch, Hydra, pandas or filelock on this path.
    code = (
        "import sys; from gridrun.cli import main; main(['status', '--json']); "
        "heavy = [m for m in ('torch', 'hydra', 'pandas', 'omegaconf', 'transformers') if m in sys.modules]; "
        "sys.exit(f'imported {heavy}' if heavy else 0)"
    )
    env = dict(os.environ, GRIDRUN_RESULTS=str(smoke.results))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
