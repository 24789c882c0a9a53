"""`gridrun collect`: the paper's analysis of a sweep, from its run directories.

Reads every cell's state and metrics once (RunDir's readers; in worker processes for large
sweeps) and hands what it parsed on: the calibration replays the rows it kept, `--export-peaks`
finds each peak in the validation accuracies it read; neither opens metrics.jsonl again.
Writes, under results/<sweep>/:

    cells.parquet     one row per cell: coordinates, kind, state, attempt, cost (wall_h,
                      gpu_h), the per-cell statistics of analysis/summary.py, the
                      step-0 check against the base control, drift alerts and mechanism
                      flags, and where its peak's checkpoint is (`peak_checkpoint`)
    metrics.parquet   every numeric metric of every cell in long form:
                      cell, split, step, metric, value
    table1 .. table6  (and table1_final) as md, csv and tex: analysis/tables.py
    selection_bias    per cell, its val peak against the same checkpoint's test accuracy
    findings, findings_alerts   the paper's claims measured, and the mechanism alerts per
                      cell, as md, csv and tex: analysis/findings.py
    early_warning     per alert, its recall on cliff cells and false-alarm rate on the others
                      (analysis/warning.py; the per-cell cliff and leads are in cells.parquet)
    noise_floor       per trained cell, its validation SE, noise floor and largest fall in SEs
    alert_actions     cells whose train.on_alert acted: steps a stop saved, the peak it kept
                      against the would-be end (its own final, or a twin's that ran on)
    early_warning_calibration, early_warning_search, mechanism_shown   with an early_warning
                      plan in sweep.json: thresholds chosen on its fit seeds and reported on
                      its held-out seeds (analysis/calibration.py)
    figures/          PNGs: analysis/curves.py (learning curves, gradient shares),
                      analysis/paper_figures.py (Figures 2-6), early_warning-<task>-<scale>
    report.md, report.html   analysis/report.py

In a sweep with variants, tables 1-6 and findings_alerts are written per variant (over its
cells and the controls), named <table>-<variant>; findings and early_warning span them all;
the learning curves and Figures 2-6 are drawn for the first variant (the reference).

The base check: a training cell's step-0 validation evaluates the same base model on the
same problems as its `base` control, so the two should agree; a cell that differs by more
than `tolerance_pp` points is flagged, because then its gains are measured against the
wrong baseline (a different validation set, template or engine).

Torch-free; matplotlib is imported only to draw. Unfinished cells are read too (their
curves so far are drawn), but only `done` cells give numbers in the tables.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import yaml

from gridrun.adapters import peak_checkpoint
from gridrun.analysis.calibration import calibration_tables
from gridrun.analysis.findings import alerts_table, findings_table
from gridrun.analysis.report import code
from gridrun.analysis.summary import (
    MetricColumns,
    alert_summary,
    cell_grouping,
    cell_hours,
    cell_summary,
    planned_validations,
)
from gridrun.analysis.tables import (
    Table,
    base_mismatch_notes,
    flags,
    selection_bias_table,
    signature_tables,
    table1,
    table2,
    table3,
)
from gridrun.analysis.warning import (
    CLIFF_SE,
    alert_actions_table,
    detector_table,
    early_warning_jobs,
    early_warning_table,
    noise_table,
    warning_columns,
)
from gridrun.grid.cells import base_control
from gridrun.grid.console import track
from gridrun.grid.spec import EarlyWarningPlan
from gridrun.grid.status import sweep_rows
from gridrun.grid.sweepdir import SweepDir, SweepPlan
from gridrun.seam import registry
from gridrun.seam.cellstate import FINISHED_STATES, CellState
from gridrun.seam.mechanisms import ALERTS
from gridrun.seam.metric_keys import VAL_ROLE
from gridrun.seam.runconfig import CellKind
from gridrun.seam.rundir import RunDir, atomic_write_bytes, atomic_write_text

# Below this many cells, worker processes cost more to start than they save.
PARALLEL_FROM_CELLS = 200
INT_COLUMNS = ("seed", "peak_step", "final_step", "cliff_step", "peak_drop_step", "peak_drop_peak_step",
               "peak_drop_onset_step", "detector_step", *(f"alert/{m}/{c}" for m in ALERTS for c in ("fired", "steps", "first_step", "lead")))


@dataclass
class SweepData:
    """What collect read: the cells frame, each cell's metric columns and, where kept, its
    metric rows as read (a sweep with an early_warning plan: the calibration replays them)."""

    cells: pd.DataFrame
    columns: dict[str, MetricColumns]
    # sweep.json as read, once: the report and the calibration read it from here.
    plan: SweepPlan
    rows: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def val_acc(self, cell: str) -> dict[int, float]:
        """A cell's step -> validation accuracy, as its peak and Table 1 read it."""
        return self.columns[cell].series("val", "val/acc")


