"""`gridrun status`: every cell's state as one row, as a rich table or JSON.

The reading side is the fast path (1000 cells well under half a second): sweep.json for the
cell list, then one state.json per cell, which the trainer keeps current (step, last and
peak validation accuracy, the peak's test accuracy once measured, drift alerts), so no
metrics file is parsed. Δ base is a cell's peak minus its done base control's accuracy, in
points (`--sort delta` orders by it).
Standard library only until a table is drawn; rich is imported to draw. A cell reading
running on this host whose run lock no process holds is shown `failed (lost)`, and so are
cells whose job died without saying so as their launcher reconciles them; a cell whose
folder is gone shows `missing` with the command that plans it again; a scheduler's word
for an active cell's job (PENDING, RUNNING) is shown beside its job id. A queued cell held
for a cell it needs shows `waiting: <its id>`, and `blocked` once that one failed. A cell
whose state.json is damaged shows as `damaged` with the file and the fix; a sweep whose
sweep.json is damaged is skipped with a warning when every sweep is listed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gridrun.grid.cells import base_control
from gridrun.grid.launchers.observe import live_state, needs_of, observe
from gridrun.grid.sweepdir import SweepDamaged, SweepDir, SweepPlan, planned_sweeps
from gridrun.seam.cellstate import STATES, UNREADABLE_STATES, CellState, StateRecord

STATE_STYLES = {
    "planned": "dim",
    "queued": "cyan",
    "running": "blue",
    CellState.DONE: "green",
    CellState.STOPPED: "green",
    "failed": "red",
    "preempted": "magenta",
    "cancelled": "yellow",
    "blocked": "red",
    "damaged": "bold red",
    "missing": "bold red",
}


def sweep_rows(sweep: SweepDir, plan: SweepPlan | None = None,
               recorded: Mapping[str, StateRecord] | None = None) -> list[dict[str, Any]]:
    """One row per cell of the sweep, in plan order. `plan` (sweep.json) and `recorded` (each
    cell's state.json): where the caller has read them already (collect reads each once)."""
    cells = (sweep.read() if plan is None else plan).cells
    # state.json only (cell.json's damage is `show`'s to report and `plan`'s to repair): the fast path.
    states = observe({cell.id: live_state(sweep.cell(cell.id), recorded[cell.id] if recorded else None)
                      for cell in cells}, needs_of(cells))
    base_acc = {cell_id: s.peak_val_acc for cell_id, s in states.items() if s.state == CellState.DONE}
    now = time.time()
    rows = []
    for cell in cells:
        state = states[cell.id]
        started, finished = state.started_at, state.finished_at
        if started is None:
            elapsed = None
        elif state.state == CellState.RUNNING:
            elapsed = max(0.0, now - started)  # a node's clock ahead of this one's: 0, never negative
        else:
            elapsed = max(0.0, (finished or state.updated_at or now) - started)
        rows.append(
            {
                "sweep": sweep.name,
                "cell": cell.id,
                "kind": cell.kind,
                "state": state.state.value,
                "step": state.step,
                "total_steps": _count(state.total_steps if "total_steps" in state.raw else cell.total_steps),
                "attempt": state.attempt,
                "job_id": state.job_id,
                # The scheduler's word for an active cell's job (PENDING, RUNNING), if it has one.
                "scheduler": state.scheduler,
                "node": state.node,
                "last_val_acc": state.last_val_acc,
                "peak_val_acc": state.peak_val_acc,
                "peak_step": state.peak_step,
                "peak_test_acc": state.peak_test_acc,
                "elapsed_s": elapsed,
                "alerts": list(state.alerts),
                # What train.on_alert did (export_peak, stop): the alert, its step, the peak's export.
                "on_alert": state.on_alert,
                "alert": state.alert,
                "alert_step": state.alert_step,
                "peak_export": state.peak_export,
                # A reader's message says conf=<sweep> (a run dir knows no sweep): name it.
                "error": state.error.replace("conf=<sweep>", f"conf={sweep.name}") if state.error else None,
                "lost": state.lost,
                # The cell a queued or blocked cell waits for (a transfer cell's sa_rl cell).
                "waiting": state.waiting,
                # Peak minus the done base control's accuracy, in points (None without both).
                "delta_pp": _delta_pp(state.peak_val_acc, base_acc.get(base_control(cell.kind, dict(cell.coords)) or "")),
            }
        )
    return rows


def _delta_pp(peak: float | None, base: float | None) -> float | None:
    return None if peak is None or base is None else 100 * (peak - base)


def sorted_rows(rows: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """`gridrun status --sort`: "plan" keeps the plan's order; "delta" orders by Δ vs base,
    largest first, cells without one last (in plan order)."""
    if by == "delta":
        return sorted(rows, key=lambda row: (row["delta_pp"] is None, -(row["delta_pp"] or 0.0)))
    return rows


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def all_rows(results: Path, conf: str | None, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of one sweep (conf) or of every sweep under the results root; listing every sweep,
    a damaged one is left out and its message added to `skipped`."""
    if conf:
        return sweep_rows(SweepDir(results, conf))
    rows: list[dict[str, Any]] = []
    for name in planned_sweeps(results):
        try:
            rows.extend(sweep_rows(SweepDir(results, name)))
        except SweepDamaged as err:
            if skipped is None:
                raise
            skipped.append(str(err))
    return rows


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    found = {state: 0 for state in STATES}
    for row in rows:
        found[row["state"]] = found.get(row["state"], 0) + 1
    return {state: n for state, n in found.items() if n}


def to_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=1)


# --- drawing (rich) ------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def summary_line(rows: list[dict[str, Any]]) -> str:
    lost = sum(row["lost"] for row in rows)
    parts = [f"[{STATE_STYLES.get(state, '')}]{n} {state}[/]" for state, n in counts(rows).items()]
    text = f"{len(rows)} cells: " + ", ".join(parts)
    return text + (f" ({lost} lost)" if lost else "")


def tables(rows: list[dict[str, Any]]) -> list[Any]:
    """One rich Table per sweep, with a per-state count under each."""
    from rich.table import Table

    by_sweep: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_sweep.setdefault(row["sweep"], []).append(row)
    drawn = []
    for name, sweep_rows_ in by_sweep.items():
        table = Table(title=f"sweep {name}", caption=summary_line(sweep_rows_), title_justify="left", caption_justify="left")
        for column, justify in (
            ("cell", "left"),
            ("kind", "left"),
            ("state", "left"),
            ("step", "right"),
            ("val acc %", "right"),
            ("peak %", "right"),
            ("test %", "right"),
            ("Δ base", "right"),
            ("elapsed", "right"),
            ("attempt", "right"),
            ("job", "left"),
            ("alert", "left"),
        ):
            # The job's id and the scheduler's word (with SLURM's reason: PENDING (Dependency)) go on
            # two lines, so a piped table (160 columns) never wraps a cell id or its state.
            table.add_column(column, justify="right" if justify == "right" else "left", no_wrap=column in ("cell", "state"))
        for row in sweep_rows_:
            style = STATE_STYLES.get(row["state"], "")
            state = row["state"] + (" (lost)" if row["lost"] else "")
            if row["waiting"]:
                state = f"waiting: {row['waiting']}" if row["state"] == "queued" else f"{state}: {row['waiting']}"
            peak = _pct(row["peak_val_acc"])
            if peak and row["peak_step"] is not None:
                peak += f" @{row['peak_step']}"
            alerts = row["alerts"]
            alert = "" if not alerts else alerts[-1] + (f" (+{len(alerts) - 1})" if len(alerts) > 1 else "")
            if row["alert"]:  # train.on_alert acted: what, where, and the peak it kept
                alert = (f"{row['on_alert']} at step {row['alert_step']}: {row['alert']}; peak exported: "
                         f"{row['peak_export']}")
            table.add_row(
                row["cell"],
                row["kind"],
                f"[{style}]{state}[/]",
                f"{row['step']}/{row['total_steps']}",
                _pct(row["last_val_acc"]),
                peak,
                _pct(row["peak_test_acc"]),
                "" if row["delta_pp"] is None else f"{row['delta_pp']:+.1f}",
                _duration(row["elapsed_s"]),
                str(row["attempt"]),
                "\n".join(str(part) for part in (row["job_id"], row["scheduler"]) if part),
                f"[yellow]{alert}[/]" if alert else "",
            )
        drawn.append(table)
    return drawn


def failures(rows: list[dict[str, Any]]) -> list[Any]:
    """A panel per failed, blocked, damaged or missing cell with its error tail, then how to
    resubmit."""
    from rich.panel import Panel

    failed = [row for row in rows if row["state"] in ("failed", "blocked", *UNREADABLE_STATES)]
    panels: list[Any] = []
    for row in failed:
        where = f"attempt {row['attempt']}, job {row['job_id'] or '-'}, node {row['node'] or '-'}, step {row['step']}"
        error = str(row["error"] or "no error recorded").strip()
        panels.append(Panel(error, title=f"[red]{row['sweep']}/{row['cell']}[/]  {where}", title_align="left"))
    for sweep in sorted({row["sweep"] for row in failed if row["state"] == "failed"}):
        panels.append(f"resume them from their newest checkpoints: gridrun resubmit conf={sweep} --failed")
    if not failed:
        panels.append("no failed cells")
    return panels
