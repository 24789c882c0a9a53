"""A cell's state machine: the states of `state.json`, its named transitions, and the rules
that refuse an illegal one.

    planned ─► queued ─► running ─► done | stopped | failed | preempted | cancelled
                  ▲                          │
                  └──── next attempt ────────┘  (failed, preempted, cancelled, blocked)

Every change of a cell's `state.json` is one of the `Transition`s built here (`planned`,
`queued`, `handed_over`, `started`, `progressed`, `done`, `stopped`, `failed`, `preempted`,
`cancelled`), and `RunDir.record` is the one place that writes one: it reads the record,
lets the transition check the state it leaves (`IllegalTransition` names the rule broken)
and writes the result atomically. The file format is the one readers always had: a flat
JSON object whose `state` is a `CellState` value, other fields as the writers set them.

Three states are never written: `damaged` (a file of the cell cannot be read) and
`missing` (its folder, or the folder's config.yaml, is gone: deleted by hand, even while it
ran), both derived by `RunDir.read_state`, and `blocked` (a queued cell whose need can no
longer finish). All three, with a lost job's `failed`, are a cell's observed state:
gridrun/grid/launchers/observe.py. Left out: which process may write (the run's lock and the
sweep's lock decide that) and reading (RunDir.read_state, tolerant of damage).
Standard library only: both halves import it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any


class CellState(StrEnum):
    PLANNED = "planned"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    # Ended early and cleanly by its own alert (train.on_alert=stop): final, like done.
    STOPPED = "stopped"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    # A file of the cell cannot be read; nothing dispatches the cell until it is fixed.
    DAMAGED = "damaged"
    # Its folder or config.yaml is gone; `gridrun plan` writes it again.
    MISSING = "missing"
    # Queued for a need (a transfer cell's sa_rl) that failed, was cancelled or preempted.
    BLOCKED = "blocked"


STATES = tuple(state.value for state in CellState)
ACTIVE_STATES = (CellState.QUEUED.value, CellState.RUNNING.value)
# A cell that ended by itself: nothing dispatches it again, and what it trained can be used.
FINISHED_STATES = (CellState.DONE.value, CellState.STOPPED.value)
# A needed cell in one of these states will not become done by itself: its dependents are blocked.
BLOCKING_STATES = (CellState.FAILED.value, CellState.CANCELLED.value, CellState.PREEMPTED.value, CellState.BLOCKED.value)
# What a file on disk can say (the other three are derived by readers, never written).
RECORDED = frozenset(CellState) - {CellState.DAMAGED, CellState.MISSING, CellState.BLOCKED}
# Cells no launcher dispatches until a user fixes them (their error says how).
UNREADABLE_STATES = (CellState.DAMAGED.value, CellState.MISSING.value)
# `gridrun run`'s exit code for a run that stopped to resume later (SLURM's warning): every
# rank of a cell stops after the same step and exits with it; the launchers requeue on it.
EXIT_PREEMPTED = 75
# Fields of an attempt kept in the `attempts` history when the cell is queued again.
ATTEMPT_FIELDS = ("attempt", "state", "launcher", "job_id", "node", "step", "started_at", "finished_at", "error")


_NUMBER = (int, float)
# state.json's fields and the types a reader may rely on (None is always allowed); RunDir's
# reader refuses a file whose field has another type (the cell reads damaged).
STATE_FIELDS: dict[str, tuple[type, ...]] = {
    "state": (str,),
    "step": (int,),
    "total_steps": (int,),
    "attempt": (int,),
    "pid": (int,),
    "peak_step": (int,),
    "requeues": (int,),
    "slurm_restarts": (int,),
    "skipped_nonfinite": (int,),
    "alert_step": (int,),
    "job_id": (str,),
    "node": (str,),
    "launcher": (str,),
    "scheduler": (str,),
    "waiting": (str,),
    "error": (str,),
    "on_alert": (str,),
    "alert": (str,),
    "peak_export": (str,),
    "last_val_acc": _NUMBER,
    "peak_val_acc": _NUMBER,
    "peak_test_acc": _NUMBER,
    "queued_at": _NUMBER,
    "started_at": _NUMBER,
    "finished_at": _NUMBER,
    "updated_at": _NUMBER,
    "alerts": (list,),
    "attempts": (list,),
    "first_val": (dict,),
    "lost": (bool,),
}


@dataclass(frozen=True)
class StateRecord:
    """A cell's state.json, typed: what `RunDir.read_state` returns and `RunDir.record` writes.

    `raw` is the object as on disk (its keys and their order, unknown keys included), so the
    one writer writes back exactly what it read plus the transition's fields, and a record
    written by an older gridrun reads the same. Counts absent or null read 0; the derived
    fields (`lost`, `scheduler`, `waiting`) are set by gridrun/grid/launchers/observe.py through `with_`."""

    state: CellState
    step: int = 0
    total_steps: int | None = None
    attempt: int = 0
    pid: int | None = None
    job_id: str | None = None
    node: str | None = None
    launcher: str | None = None
    error: str | None = None
    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float | None = None
    last_val_acc: float | None = None
    peak_val_acc: float | None = None
    peak_step: int | None = None
    # The peak's accuracy on the task's test split, measured once as the run ends.
    peak_test_acc: float | None = None
    first_val: Mapping[str, Any] | None = None
    alerts: tuple[Any, ...] = ()
    # Earlier attempts, each with ATTEMPT_FIELDS (oldest first).
    attempts: tuple[Mapping[str, Any], ...] = ()
    requeues: int = 0
    slurm_restarts: int = 0
    skipped_nonfinite: int = 0
    # train.on_alert's action (export_peak, stop): the alert that set it off, its step, and
    # where the peak's adapters were exported ("base model": the peak is step 0, no adapter).
    on_alert: str | None = None
    alert: str | None = None
    alert_step: int | None = None
    peak_export: str | None = None
    lost: bool = False
    scheduler: str | None = None
    waiting: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateRecord:
        """The record of a state.json object whose fields have STATE_FIELDS' types (or are
        null); ValueError when its `state` is no CellState."""
        typed = {f.name for f in fields(cls)} - {"raw"}
        values: dict[str, Any] = {key: data[key] for key in typed if data.get(key) is not None}
        values["state"] = CellState(str(data.get("state")))
        for key in ("alerts", "attempts"):
            if key in values:
                values[key] = tuple(values[key])
        for key in ("step", "attempt", "requeues", "slurm_restarts", "skipped_nonfinite"):
            values[key] = int(values.get(key) or 0)
        return cls(**values, raw=dict(data))

    @classmethod
    def derived(cls, state: CellState, error: str | None = None) -> StateRecord:
        """A record no file holds: planned (no state.json), damaged or missing."""
        data: dict[str, Any] = {"state": state.value, "step": 0, "attempt": 0}
        if error is not None:
            data["error"] = error
        return cls.from_json(data)

    def with_(self, **changes: Any) -> StateRecord:
        """This record with `changes` (state.json field names), in the typed fields and in `raw`."""
        data = {**self.raw, **{key: value.value if isinstance(value, CellState) else value
                               for key, value in changes.items()}}
        return StateRecord.from_json(data)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (as written, or as derived), keys in their order."""
        return dict(self.raw)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def failures(self) -> int:
        """Attempts that ended failed, this one included (what grid.launcher.max_attempts caps)."""
        ended = [*(attempt.get("state") for attempt in self.attempts), self.state]
        return sum(state == CellState.FAILED for state in ended)


