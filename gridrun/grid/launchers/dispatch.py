"""Handing cells to a launcher: the `Launcher` interface, attempts, and what a cell's state
really is when its job died without saying so.

A launcher turns queued cells into jobs that each run `gridrun run <run_dir>`:

    admit(sweep, ids) -> ids             under the lock, before anything is queued: checks the
                                         launcher's settings (raises GridError) and may hold
                                         cells back (an attempt cap)
    submit(sweep, ids) -> {id: job_id}   under the sweep's lock; returns quickly
    wait(sweep, ids) -> exit code        after the lock is released; blocking launchers
                                         (local) run the cells here, schedulers return
    reconcile(states) -> {id: (state, why)}  cells whose state.json says queued/running but
                                         whose job is gone (killed, lost node, preempted); a
                                         result equal to the cell's state is no change, only
                                         the scheduler's word for it (shown by `gridrun status`).
                                         Before it, `live_state` reads a cell running on this
                                         host whose run lock is free as failed (lost), for
                                         every launcher and for cells run by hand
    cancel(sweep, ids)                   under the lock; the cells end as cancelled

Dependencies. A cell may need others done before it starts (a transfer cell its sa_rl cell:
`needs` in sweep.json). `queue()` hands a cell over only with its needs done, active or
handed over in the same call (before it), and the launcher holds it back until they are
done: the local launcher starts it then, SLURM gets it with an `afterok` dependency. While
it waits it reads `queued` with `waiting` naming the need; when a need ends failed, cancelled
or preempted it reads `blocked` (never written: derived here, so it holds whatever the
launcher did with the held job); queueing that need again (`gridrun resubmit`) queues the
blocked cells after it.

`queue()` opens a cell's next attempt (the `queued` transition of gridrun/cellstate.py, which
a SLURM job requeued by the scheduler takes too, counting it in `requeues`) and records its
job id; it runs under the sweep's lock and skips cells already queued or running, so two
`gridrun sweep` runs of one sweep cannot submit a cell twice. A launcher is named in conf/launcher/<name>.yaml and
registered in LAUNCHERS; a SLURM launcher (submitit) plugs in the same way. Every launcher
starts a cell's process the same way (gridrun/grid/launchers/process.py).

Stdlib only: `gridrun status` imports this to reconcile states.
"""

from __future__ import annotations

import importlib
import logging
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from gridrun import cellstate
from gridrun.cellstate import ACTIVE_STATES, BLOCKING_STATES, UNREADABLE_STATES
from gridrun.grid.errors import GridError
from gridrun.grid.gridconfig import LauncherSettings

if TYPE_CHECKING:
    from gridrun.grid.sweepdir import SweepDir
    from gridrun.rundir import RunDir

# name -> "module:Class"; imported only when a cell of that launcher is touched.
LAUNCHERS: dict[str, str] = {
    "local": "gridrun.grid.launchers.local:LocalLauncher",
    "slurm": "gridrun.grid.launchers.slurm:SlurmLauncher",
}

log = logging.getLogger("gridrun")
HOST = socket.gethostname()