class CellRead(NamedTuple):
    """One cell's metrics as read: its columns, summary, metrics.jsonl damage and, when asked
    for, the rows themselves."""

    columns: MetricColumns
    summary: dict[str, Any]
    damage: str | None
    rows: list[dict[str, Any]] | None


def read_cell(root: str, workflow: str | None = None, policy: str | None = None, cliff_se: float = CLIFF_SE,
              keep_rows: bool = False) -> CellRead:
    """One cell's metric columns, summary (the mechanism alerts replayed for its workflow and
    policy included, its cliff against `cliff_se` standard errors), metrics.jsonl damage and,
    with `keep_rows`, its rows (a top-level function: worker processes run it)."""
    run_dir = RunDir(root)
    _load_workflow_plugin(run_dir, workflow)
    rows, damage = run_dir.read_metrics_checked()
    columns = MetricColumns.from_rows(rows)
    alerts = alert_summary(rows, workflow, policy, groups=cell_grouping(run_dir, policy))
    # An unreadable record leaves its validation unpaired; the cell's numbers stand.
    records, records_damage = run_dir.read_records("val")
    warning = warning_columns(columns.series("val", "val/acc"), alerts, columns.series("val", "val/acc_se"), cliff_se,
                              records, planned_validations(run_dir))
    summary = {**cell_summary(columns), **alerts, **warning, "records_damage": "; ".join(records_damage) or None}
    return CellRead(columns, summary, damage, rows if keep_rows else None)


def _load_workflow_plugin(run_dir: RunDir, workflow: str | None) -> None:
    """Import the module that registers the cell's workflow when its config names one: the
    alerts replayed on its rows look the workflow's parallel role up by name. A built-in
    workflow needs no config read (a YAML parse per cell was 15% of a 1176-cell collect). A
    config that does not read leaves it to that lookup to say the workflow is unknown."""
    if workflow is None or workflow in registry.workflow_names():
        return
    try:
        node = yaml.safe_load(run_dir.config_yaml.read_text()).get("workflow") or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        return
    if isinstance(node, dict) and isinstance(node.get("plugin"), str):
        registry.load_plugin(node["plugin"])