class IllegalTransition(RuntimeError):
    """A transition from a state it may not leave; the message names the rule."""


@dataclass(frozen=True)
class Transition:
    """One named change of state.json: the states it may leave (`sources`), the state it
    enters (`to`, None to keep it) and the fields it sets (merged into the record, or the
    whole record when `fresh`)."""

    name: str
    sources: frozenset[CellState]
    rule: str
    to: CellState | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    fresh: bool = False
    # queued only: the state as the caller observed it (a lost job reads failed, a held
    # cell blocked), judged instead of the file's and kept in the attempts history.
    observed: Mapping[str, Any] | None = None

    def apply(self, current: Mapping[str, Any] | None) -> dict[str, Any]:
        """The record after this transition; `current` None when the file was damaged and
        moved aside (nothing is known to judge from: its writer records what it knows)."""
        judged = self.observed if self.observed is not None else current
        if judged is not None:
            leaving = str(judged.get("state", CellState.PLANNED))
            if leaving not in self.sources:
                raise IllegalTransition(f"{self.name} from {leaving} is refused: {self.rule}")
        if self.observed is not None:
            fields = _next_attempt(self.observed, self.fields)
        else:
            fields = dict(self.fields)
        if self.to is not None:
            fields["state"] = self.to.value
        return fields if self.fresh or current is None else {**current, **fields}


