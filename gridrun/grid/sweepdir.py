"""`SweepDir`: the one owner of the paths of a sweep's results directory.

    results/<sweep>/
      sweep.json   the plan: every cell's id, kind, coordinates, fingerprint, resources
      .lock        held while cells are planned, queued or cancelled (no double submission)
      cells/<id>/  one RunDir per cell (gridrun/seam/rundir.py owns what is inside)
      replaced/    cells moved aside by `gridrun plan --replace`
      jobs/        the SLURM launcher's submitit folders: sbatch scripts, pickles, job logs
      cells.parquet  metrics.parquet  report.html  report.md
      table1.md  table1.csv  table1.tex  (and table1_final, table2 ... table6)
      figures/     PNGs drawn by `gridrun collect` (gridrun/analysis/)

A damaged sweep.json (not UTF-8 JSON, wrong types) raises `SweepDamaged` for that sweep
alone: plain `gridrun status` and `gridrun collect` go on with the other sweeps, and
`gridrun plan` writes it again. Sweep names are checked here, so no name leaves the root.

Stdlib only (filelock is imported when a lock is taken): `gridrun status` goes through here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.grid.errors import GridError, closest
from gridrun.seam.rundir import RunDir, atomic_write_json

RESULTS_ENV = "GRIDRUN_RESULTS"
SWEEP_JSON = "sweep.json"
SWEEP_NAME = re.compile(r"[A-Za-z0-9_.-]+")
# Its folder and the lock and temporary files beside it fit any file system's 255-byte names.
SWEEP_NAME_MAX = 100


@dataclass(frozen=True)
class PlanEntry:
    """One cell of sweep.json, as `PlannedCell.entry` (gridrun/grid/plan.py) wrote it;
    `_plan_problem` has checked id, kind and coords. Optional fields are None when a plan
    from an older gridrun lacks them; `raw` is the entry as written."""

    id: str
    kind: str
    coords: Mapping[str, Any]
    fingerprint: str | None = None
    total_steps: int | None = None
    resources: Mapping[str, Any] = field(default_factory=dict)
    est_hours: float | None = None
    gpu_mem_gib: float | None = None
    # Cells that must be done before this one starts (dispatch.py holds it back).
    needs: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlanEntry:
        return cls(
            id=data["id"], kind=data["kind"], coords=data["coords"], fingerprint=data.get("fingerprint"),
            total_steps=data.get("total_steps"), resources=data.get("resources") or {},
            est_hours=data.get("est_hours"), gpu_mem_gib=data.get("gpu_mem_gib"),
            needs=tuple(data.get("needs") or ()), raw=dict(data),
        )

    def to_json(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True)
class SweepPlan:
    """sweep.json, typed: the sweep's cells in plan order, its launcher and cluster settings
    (empty when never recorded), its early-warning and analysis plans and the history of `gridrun plan`
    calls (`plans`). `raw` is the object as written: `gridrun plan` updates and writes it."""

    name: str
    cells: tuple[PlanEntry, ...]
    launcher: Mapping[str, Any] = field(default_factory=dict)
    cluster: Mapping[str, Any] = field(default_factory=dict)
    early_warning: Mapping[str, Any] | None = None
    # The sweep file's `analysis:` (spec.AnalysisPlan's dict), where it has one.
    analysis: Mapping[str, Any] | None = None
    plans: tuple[Mapping[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepPlan:
        return cls(
            name=data["name"], cells=tuple(PlanEntry.from_json(cell) for cell in data["cells"]),
            launcher=data.get("launcher") or {}, cluster=data.get("cluster") or {},
            early_warning=data.get("early_warning"), analysis=data.get("analysis"),
            plans=tuple(data.get("plans") or ()), raw=dict(data),
        )

    def to_json(self) -> dict[str, Any]:
        """A copy of sweep.json's object, for `gridrun plan` to update and write."""
        return copy.deepcopy(dict(self.raw))

    def entries(self) -> dict[str, PlanEntry]:
        """id -> entry."""
        return {cell.id: cell for cell in self.cells}


