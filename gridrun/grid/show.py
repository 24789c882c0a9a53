"""`gridrun show <cell>`: one cell's resolved config, its record and its state.

The cell is a directory (any run dir, inside a sweep or not) or an id looked up in the
sweeps under the results root (`conf=` picks one when the id is in several).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gridrun.grid.errors import GridError, closest
from gridrun.grid.sweepdir import SweepDamaged, SweepDir, planned_sweeps
from gridrun.seam.rundir import DamagedFile, NotARunDir, RunDir


def find_cell(cell: str, results: Path, conf: str | None) -> RunDir:
    """The run dir named by a path or by an id; errors name the close ids."""
    path = Path(cell)
    if path.is_dir() or "/" in cell:
        try:
            return RunDir(path).require_folder()
        except NotARunDir as err:
            raise GridError(str(err)) from None
    names = [conf] if conf else planned_sweeps(results)
    found = []
    known: list[str] = []
    for name in names:
        try:
            ids = SweepDir(results, name).cell_ids()
        except SweepDamaged:
            if conf:
                raise
            continue  # `gridrun status` names it; the other sweeps may hold the cell
        known.extend(ids)
        if cell in ids:
            found.append(SweepDir(results, name))
    if not found:
        where = f"sweep '{conf}'" if conf else f"any sweep under {results}"
        hint = closest(cell, sorted(set(known))) if known else ""
        raise GridError(f"no cell '{cell}' in {where}{hint}: pass a cell id from `gridrun status` or a cell directory")
    if len(found) > 1:
        options = " or ".join(f"conf={sweep.name}" for sweep in found)
        raise GridError(f"cell '{cell}' is in {len(found)} sweeps: add {options}")
    return found[0].cell(cell).require_folder()


def show(run_dir: RunDir, console: Any) -> None:
    from rich.syntax import Syntax
    from rich.table import Table

    console.print(f"[bold]{run_dir.root}[/]")
    console.print(Syntax(run_dir.config_yaml.read_text(), "yaml", background_color="default"))
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    try:
        record = run_dir.read_record() or {}
    except DamagedFile:
        record = {}  # inspect() below names the damage
    for key in ("kind", "coords", "fingerprint", "resources", "est_hours", "git", "settings"):
        if key in record:
            info.add_row(key, json.dumps(record[key]) if isinstance(record[key], (dict, list)) else str(record[key]))
    state = run_dir.inspect()
    shown: dict[str, Any] = {
        "state": state.state, "step": state.step, "total_steps": state.total_steps, "attempt": state.attempt,
        "launcher": state.launcher, "job_id": state.job_id, "node": state.node, "pid": state.pid,
        "last_val_acc": state.last_val_acc, "peak_val_acc": state.peak_val_acc, "peak_step": state.peak_step,
        "peak_test_acc": state.peak_test_acc,
        "alerts": list(state.alerts) if state.raw.get("alerts") is not None else None,
    }
    for key, value in shown.items():
        if value is not None:
            info.add_row(key, str(value))
    for key, at in (("started_at", state.started_at), ("finished_at", state.finished_at),
                    ("updated_at", state.updated_at)):
        if at is not None:
            info.add_row(key, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)))
    console.print(info)
    _show_preset(run_dir, console)
    if state.error:
        console.print(f"[red]error:[/]\n{state.error}")


def _show_preset(run_dir: RunDir, console: Any) -> None:
    """The cell's preset, and each of the preset's items this cell sets otherwise."""
    import yaml

    from gridrun.grid.presets import departures

    try:
        config = yaml.safe_load(run_dir.config_yaml.read_text())
        differ = departures(config)
    except (yaml.YAMLError, KeyError, TypeError, AttributeError, OSError):
        return  # a damaged or older config.yaml: printed above as it is
    if not differ:
        console.print(f"preset: {config['preset']} (no item set otherwise)")
        return
    console.print(f"preset: {config['preset']}, except:")
    for key, value, expected in differ:
        console.print(f"  {key}: {value!r} (the preset's: {expected!r})")