class Launcher(ABC):
    name: ClassVar[str]
    # Whether a free run lock means the cell's job is over (`live_state`); False for a
    # scheduler that may requeue a killed job, whose own word `reconcile` asks for.
    lock_is_liveness: ClassVar[bool] = True
    # The settings its conf/launcher/<name>.yaml may hold, checked at plan time.
    settings_type: ClassVar[type[LauncherSettings]] = LauncherSettings

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)

    def admit(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        """The cells to queue, before any is marked queued; raise GridError to refuse them all."""
        return ids

    @abstractmethod
    def submit(self, sweep: SweepDir, ids: list[str]) -> dict[str, str]:
        """Hand queued cells to the scheduler; return each one's job id. Under the lock."""

    def wait(self, sweep: SweepDir, ids: list[str]) -> int:
        """Run or watch the submitted cells until they end (blocking launchers); 0 if all done."""
        return 0

    @classmethod
    @abstractmethod
    def reconcile(cls, states: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
        """For active cells (id -> state.json), those whose job is gone: id -> (state, why)."""

    @abstractmethod
    def cancel(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        """Stop these active cells' jobs; returns a line per cell saying what was done."""


def launcher_class(name: str) -> type[Launcher]:
    if name not in LAUNCHERS:
        raise GridError(f"no launcher '{name}' (registered: {', '.join(LAUNCHERS)}): set launcher=<one of them>")
    module, _, name_in_module = LAUNCHERS[name].partition(":")
    cls: type[Launcher] = getattr(importlib.import_module(module), name_in_module)
    return cls


def make_launcher(settings: Mapping[str, Any]) -> Launcher:
    """The launcher named by settings['name'] (conf/launcher/<name>.yaml, as in sweep.json)."""
    return launcher_class(str(settings.get("name", "local")))(settings)


def live_state(run_dir: RunDir) -> dict[str, Any]:
    """The cell's state.json, except that a cell reading running on this host whose run lock
    no process holds reads failed and lost: its process ended without saying so (kill -9,
    out of memory), whoever started it (the local launcher, or `gridrun run` by hand). The
    lock is the truth, not the pid (recycled) or state.json (a dead process cannot update
    it); a scheduler that may requeue the job (`lock_is_liveness` False) is asked instead."""
    state = run_dir.read_state()
    if state["state"] != "running" or state.get("node") != HOST or run_dir.held():
        return state
    launcher = state.get("launcher")
    if launcher in LAUNCHERS and not launcher_class(launcher).lock_is_liveness:
        return state
    again = run_dir.read_state()  # it may have finished (and let go) since the first read
    if again["state"] != "running":
        return again
    return {
        **state, "state": "failed", "lost": True,
        "error": f"lost: its process {state.get('pid')} on {HOST} ended without recording a final state "
                 f"(killed, or out of memory?) and holds no lock on {run_dir.run_lock}; resume it with "
                 "`gridrun resubmit conf=<sweep> --failed`",
    }


def observe(
    states: Mapping[str, dict[str, Any]], needs: Mapping[str, list[str]] | None = None
) -> dict[str, dict[str, Any]]:
    """The states as they really are: an active cell whose job is gone reads as the state its
    launcher reports (`failed` with `lost` set, for a local process killed with -9); a cell
    held back for a need (`needs`: id -> ids it needs, whose states are in `states` too)
    reads as waiting or blocked (`_held`)."""
    return _held(_reconciled(states), needs or {})


def _reconciled(states: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_launcher: dict[str, dict[str, dict[str, Any]]] = {}
    for cell_id, state in states.items():
        if state.get("state") in ACTIVE_STATES and state.get("launcher"):
            by_launcher.setdefault(state["launcher"], {})[cell_id] = state
    if not by_launcher:
        return dict(states)
    observed = dict(states)
    for name, active in by_launcher.items():
        if name not in LAUNCHERS:
            continue
        for cell_id, (new_state, why) in launcher_class(name).reconcile(active).items():
            if new_state == states[cell_id].get("state"):
                observed[cell_id] = {**states[cell_id], "scheduler": why}
            else:
                observed[cell_id] = {**states[cell_id], "state": new_state, "error": why, "lost": True}
    return observed


def _held(observed: dict[str, dict[str, Any]], needs: Mapping[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Cells queued for a need that is not done: `waiting` (the need's id) while it may still
    finish; `blocked` once it cannot, even where the held job itself is gone (a local launcher
    that gave up on it, a SLURM job whose dependency can never be met)."""
    for cell_id, required in needs.items():
        state = observed.get(cell_id)
        # Held back: its attempt has not started, and it is queued or was read lost as such; a
        # final state the cell (or a user's cancel) recorded stands.
        if state is None or state.get("started_at") or not (state.get("state") in ACTIVE_STATES or state.get("lost")):
            continue
        for need in required:
            need_state = str((observed.get(need) or {}).get("state", "planned"))
            if need_state == "done":
                continue
            if need_state in BLOCKING_STATES:
                observed[cell_id] = {
                    **state, "state": "blocked", "lost": False, "waiting": need,
                    "error": f"blocked: it needs {need}, which is {need_state}; resubmit that "
                             f"(`gridrun resubmit --cells {need}`) and this cell follows it",
                }
                break
            if not state.get("lost"):
                observed[cell_id] = {**state, "waiting": need}
                break
    return observed


def needs_of(cells: list[dict[str, Any]]) -> dict[str, list[str]]:
    """id -> the ids it needs done first, for the cells (sweep.json entries) that need any."""
    return {cell["id"]: list(cell["needs"]) for cell in cells if cell.get("needs")}


def sweep_needs(sweep: SweepDir) -> dict[str, list[str]]:
    return needs_of(sweep.read()["cells"])


def observe_cells(sweep: SweepDir, ids: list[str]) -> dict[str, dict[str, Any]]:
    """`observe` for these cells of a sweep (the states of what they need are read too)."""
    needs = sweep_needs(sweep)
    wanted = set(ids) | {need for cell_id in ids for need in needs.get(cell_id, [])}
    observed = observe({cell_id: live_state(sweep.cell(cell_id)) for cell_id in wanted}, needs)
    return {cell_id: observed[cell_id] for cell_id in ids}


def runnable(sweep: SweepDir, ids: list[str]) -> list[str]:
    """The cells a (re-run) sweep dispatches: all but those done, queued, running, damaged or
    missing (an unreadable cell waits for its files to be fixed: its message says how)."""
    states = observe_cells(sweep, ids)
    return [cell_id for cell_id in ids if states[cell_id].get("state") not in ("done", *UNREADABLE_STATES, *ACTIVE_STATES)]


def queue(sweep: SweepDir, ids: list[str], launcher: Launcher) -> list[str]:
    """Mark cells queued (a new attempt) and submit them. Call under `sweep.lock()`.

    Cells blocked on one of `ids` come along (after it). Skips cells that are queued,
    running, damaged or missing, those whose needs will not be done (named in a warning), and those the launcher
    does not admit; returns the ids submitted, each after the cells it needs, base controls
    first (cheap, and the reference every other cell is compared with)."""
    cells = sweep.read()["cells"]
    needs = needs_of(cells)
    base = {cell["id"] for cell in cells if cell["kind"] == "base"}
    every = sweep.cell_ids() if needs else ids
    states = observe_cells(sweep, every)
    released = [
        cell_id for cell_id in every
        if states[cell_id].get("state") == "blocked" and cell_id not in ids
        and any(need in ids for need in needs.get(cell_id, []))
    ]
    ids = [*ids, *released]
    run_dirs = {cell_id: sweep.cell(cell_id) for cell_id in ids}
    todo = [cell_id for cell_id in ids if states[cell_id].get("state") not in (*UNREADABLE_STATES, *ACTIVE_STATES)]
    todo = _needs_first(sorted(todo, key=lambda cell_id: cell_id not in base), needs, states, sweep.name)
    todo = launcher.admit(sweep, todo) if todo else todo
    for cell_id in todo:
        run_dirs[cell_id].record(cellstate.queued(states[cell_id], launcher.name))
    for cell_id, job_id in (launcher.submit(sweep, todo) if todo else {}).items():
        run_dirs[cell_id].record(cellstate.handed_over(job_id=job_id))
    return todo


def _needs_first(
    todo: list[str], needs: Mapping[str, list[str]], states: Mapping[str, Mapping[str, Any]], sweep_name: str
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
            if need not in free and states.get(need, {}).get("state") not in ("done", *ACTIVE_STATES)
        ]
        if stuck:
            state = states.get(stuck[0], {}).get("state", "planned")
            log.warning(
                "not queuing %s: it needs %s, which is %s; dispatch that (`gridrun resubmit conf=%s --cells %s`) "
                "and %s follows it", cell_id, stuck[0], state, sweep_name, stuck[0], cell_id,
            )
            continue
        held.append(cell_id)
    return free + held