class SweepDamaged(GridError):
    """sweep.json exists but cannot be read as a plan."""


SWEEP_FILE_SUFFIXES = (".yaml", ".yml")


def sweep_name(conf: str) -> str:
    """The sweep that `conf=<...>` names: a sweep file's path (sweeps/x.yaml, ./my.yml) names
    the sweep of its stem, as `plan` names it; anything else is the name itself."""
    path = Path(conf)
    return path.stem if path.suffix in SWEEP_FILE_SUFFIXES else conf


def check_sweep_name(name: str) -> str:
    """A sweep's name is a folder name under the results root: no separators, not `.`/`..`."""
    if len(name) > SWEEP_NAME_MAX:
        raise GridError(f"sweep name '{name[:40]}...' has {len(name)} characters: it names a folder, so use at most "
                        f"{SWEEP_NAME_MAX} (rename the sweep file)")
    if not SWEEP_NAME.fullmatch(name) or name in (".", ".."):
        raise GridError(
            f"sweep name {name!r} is not a folder name: use letters, digits, '_', '.' and '-' "
            "(not '.' or '..'), e.g. rename the sweep file to sweeps/my_sweep.yaml"
        )
    return name


def results_root(option: str | None = None) -> Path:
    """--results-dir, else $GRIDRUN_RESULTS, else ./results; refuses a sweep's own directory
    and a path that is not a directory."""
    root = Path(option or os.environ.get(RESULTS_ENV) or "results")
    if root.exists() and not root.is_dir():
        raise GridError(f"results root {root} is a file, not a directory: pass --results-dir <a directory>")
    if (root / SWEEP_JSON).is_file():
        raise GridError(
            f"{root} is the directory of sweep '{root.name}', not a results root: "
            f"pass its parent (--results-dir {root.parent})"
        )
    return root