def _workers(cells: int) -> int:
    """Worker processes for reading and drawing: none below PARALLEL_FROM_CELLS cells."""
    return min(cells // PARALLEL_FROM_CELLS, os.cpu_count() or 1, 8)


def _read_all(cells: Sequence[tuple[str, str | None, str | None, float, bool]], description: str) -> list[CellRead]:
    """read_cell of each (root, workflow, policy, cliff_se, keep_rows)."""
    workers = _workers(len(cells))
    if workers < 2:
        return [read_cell(*cell) for cell in track(cells, description)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(read_cell, *zip(*cells, strict=True), chunksize=max(1, len(cells) // (workers * 8))))


def base_id(kind: str, coords: dict[str, Any]) -> str | None:
    """The id of the base control that a cell's step 0 must match (none for base, transfer and
    eval cells: their adapters are not the base model)."""
    return base_control(kind, coords) if CellKind(kind).trains else None


def read_sweep(sweep: SweepDir, tolerance_pp: float = 1.0) -> SweepData:
    """Every cell of the sweep, finished or not, with its statistics (and its metric rows
    when sweep.json records an early_warning plan: the calibration replays them)."""
    recorded = sweep.read()
    plan = recorded.entries()
    keep_rows = recorded.early_warning is not None
    # Each cell's state.json, read once: its row and its hours come from the same record.
    states = {cell.id: sweep.cell(cell.id).read_state() for cell in recorded.cells}
    rows = sweep_rows(sweep, recorded, states)
    # The cliff's k: the sweep file's early_warning.cliff_se, else the default.
    early = EarlyWarningPlan.parse(recorded.early_warning, str(sweep.sweep_json)) if recorded.early_warning else None
    k = CLIFF_SE if early is None or early.cliff_se is None else early.cliff_se
    read = _read_all(
        [(str(sweep.cell(row["cell"]).root), plan[row["cell"]].coords.get("workflow"), plan[row["cell"]].coords.get("policy"),
          k, keep_rows) for row in rows],
        f"reading {len(rows)} cells of {sweep.name}",
    )
    now = time.time()
    records, columns, kept = [], {}, {}
    for row, (metric_columns, summary, metrics_damage, metric_rows) in zip(rows, read):
        cell = plan[row["cell"]]
        resources = cell.resources
        wall_h = cell_hours(states[row["cell"]], now)
        columns[row["cell"]] = metric_columns
        if metric_rows is not None:
            kept[row["cell"]] = metric_rows
        # A damaged file (state.json, cell.json, metrics.jsonl) makes the cell `damaged`: its
        # numbers stay out of the tables, and `damage` says which file and how to fix it.
        damage = row["error"] if row["state"] == "damaged" else metrics_damage
        records.append({
            "sweep": sweep.name, "cell": row["cell"], "kind": row["kind"], **cell.coords,
            "state": "damaged" if damage else row["state"], "damage": damage,
            "step": row["step"], "total_steps": row["total_steps"], "attempt": row["attempt"],
            "wall_h": wall_h, "gpu_h": wall_h * int(resources.get("gpus") or 0) * int(resources.get("nodes") or 1),
            "alerts": "; ".join(row["alerts"]),
            # train.on_alert's action, where it acted (export_peak, stop).
            "on_alert": row["on_alert"], "alert": row["alert"], "alert_step": row["alert_step"],
            "peak_export": row["peak_export"],
            **summary,
        })
    frame = pd.DataFrame.from_records(records)
    frame["peak_checkpoint"] = [_peak_where(sweep.cell(c), k, p) for c, k, p in
                                zip(frame["cell"], frame["kind"], frame.get("peak_step", [None] * len(frame)))]
    _check_base(frame, tolerance_pp)
    frame["flags"] = ["; ".join(flags(r)) for _, r in frame.iterrows()]
    for column in INT_COLUMNS:
        if column in frame:
            frame[column] = pd.array([None if pd.isna(v) else int(v) for v in frame[column]], dtype="Int64")
    return SweepData(frame, columns, recorded, kept)


def twin_ran_on(sweep: SweepDir, cells: pd.DataFrame, cell: str) -> str | None:
    """A done cell whose config is `cell`'s but for train.on_alert (and its id and variant):
    where the stopped `cell` would have ended. None without one."""
    own = _alike(str(sweep.cell(cell).config_yaml))
    if own is None:
        return None
    done = cells[(cells["state"] == CellState.DONE) & (cells["cell"] != cell)]
    return next((c for c in done["cell"] if _alike(str(sweep.cell(c).config_yaml)) == own), None)


@functools.lru_cache(maxsize=4096)
def _alike(config_yaml: str) -> str | None:
    """A cell's config.yaml without its `cell` node and train.on_alert, as canonical JSON
    (what twins share); None when it does not read."""
    try:
        tree = yaml.safe_load(Path(config_yaml).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(tree, dict):
        return None
    tree.pop("cell", None)
    if isinstance(tree.get("train"), dict):
        tree["train"].pop("on_alert", None)
    return json.dumps(tree, sort_keys=True, default=str)


def _peak_where(run_dir: RunDir, kind: str, peak_step: Any) -> str | None:
    """The `peak_checkpoint` column (PeakCheckpoint.describe); None for cells that train
    nothing or have no peak yet."""
    if not CellKind(kind).trains or peak_step is None or pd.isna(peak_step):
        return None
    return peak_checkpoint(run_dir, int(peak_step)).describe()


def _check_base(frame: pd.DataFrame, tolerance_pp: float) -> None:
    step0 = frame["val_acc_step0"]
    base_acc = {c: a for c, k, s, a in zip(frame["cell"], frame["kind"], frame["state"], step0) if k == CellKind.BASE and s == CellState.DONE}
    frame["base_cell"] = [base_id(k, r) for k, r in zip(frame["kind"], frame.to_dict("records"))]
    frame["base_val_acc"] = pd.array([base_acc.get(b) if b else None for b in frame["base_cell"]], dtype="Float64")
    diffs = [
        100 * (a - b) if a is not None and not pd.isna(a) and b is not None and not pd.isna(b) else None
        for a, b in zip(step0, frame["base_val_acc"])
    ]
    frame["step0_minus_base_pp"] = pd.array(diffs, dtype="Float64")
    frame["base_mismatch"] = [d is not None and abs(d) > tolerance_pp for d in diffs]


def metrics_frame(columns: dict[str, MetricColumns]) -> pd.DataFrame:
    """Every metric of every cell in long form (categorical cell, split and metric)."""
    import numpy as np

    lengths, cell_codes, split_codes, metric_codes, steps, values = [], [], [], [], [], []
    split_names: dict[str, int] = {}
    metric_names: dict[str, int] = {}
    for cell_code, cell_columns in enumerate(columns.values()):
        for split, by_metric in cell_columns.splits.items():
            split_code = split_names.setdefault(split, len(split_names))
            for metric, (metric_steps, metric_values) in by_metric.items():
                lengths.append(len(metric_steps))
                cell_codes.append(cell_code)
                split_codes.append(split_code)
                metric_codes.append(metric_names.setdefault(metric, len(metric_names)))
                steps.append(metric_steps)
                values.append(metric_values)

    def categorical(codes: list[int], names: Iterable[str], dtype: Any) -> pd.Categorical:
        # One code per (cell, split, metric) column, repeated over its rows in one call.
        return pd.Categorical.from_codes(np.repeat(np.asarray(codes, dtype=dtype), lengths), categories=list(names))

    return pd.DataFrame({
        "cell": categorical(cell_codes, columns, np.int32),
        "split": categorical(split_codes, split_names, np.int8),
        "step": np.concatenate(steps) if steps else np.zeros(0, dtype=np.int64),
        "metric": categorical(metric_codes, metric_names, np.int32),
        "value": np.concatenate(values) if values else np.zeros(0),
    })


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Atomically (a reader never sees half a file), readable by all like every other output
    (a temp file of pyarrow's own would be 0600), a full disk's error naming the file."""
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write_bytes(path, buffer.getvalue())


def write_table(sweep: SweepDir, table: Table) -> None:
    atomic_write_text(sweep.table(table.name, "csv"), table.csv())
    atomic_write_text(sweep.table(table.name, "md"), table.markdown())
    atomic_write_text(sweep.table(table.name, "tex"), table.latex())


def _parquet_ready(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding only numbers or None become floats (pyarrow would guess)."""
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object and all(v is None or isinstance(v, (int, float)) for v in out[column]):
            out[column] = pd.array([None if v is None else float(v) for v in out[column]], dtype="Float64")
    return out


def variant_slices(cells: pd.DataFrame) -> list[tuple[str | None, pd.DataFrame]]:
    """(variant, its cells and the controls) per variant of a sweep that has them, in the
    sweep's order; (None, every cell) for one without."""
    if "variant" not in cells or not cells["variant"].notna().any():
        return [(None, cells)]
    return [(v, cells[cells["variant"].isna() | (cells["variant"] == v)]) for v in dict.fromkeys(cells["variant"].dropna())]


def for_variant(table: Table, variant: str | None) -> Table:
    """A table of one variant's cells: named <table>-<variant>, the variant in its title."""
    if variant is None:
        return table
    return dataclasses.replace(table, name=f"{table.name}-{variant}", title=f"{table.title} — variant {code(variant)}")


def export_peaks(sweep: SweepDir, data: SweepData, out: Path, console: Any) -> list[Path]:
    """`gridrun export` of every done cell's peak into out/<sweep>/<cell>-step_XXXXXX (one
    already there is kept: a checkpoint never changes), each peak found in the validation
    accuracies collect read; returns the folders written."""
    from gridrun.export import ExportError, export

    written, kept, missing = [], 0, []
    cells = data.cells
    done = cells[cells["state"].isin(FINISHED_STATES) & cells["peak_checkpoint"].notna()]
    for cell, step in zip(done["cell"], done["peak_step"]):
        peak = peak_checkpoint(sweep.cell(cell), int(step))
        if peak.base_model:
            continue
        if peak.deleted:
            missing.append(cell)
            continue
        target = out / sweep.name / f"{cell}-step_{int(step):06d}"
        if target.exists():
            kept += 1
            continue
        try:
            written.append(export(sweep.cell(cell), "peak", target, val_acc=data.val_acc(cell)))
        except ExportError as err:
            missing.append(f"{cell} ({err})")
    console.print(f"exported {len(written)} peaks to {out / sweep.name}" + (f", {kept} already there" if kept else ""))
    if missing:
        console.print(f"[yellow]peaks not on disk:[/] {', '.join(missing)}", highlight=False)
    return written


def collect(sweep: SweepDir, console: Any, tolerance_pp: float = 1.0, export_to: Path | None = None) -> list[Table]:
    """Write every output (see the module docstring); print Table 1 and where the rest went;
    with `export_to`, export every done cell's peak there too."""
    from gridrun.analysis.curves import figure_jobs
    from gridrun.analysis.paper_figures import paper_figure_jobs
    from gridrun.analysis.plotting import render
    from gridrun.analysis.report import write_report

    data = read_sweep(sweep, tolerance_pp)
    cells = data.cells
    _alike.cache_clear()  # a config read by an earlier collect in this process may have changed

    def signatures(cell: str) -> dict[str, dict[int, float]]:
        columns = data.columns[cell]
        return {m: columns.series("val", m) for m in columns.metrics("val") if m.startswith(VAL_ROLE)}

    tables: list[Table] = []
    for variant, part in variant_slices(cells):
        peak = table1(part)
        peak.notes = base_mismatch_notes(part[part["base_mismatch"]])
        tables += [for_variant(t, variant) for t in [
            peak, table1(part, "final_val_acc"), table2(part), table3(part), *signature_tables(part, signatures),
            alerts_table(part)]]
    tables += [selection_bias_table(cells), findings_table(cells), early_warning_table(cells), noise_table(cells),
               detector_table(cells),
               alert_actions_table(cells, functools.partial(twin_ran_on, sweep, cells)),
               *calibration_tables(sweep, data.plan, cells, data.rows)]
    sweep.root.mkdir(parents=True, exist_ok=True)
    write_parquet(_parquet_ready(cells), sweep.cells_parquet)
    write_parquet(metrics_frame(data.columns), sweep.metrics_parquet)
    for table in tables:
        write_table(sweep, table)
    # With variants, the learning curves and Figures 2-6 are the first variant's (its seeds'
    # means would otherwise mix interventions); the early warning draws every variant.
    reference = variant_slices(cells)[0][1]
    jobs = figure_jobs(sweep, reference, data.columns) + paper_figure_jobs(sweep, reference, data.columns)
    jobs += early_warning_jobs(sweep, cells, data.columns)
    figures = render(jobs, _workers(len(cells)))
    # Why no figure, when none: no metrics at all, or none of these cells is what they draw.
    has_metrics = any(columns.splits for columns in data.columns.values())
    no_figures = ("none of Figures 2-6 applies to these cells (they draw multi-agent train cells)"
                  if has_metrics else "no cell has metrics yet")
    write_report(sweep, data.plan, cells, tables, figures, no_figures)

    from rich.markdown import Markdown

    console.print(Markdown(tables[0].markdown()))
    for damage in cells["damage"].dropna():
        console.print(f"[red]damaged:[/] {damage}", highlight=False)
    for damage in cells["records_damage"].dropna() if "records_damage" in cells else ():
        console.print(f"[yellow]unpaired:[/] {damage}", highlight=False)
    unpaired = cells[cells["val_paired"].eq(False) & cells["peak_drop_pp"].notna()] if "val_paired" in cells else cells.iloc[0:0]
    if len(unpaired):
        console.print(f"{len(unpaired)} cell(s) kept no per-problem validation records (trained before them): their "
                      "falls are tested unpaired, from each validation's standard error (the noise_floor table)",
                      highlight=False)
    counts = cells["state"].value_counts().to_dict()
    console.print(
        f"{len(cells)} cells ({', '.join(f'{n} {s}' for s, n in counts.items())}) -> "
        f"{sweep.cells_parquet}, metrics.parquet, tables 1-6 and findings (md, csv, tex), "
        + (f"{sweep.figures_dir}/ ({len(figures)} figures)" if figures else f"no figures ({no_figures})")
    )
    if export_to is not None:
        export_peaks(sweep, data, export_to, console)
    console.print(f"report: {sweep.report('html')}")
    return tables
