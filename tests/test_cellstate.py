"""The cell's state machine (gridrun/seam/cellstate.py): one test per rule, on the pure
transitions, then the one writer (`RunDir.record`) refusing without writing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gridrun.seam import cellstate
from gridrun.seam.cellstate import CellState, IllegalTransition, StateRecord
from gridrun.seam.rundir import NotARunDir, RunDir

# name -> the transition, given the record it leaves (queued is judged from it as observed).
EVERY_TRANSITION: dict[str, Callable[[dict[str, object]], cellstate.Transition]] = {
    "planned": lambda leaving: cellstate.planned(20),
    "queued": lambda leaving: cellstate.queued(StateRecord.from_json(leaving), "local"),
    "handed_over": lambda leaving: cellstate.handed_over(job_id="7"),
    "started": lambda leaving: cellstate.started(pid=1, node="n", total_steps=20),
    "progressed": lambda leaving: cellstate.progressed(step=1),
    "done": lambda leaving: cellstate.done(),
    "failed": lambda leaving: cellstate.failed("boom"),
    "cancelled": lambda leaving: cellstate.cancelled("stopped"),
    "preempted": lambda leaving: cellstate.preempted("SIGUSR2"),
}


def at(state: str, **fields: object) -> dict[str, object]:
    return {"state": state, "step": 0, "attempt": 0, **fields}


def allowed_sources(name: str) -> set[str]:
    """The recorded states a transition may leave, found by trying each one."""
    found = set()
    for state in cellstate.RECORDED:
        try:
            EVERY_TRANSITION[name](at(state)).apply(at(state))
        except IllegalTransition:
            continue
        found.add(state.value)
    return found


def test_a_plan_never_resets_a_cells_history() -> None:
    assert allowed_sources("planned") == {"planned"}
    # Fresh: nothing of an earlier record survives (a replaced cell's folder was moved away).
    assert cellstate.planned(20).apply(at("planned", error="old")) == {
        "state": "planned", "step": 0, "total_steps": 20, "attempt": 0,
    }
    with pytest.raises(IllegalTransition, match="planned from done is refused: a plan never resets"):
        cellstate.planned(20).apply(at("done"))


def test_only_a_planned_failed_preempted_or_cancelled_cell_is_queued() -> None:
    # blocked is never recorded, so it is tried as observed below; done and active are refused.
    assert allowed_sources("queued") == {"planned", "failed", "preempted", "cancelled"}
    for state in ("done", "queued", "running", "damaged"):
        with pytest.raises(IllegalTransition, match=f"queued from {state} is refused"):
            cellstate.queued(StateRecord.from_json(at(state)), "local").apply(at(state))


def test_queued_is_judged_from_the_observed_state_and_opens_the_next_attempt() -> None:
    # On disk the cell still says running (its process was killed with -9); observed, it is
    # failed and lost: attempt 1 moves to the history, attempt 2 is queued.
    on_disk = at("running", attempt=1, launcher="local", job_id="9@h", node="h", step=7, started_at=10.0,
                 pid=99, alerts=["kept"])
    observed = {**on_disk, "state": "failed", "error": "lost: ...", "lost": True}
    after = cellstate.queued(StateRecord.from_json(observed), "local").apply(on_disk)
    assert (after["state"], after["attempt"], after["pid"], after["error"], after["job_id"]) == ("queued", 2, None, None, None)
    assert after["attempts"] == [{"attempt": 1, "state": "failed", "launcher": "local", "job_id": "9@h", "node": "h",
                                  "step": 7, "started_at": 10.0, "finished_at": None, "error": "lost: ..."}]
    assert after["alerts"] == ["kept"] and "lost" not in after  # fields it does not name stay as recorded
    # A held cell whose need failed reads blocked: it may be queued again.
    assert cellstate.queued(StateRecord.from_json(at("blocked")), "slurm").apply(at("queued"))["attempt"] == 1


def test_a_cell_never_queued_has_no_job() -> None:
    assert allowed_sources("handed_over") == {s.value for s in cellstate.RECORDED} - {"planned"}
    with pytest.raises(IllegalTransition, match="handed_over from planned is refused"):
        cellstate.handed_over(pid=5).apply(at("planned"))
    # Only what was learnt is set: a pid leaves the job id alone.
    assert cellstate.handed_over(pid=5).apply(at("queued", job_id="4@h"))["job_id"] == "4@h"


def test_the_runs_lock_not_the_state_decides_who_starts_a_cell() -> None:
    # A cell rerun by hand after it failed, or whose killed process still reads running; done
    # and stopped are final (re-plan with --replace to run them again).
    assert allowed_sources("started") == {s.value for s in cellstate.RECORDED} - set(cellstate.FINISHED_STATES)


def test_only_a_running_cell_makes_progress_or_finishes() -> None:
    assert allowed_sources("progressed") == allowed_sources("done") == {"running"}
    with pytest.raises(IllegalTransition, match="progressed from queued is refused: only a running cell"):
        cellstate.progressed(step=3).apply(at("queued"))


def test_only_an_active_cell_fails_or_is_cancelled() -> None:
    # From queued: its launcher saw it die before it recorded running, or cancelled it first.
    assert allowed_sources("failed") == allowed_sources("cancelled") == {"queued", "running"}


def test_a_slurm_job_whose_requeue_was_refused_is_preempted_with_the_reason() -> None:
    # cancelled: the trainer recorded the SIGTERM; preempted: the trainer recorded its stop
    # on SLURM's warning, and the job's word (requeue budget spent) replaces the reason.
    assert allowed_sources("preempted") == {"queued", "running", "cancelled", "preempted"}
    record = cellstate.preempted("budget spent").apply({"state": "preempted", "error": "stopped after step 1 on SIGUSR2"})
    assert (record["state"], record["error"]) == ("preempted", "budget spent")


def test_damaged_missing_and_blocked_are_derived_never_written() -> None:
    written = set()
    for make in EVERY_TRANSITION.values():
        written.add(make(at("running")).to)
    derived = {CellState.DAMAGED, CellState.MISSING, CellState.BLOCKED}
    assert written.isdisjoint(derived) and None in written
    assert derived.isdisjoint(cellstate.RECORDED)
    # No transition leaves an unreadable cell: `gridrun plan` repairs it first.
    for name in EVERY_TRANSITION:
        assert allowed_sources(name).isdisjoint(cellstate.UNREADABLE_STATES)


def test_a_cell_whose_folder_was_deleted_reads_missing_and_is_never_written_back(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "cell")
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text("{}\n")
    run_dir.record(cellstate.planned(2))
    run_dir.record(cellstate.queued(run_dir.read_state(), "local"))
    run_dir.record(cellstate.started(pid=3, node="n", total_steps=2))
    shutil.rmtree(run_dir.root)  # `rm -rf` under the running trainer
    state = run_dir.read_state().to_json()
    assert (state["state"], state["error"]) == (
        "missing", f"{run_dir.root} is gone (deleted?): `gridrun plan conf=<sweep>` plans the cell again")
    # The trainer's next record (and its failed) raise, naming the fix, and bring nothing back:
    # a folder holding only state.json would read as a run to `gridrun plan`.
    for change in (cellstate.progressed(step=1), cellstate.failed("boom")):
        with pytest.raises(NotARunDir, match=f"cannot record {change.name}: .* is gone"):
            run_dir.record(change)
    assert not run_dir.root.exists()
    # A folder whose config.yaml alone was deleted reads missing too, whatever state.json says.
    run_dir.root.mkdir()
    run_dir.state_json.write_text('{"state": "done"}')
    assert run_dir.read_state().to_json()["state"] == "missing"
    assert "config.yaml is gone (deleted?): `gridrun plan conf=<sweep>` writes it again" in run_dir.read_state().to_json()["error"]


def test_the_writer_refuses_an_illegal_transition_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "cell")
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text("{}\n")  # written by `gridrun plan` before the planned record
    run_dir.record(cellstate.planned(2))
    before = run_dir.state_json.read_bytes()
    with pytest.raises(IllegalTransition, match="done from planned"):
        run_dir.record(cellstate.done())
    assert run_dir.state_json.read_bytes() == before
    # The legal path: queued, started, progressed, done; each keeps what it does not name.
    run_dir.record(cellstate.queued(run_dir.read_state(), "local"))
    run_dir.record(cellstate.started(pid=3, node="n", total_steps=2))
    run_dir.record(cellstate.progressed(step=2))
    state = run_dir.record(cellstate.done()).to_json()
    assert (state["state"], state["step"], state["total_steps"], state["attempt"], state["pid"]) == ("done", 2, 2, 1, 3)
    assert state["finished_at"] >= state["started_at"] >= state["queued_at"]


def test_an_old_state_json_reads_typed_and_is_written_back_byte_for_byte(tmp_path: Path) -> None:
    # A failed SLURM cell's state.json as gridrun wrote it before StateRecord, with a key this
    # reader does not type: read, every field typed; written again, the same keys and JSON.
    fixture = Path(__file__).parent / "fixtures" / "state_failed_v0.json"
    run_dir = RunDir(tmp_path / "cell")
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text("{}\n")
    shutil.copy(fixture, run_dir.state_json)
    record = run_dir.read_state()
    assert (record.state, record.step, record.total_steps, record.attempt, record.job_id, record.node) == (
        CellState.FAILED, 23, 30, 2, "4711_3", "gpu-a02")
    assert (record.peak_step, record.peak_val_acc, record.last_val_acc) == (20, 0.375, 0.3125)
    assert (record.requeues, record.slurm_restarts, record.pid, record.lost) == (1, 1, 5150, False)
    assert record.alerts == ("aggregator terse rate 0.12 < 0.5",) and record.attempts[0]["step"] == 12
    assert record.error is not None and record.error.endswith("CUDA out of memory")
    old = json.loads(fixture.read_text())
    assert record.to_json() == old and "written_by" in record.raw
    # The one writer keeps every key it does not set, and writes the JSON it always wrote.
    after = run_dir.record(cellstate.handed_over(job_id="4711_3"))
    expected = {**old, "job_id": "4711_3", "updated_at": after.updated_at}
    assert run_dir.state_json.read_text() == json.dumps(expected, indent=1, sort_keys=True) + "\n"


def test_a_record_with_an_unknown_state_is_refused_by_the_record_and_reads_damaged(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        StateRecord.from_json({"state": "exploded"})
    run_dir = RunDir(tmp_path / "cell")
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text("{}\n")
    run_dir.state_json.write_text('{"state": "exploded", "step": 3}')
    record = run_dir.read_state()
    assert record.state == CellState.DAMAGED and "state 'exploded' is none of" in (record.error or "")