def _next_attempt(previous: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that open the next attempt, the previous one moving to the history."""
    history = list(previous.get("attempts") or [])
    attempt = int(previous.get("attempt") or 0)
    if attempt:
        history.append({key: previous.get(key) for key in ATTEMPT_FIELDS})
    return {
        "attempt": attempt + 1,
        "attempts": history,
        "pid": None,
        "error": None,
        "queued_at": time.time(),
        "started_at": None,
        "finished_at": None,
        **fields,
    }


def planned(total_steps: int) -> Transition:
    """A cell written by `gridrun plan`: a fresh record, attempt 0."""
    return Transition(
        "planned", frozenset({CellState.PLANNED}), "a plan never resets a cell's history (re-plan with --replace "
        "to move the old run to replaced/)", CellState.PLANNED,
        {"step": 0, "total_steps": total_steps, "attempt": 0}, fresh=True,
    )


def queued(observed: StateRecord, launcher: str, job_id: str | None = None, **more: Any) -> Transition:
    """The next attempt, handed to `launcher`: judged from the state as `observed` (so a
    job lost while it read running may be queued again); `more` sets bookkeeping such as a
    SLURM requeue's `requeues` and `slurm_restarts`."""
    sources = frozenset({CellState.PLANNED, CellState.FAILED, CellState.PREEMPTED, CellState.CANCELLED, CellState.BLOCKED})
    rule = "only a planned, failed, preempted, cancelled or blocked cell is queued (a done one is re-planned " \
           "with --replace; an active one is already queued)"
    return Transition("queued", sources, rule, CellState.QUEUED, {"launcher": launcher, "job_id": job_id, **more},
                      observed=observed.to_json())


def handed_over(job_id: str | None = None, pid: int | None = None) -> Transition:
    """What the launcher learnt once it handed the cell over: its job id, its process id.
    The job may have started, even ended, meanwhile, so any state after queued will do."""
    fields = {key: value for key, value in (("job_id", job_id), ("pid", pid)) if value is not None}
    return Transition("handed_over", RECORDED - {CellState.PLANNED}, "a cell that was never queued has no job",
                      fields=fields)


def started(pid: int, node: str, total_steps: int) -> Transition:
    """`gridrun run` took the run's lock and starts (or resumes) the cell. Any recorded state
    but a final one will do (a cell rerun by hand, a run whose process was killed): the lock,
    not the state, keeps a cell to one process; done and stopped are final for `run` as for
    `resubmit` (re-plan with --replace to train again)."""
    return Transition(
        "started", RECORDED - {CellState(s) for s in FINISHED_STATES},
        "a done or stopped cell is final (re-plan it with --replace to run it again)", CellState.RUNNING,
        {"pid": pid, "node": node, "started_at": time.time(), "total_steps": total_steps, "error": None},
    )


def progressed(**fields: Any) -> Transition:
    """The running trainer's progress: step, validation accuracy, alerts, counters."""
    return Transition("progressed", frozenset({CellState.RUNNING}), "only a running cell makes progress",
                      fields=fields)


def done() -> Transition:
    return Transition("done", frozenset({CellState.RUNNING}), "only the run that ran a cell finishes it", CellState.DONE,
                      {"finished_at": time.time()})


def alert_acted(action: str, alert: str, step: int, peak_export: str | None) -> Transition:
    """train.on_alert acted on `alert`, first firing at `step`: for export_peak the cell
    trains on (state unchanged); `stopped` below ends it."""
    return Transition("alert_acted", frozenset({CellState.RUNNING}), "only a running cell's alert acts",
                      fields={"on_alert": action, "alert": alert, "alert_step": step, "peak_export": peak_export})


def stopped(alert: str, step: int, peak_export: str | None) -> Transition:
    """train.on_alert=stop: the cell ended cleanly after `step`, where `alert` first fired,
    its peak's adapters exported to `peak_export`."""
    return Transition("stopped", frozenset({CellState.RUNNING}), "only the run that ran a cell stops it",
                      CellState.STOPPED, {"on_alert": "stop", "alert": alert, "alert_step": step,
                                          "peak_export": peak_export, "finished_at": time.time()})


def failed(error: str) -> Transition:
    """The run failed, or its launcher saw it die before it could say so (from queued: it
    died before it recorded running)."""
    return Transition("failed", frozenset({CellState.QUEUED, CellState.RUNNING}), "only an active cell fails",
                      CellState.FAILED, {"error": error, "finished_at": time.time()})


def cancelled(error: str) -> Transition:
    """Stopped by a user (SIGTERM to the run), or cancelled before it started (queued)."""
    return Transition("cancelled", frozenset({CellState.QUEUED, CellState.RUNNING}), "only an active cell is cancelled",
                      CellState.CANCELLED, {"error": error, "finished_at": time.time()})


def preempted(error: str) -> Transition:
    """Stopped to resume later. From cancelled too: a SLURM job whose requeue was refused
    after its trainer had recorded the SIGTERM that stopped it; and from preempted: the
    trainer recorded its own stop on SLURM's warning, and the job then learns that no requeue
    follows (its requeue budget is spent) and says so."""
    return Transition("preempted", frozenset({CellState.QUEUED, CellState.RUNNING, CellState.CANCELLED,
                                              CellState.PREEMPTED}),
                      "only an active (or just stopped) cell is preempted", CellState.PREEMPTED,
                      {"error": error, "finished_at": time.time()})
