"""A cell's observed state: what its state.json says, corrected by what is true now.

`RunDir.read_state` (gridrun/seam/rundir.py) reads the record, tolerant of damage (`damaged`,
`missing`); on top of it this module derives, never writing anything:

    lost      a cell reading running on this host whose run lock no process holds reads
              `failed` with `lost` set (`live_state`): its process died without saying so
    reconcile an active cell whose job is gone reads as its launcher reports it (a launcher's
              `reconcile`, gridrun/grid/launchers/base.py); the same state with the
              scheduler's word for it is kept as `scheduler`
    waiting   a queued cell held back for a need (a transfer cell's sa_rl) names it
    blocked   ... and reads `blocked` once that need failed, was cancelled or preempted

`gridrun status` and `gridrun plan` read states only through here; queueing
(gridrun/grid/launchers/dispatch.py) judges each cell by its observed state. The state
machine itself (states, named transitions, the one writer) is gridrun/seam/cellstate.py.
Stdlib only: `gridrun status` imports this.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gridrun.grid.launchers.base import LAUNCHERS, launcher_class
from gridrun.seam.cellstate import BLOCKING_STATES, FINISHED_STATES, CellState, StateRecord

if TYPE_CHECKING:
    from gridrun.grid.sweepdir import PlanEntry, SweepDir
    from gridrun.seam.rundir import RunDir

HOST = socket.gethostname()


def live_state(run_dir: RunDir, record: StateRecord | None = None) -> StateRecord:
    """The cell's state.json, except that a cell reading running on this host whose run lock
    no process holds reads failed and lost: its process ended without saying so (kill -9,
    out of memory), whoever started it (the local launcher, or `gridrun run` by hand). The
    lock is the truth, not the pid (recycled) or state.json (a dead process cannot update
    it); a scheduler that may requeue the job (`lock_is_liveness` False) is asked instead.
    `record`: the cell's state.json where the caller has read it already."""
    record = run_dir.read_state() if record is None else record
    if record.state != CellState.RUNNING or record.node != HOST or run_dir.held():
        return record
    launcher = record.launcher
    if launcher in LAUNCHERS and not launcher_class(launcher).lock_is_liveness:
        return record
    again = run_dir.read_state()  # it may have finished (and let go) since the first read
    if again.state != CellState.RUNNING:
        return again
    return record.with_(
        state=CellState.FAILED, lost=True,
        error=f"lost: its process {record.pid} on {HOST} ended without recording a final state "
              f"(killed, or out of memory?) and holds no lock on {run_dir.run_lock}; resume it with "
              "`gridrun resubmit conf=<sweep> --failed`",
    )


def observe(
    states: Mapping[str, StateRecord], needs: Mapping[str, list[str]] | None = None
) -> dict[str, StateRecord]:
    """The states as they really are: an active cell whose job is gone reads as the state its
    launcher reports (`failed` with `lost` set, for a local process killed with -9); a cell
    held back for a need (`needs`: id -> ids it needs, whose states are in `states` too)
    reads as waiting or blocked (`_held`)."""
    return _held(_reconciled(states), needs or {})


def _reconciled(states: Mapping[str, StateRecord]) -> dict[str, StateRecord]:
    by_launcher: dict[str, dict[str, StateRecord]] = {}
    for cell_id, record in states.items():
        if record.active and record.launcher:
            by_launcher.setdefault(record.launcher, {})[cell_id] = record
    if not by_launcher:
        return dict(states)
    observed = dict(states)
    for name, active in by_launcher.items():
        if name not in LAUNCHERS:
            continue
        for cell_id, (new_state, why) in launcher_class(name).reconcile(active).items():
            if new_state == states[cell_id].state:
                observed[cell_id] = states[cell_id].with_(scheduler=why)
            else:
                observed[cell_id] = states[cell_id].with_(state=new_state, error=why, lost=True)
    return observed


def _held(observed: dict[str, StateRecord], needs: Mapping[str, list[str]]) -> dict[str, StateRecord]:
    """Cells queued for a need that is not done: `waiting` (the need's id) while it may still
    finish; `blocked` once it cannot, even where the held job itself is gone (a local launcher
    that gave up on it, a SLURM job whose dependency can never be met)."""
    for cell_id, required in needs.items():
        record = observed.get(cell_id)
        # Held back: its attempt has not started, and it is queued or was read lost as such; a
        # final state the cell (or a user's cancel) recorded stands.
        if record is None or record.started_at or not (record.active or record.lost):
            continue
        for need in required:
            need_record = observed.get(need)
            need_state = CellState.PLANNED if need_record is None else need_record.state
            if need_state in FINISHED_STATES:
                continue
            if need_state in BLOCKING_STATES:
                observed[cell_id] = record.with_(
                    state=CellState.BLOCKED, lost=False, waiting=need,
                    error=f"blocked: it needs {need}, which is {need_state}; resubmit that "
                          f"(`gridrun resubmit --cells {need}`) and this cell follows it",
                )
                break
            if not record.lost:
                observed[cell_id] = record.with_(waiting=need)
                break
    return observed


def needs_of(cells: Iterable[PlanEntry]) -> dict[str, list[str]]:
    """id -> the ids it needs done first, for the cells (sweep.json entries) that need any."""
    return {cell.id: list(cell.needs) for cell in cells if cell.needs}


def sweep_needs(sweep: SweepDir) -> dict[str, list[str]]:
    return needs_of(sweep.read().cells)


def observe_cells(sweep: SweepDir, ids: list[str]) -> dict[str, StateRecord]:
    """`observe` for these cells of a sweep (the states of what they need are read too)."""
    needs = sweep_needs(sweep)
    wanted = set(ids) | {need for cell_id in ids for need in needs.get(cell_id, [])}
    observed = observe({cell_id: live_state(sweep.cell(cell_id)) for cell_id in wanted}, needs)
    return {cell_id: observed[cell_id] for cell_id in ids}
