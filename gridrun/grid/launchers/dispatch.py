"""Queueing cells with a launcher: attempts, needs, and which cells a sweep dispatches.

Dependencies. A cell may need others done before it starts (a transfer cell its sa_rl cell:
`needs` in sweep.json). `queue()` hands a cell over only with its needs done, active or
handed over in the same call (before it), and the launcher holds it back until they are
done: the local launcher starts it then, SLURM gets it with an `afterok` dependency. While
it waits it reads `queued` with `waiting` naming the need; when a need ends failed, cancelled
or preempted it reads `blocked` (gridrun/grid/launchers/observe.py derives both); queueing that need
again (`gridrun resubmit`) queues the blocked cells after it.

`queue()` opens a cell's next attempt (the `queued` transition of gridrun/seam/cellstate.py, which
a SLURM job requeued by the scheduler takes too, counting it in `requeues`) and records its
job id; it runs under the sweep's lock and skips cells already queued or running (as
observed: a lost one is queued again), so two `gridrun sweep` runs of one sweep cannot
submit a cell twice. The Launcher interface and registry: gridrun/grid/launchers/base.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gridrun.grid.errors import GridError
from gridrun.grid.launchers.base import Launcher, PartlySubmitted
from gridrun.grid.launchers.observe import needs_of, observe_cells
from gridrun.seam import cellstate
from gridrun.seam.cellstate import ACTIVE_STATES, FINISHED_STATES, UNREADABLE_STATES, CellState, StateRecord
from gridrun.seam.runconfig import CellKind

if TYPE_CHECKING:
    from gridrun.grid.sweepdir import SweepDir

log = logging.getLogger("gridrun")


def runnable(sweep: SweepDir, ids: list[str]) -> list[str]:
    """The cells a (re-run) sweep dispatches: all but those done, queued, running, damaged or
    missing (an unreadable cell waits for its files to be fixed: its message says how)."""
    states = observe_cells(sweep, ids)
    return [cell_id for cell_id in ids if states[cell_id].state not in (*FINISHED_STATES, *UNREADABLE_STATES, *ACTIVE_STATES)]


def queue(sweep: SweepDir, ids: list[str], launcher: Launcher) -> list[str]:
    """Mark cells queued (a new attempt) and submit them. Call under `sweep.lock()`.

    Cells blocked on one of `ids` come along (after it). Skips cells that are queued,
    running, damaged or missing, those whose needs will not be done (named in a warning), and those the launcher
    does not admit; returns the ids submitted, each after the cells it needs, base controls
    first (cheap, and the reference every other cell is compared with)."""
    cells = sweep.read().cells
    needs = needs_of(cells)
    base = {cell.id for cell in cells if cell.kind == CellKind.BASE}
    every = sweep.cell_ids() if needs else ids
    states = observe_cells(sweep, every)
    released = [
        cell_id for cell_id in every
        if states[cell_id].state == CellState.BLOCKED and cell_id not in ids
        and any(need in ids for need in needs.get(cell_id, []))
    ]
    ids = [*ids, *released]
    run_dirs = {cell_id: sweep.cell(cell_id) for cell_id in ids}
    todo = [cell_id for cell_id in ids if states[cell_id].state not in (*UNREADABLE_STATES, *ACTIVE_STATES)]
    todo = _needs_first(sorted(todo, key=lambda cell_id: cell_id not in base), needs, states, sweep.name)
    todo = launcher.admit(sweep, todo) if todo else todo
    for cell_id in todo:
        run_dirs[cell_id].record(cellstate.queued(states[cell_id], launcher.name))
    recorded: set[str] = set()

    def accepted(jobs: Mapping[str, str]) -> None:
        # As each batch is accepted: a submission cut short later keeps these cells' ids.
        for cell_id, job_id in jobs.items():
            run_dirs[cell_id].record(cellstate.handed_over(job_id=job_id))
            recorded.add(cell_id)

    try:
        jobs = launcher.submit(sweep, todo, accepted) if todo else {}
    except PartlySubmitted as cut:
        # Never queued without a job (read lost later, then submitted twice): failed, which
        # `gridrun resubmit --failed` queues again.
        why = f"not submitted: the scheduler refused it ({cut.reason}); `gridrun resubmit conf={sweep.name} --failed`"
        for cell_id in cut.left:
            run_dirs[cell_id].record(cellstate.failed(why))
        raise GridError(
            f"{len(cut.left)} of {len(todo)} cell(s) not submitted, the scheduler refused them ({cut.reason}); "
            f"the other {len(todo) - len(cut.left)} are queued: once the limit allows, "
            f"`gridrun resubmit conf={sweep.name} --failed`"
        ) from None
    accepted({cell_id: job_id for cell_id, job_id in jobs.items() if cell_id not in recorded})
    return todo


def _needs_first(
    todo: list[str], needs: Mapping[str, list[str]], states: Mapping[str, StateRecord], sweep_name: str
) -> list[str]:
    """`todo` with every cell after the cells it needs; a cell whose need is neither done,
    active nor in `todo` would wait forever, so it is left out with a warning naming the fix."""
    free = [cell_id for cell_id in todo if not needs.get(cell_id)]
    held = []
    for cell_id in todo:
        if not needs.get(cell_id):
            continue
        stuck = [
            need for need in needs[cell_id]
            if need not in free and _state_of(states, need) not in (*FINISHED_STATES, *ACTIVE_STATES)
        ]
        if stuck:
            state = _state_of(states, stuck[0])
            log.warning(
                "not queuing %s: it needs %s, which is %s; dispatch that (`gridrun resubmit conf=%s --cells %s`) "
                "and %s follows it", cell_id, stuck[0], state, sweep_name, stuck[0], cell_id,
            )
            continue
        held.append(cell_id)
    return free + held


def _state_of(states: Mapping[str, StateRecord], cell_id: str) -> CellState:
    """A cell's observed state; planned when it has none (not on disk yet)."""
    record = states.get(cell_id)
    return CellState.PLANNED if record is None else record.state