class SweepDir:
    def __init__(self, results: Path, name: str) -> None:
        self.results = results
        self.name = check_sweep_name(name)
        self.root = results / name

    def __repr__(self) -> str:
        return f"SweepDir({str(self.root)!r})"

    # --- paths -------------------------------------------------------------------------
    @property
    def sweep_json(self) -> Path:
        return self.root / SWEEP_JSON

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def measured_step_json(self) -> Path:
        """A canary's measured step, which the dry run's cost model takes for its cell shape."""
        return self.root / "measured-step.json"

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    def cell(self, cell_id: str) -> RunDir:
        return RunDir(self.cells_dir / cell_id)

    def replaced(self, cell_id: str) -> Path:
        """A fresh place to move a replaced cell's old run to."""
        return self.root / "replaced" / f"{cell_id}.{time.strftime('%Y%m%d-%H%M%S')}"

    @property
    def jobs_dir(self) -> Path:
        """submitit's job folders (launcher=slurm): one per job, `<job id>/`."""
        return self.root / "jobs"

    @property
    def cells_parquet(self) -> Path:
        return self.root / "cells.parquet"

    def table1(self, suffix: str) -> Path:
        return self.table("table1", suffix)

    def table(self, name: str, suffix: str) -> Path:
        """table1, table1_final, table2 ... table6 as md, csv or tex."""
        return self.root / f"{name}.{suffix}"

    @property
    def metrics_parquet(self) -> Path:
        return self.root / "metrics.parquet"

    def report(self, suffix: str) -> Path:
        """report.html (self-contained) or report.md."""
        return self.root / f"report.{suffix}"

    @property
    def figures_dir(self) -> Path:
        return self.root / "figures"

    def figure(self, name: str, *where: str) -> Path:
        """figures/<name>[-<task>-<scale>|-<cell>].png"""
        return self.figures_dir / f"{'-'.join((name, *where))}.png"

    # --- sweep.json ----------------------------------------------------------------------
    def exists(self) -> bool:
        return self.sweep_json.is_file()

    def read(self) -> SweepPlan:
        """The plan; fails with the fix when the sweep was never planned here or its
        sweep.json is damaged (SweepDamaged)."""
        fix = f"re-plan it with `gridrun plan conf={self.name}` (cells already on disk are kept)"
        try:
            data: dict[str, Any] = json.loads(self.sweep_json.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise GridError(self._missing_message()) from None
        except UnicodeDecodeError:
            raise SweepDamaged(f"{self.sweep_json} is damaged (not UTF-8 text): {fix}") from None
        except ValueError:
            raise SweepDamaged(f"{self.sweep_json} is damaged (not JSON): {fix}") from None
        why = _plan_problem(data)
        if why:
            raise SweepDamaged(f"{self.sweep_json} is damaged ({why}): {fix}")
        if data.get("name") != self.name:
            raise GridError(
                f"{self.root} holds sweep '{data.get('name')}', not '{self.name}': use "
                f"conf={data.get('name')}, or plan '{self.name}' into another --results-dir"
            )
        return SweepPlan.from_json(data)

    def set_aside_damaged(self) -> Path:
        """Move a damaged sweep.json aside (never delete it) before writing a new one."""
        target = self.root / f"{SWEEP_JSON}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        self.sweep_json.rename(target)
        return target

    def write(self, data: dict[str, Any]) -> None:
        atomic_write_json(self.sweep_json, data)

    def cell_ids(self) -> list[str]:
        return [cell.id for cell in self.read().cells]

    def _missing_message(self) -> str:
        planned = planned_sweeps(self.results)
        hint = closest(self.name, planned) if planned else ""
        where = f"planned sweeps here: {', '.join(planned)}" if planned else "no sweep is planned there yet"
        return (
            f"no sweep '{self.name}' under {self.results}{hint}; {where}. "
            f"Plan it with `gridrun plan conf={self.name}` or pass --results-dir"
        )

    # --- lock ----------------------------------------------------------------------------
    @contextmanager
    def lock(self, timeout_s: float = 60.0) -> Iterator[None]:
        """Serialise planning, queueing and cancelling of this sweep across processes."""
        from filelock import FileLock, Timeout

        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.lock_file))
        try:
            lock.acquire(timeout=timeout_s)
        except Timeout:
            raise GridError(
                f"another gridrun command holds {self.lock_file} (planning or dispatching "
                f"'{self.name}') for over {timeout_s:.0f}s: wait for it to finish, then re-run"
            ) from None
        try:
            yield
        finally:
            lock.release()


def sibling_cell(cell_id: str) -> str:
    """Another cell's run dir as seen from a cell's own (cells/<id>/ are siblings): what a
    config names, so that it holds wherever the results root is."""
    return f"../{cell_id}"


def planned_sweeps(results: Path) -> list[str]:
    """Names of the sweeps planned under a results root, sorted."""
    if not results.is_dir():
        return []
    return sorted(
        entry.name
        for entry in os.scandir(results)
        if SWEEP_NAME.fullmatch(entry.name) and (Path(entry.path) / SWEEP_JSON).is_file()
    )


def _plan_problem(data: object) -> str | None:
    """Why a parsed sweep.json is not a plan readers can use, or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    if not isinstance(data.get("name"), str):
        return "no sweep name"
    cells = data.get("cells")
    if not isinstance(cells, list):
        return "no list of cells"
    for cell in cells:
        if not (
            isinstance(cell, dict)
            and isinstance(cell.get("id"), str)
            and SWEEP_NAME.fullmatch(cell["id"])
            and isinstance(cell.get("kind"), str)
            and isinstance(cell.get("coords"), dict)
            and all(axis in cell["coords"] for axis in ("workflow", "task", "scale"))
        ):
            return f"a cell entry without id, kind and coords: {str(cell)[:60]}"
    for key in ("launcher", "cluster"):
        if key in data and not isinstance(data[key], dict):
            return f"{key} is not a mapping"
    if not isinstance(data.get("plans", []), list):
        return "plans is not a list"
    return None
