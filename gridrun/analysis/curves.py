"""`gridrun collect`'s learning curves: two PNGs per (task, scale) of the sweep, under figures/.

val_acc-<task>-<scale>.png     validation accuracy (%) vs step, one panel per workflow: its IP
                               and SP cells, the SA-RL cell, and the workflow's base control
                               (a dashed line): how far training moves each from the base.
grad_share-<task>-<scale>.png  role-level gradient dynamics: each role's share of the update's
                               gradient mass (`role/<role>/grad_share`, train rows) vs step,
                               one panel per train cell (rows: workflows, columns: policies).

With several seeds each seed is drawn thin and their mean, over the steps all of them have
reached, bold: a lagging seed shortens the mean rather than making it jump. A failed or
cancelled cell is drawn thin and dotted and kept out of the mean (as Table 1 keeps it out of
its numbers), or one that died at step 0 would cut the mean to a point. Cells without
metrics are skipped; a figure with nothing to draw is not written (and an older one of that
name is removed). Drawing and rendering: gridrun/analysis/plotting.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gridrun.analysis.plotting import (
    OKABE_ITO,
    SERIES_COLORS,
    Job,
    Series,
    legend,
    new_figure,
    thin_runs,
    to_png,
)
from gridrun.analysis.summary import MetricColumns
from gridrun.analysis.tables import POLICY_LABELS, ordered_workflows
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.metric_keys import role_key
from gridrun.seam.registry import single_agent_workflow

# The paper's order; a policy it does not name comes after, alphabetically.
POLICY_ORDER = ("isolated", "shared")
# States whose curves will not grow any more (preempted cells resume, so they still count).
STOPPED = ("failed", "cancelled")


@dataclass
class Curves:
    """What the figures plot of one cell's metrics.jsonl."""

    val_acc: Series = field(default_factory=dict)  # percent
    grad_share: dict[str, Series] = field(default_factory=dict)  # role -> share


def read_curves(columns: MetricColumns) -> Curves:
    curves = Curves(val_acc={s: 100 * v for s, v in columns.series("val", "val/acc").items()})
    for role in columns.roles():
        share = columns.series("train", role_key(role, "grad_share"))
        if share:
            curves.grad_share[role] = share
    return curves


@dataclass
class Line:
    """One series over its cells (seeds); a cell without metrics gives an empty Series."""

    label: str
    color: str
    seeds: list[Series]  # averaged
    stopped: list[Series]  # failed or cancelled: shown, not averaged


def _line(label: str, color: str, cells: list[dict[str, Any]], series: Callable[[dict[str, Any]], Series]) -> Line:
    return Line(
        label,
        color,
        [series(r) for r in cells if r["state"] not in STOPPED],
        [series(r) for r in cells if r["state"] in STOPPED],
    )


@dataclass
class Panel:
    title: str
    lines: list[Line]
    baseline: float | None = None  # the base control, drawn dashed

    def has_data(self) -> bool:
        return self.baseline is not None or any(run for line in self.lines for run in line.seeds + line.stopped)


Grid = list[list[Panel | None]]  # rows of panels; None leaves a position empty


# --- what to draw ------------------------------------------------------------------------------
def _workflows(block: list[dict[str, Any]]) -> list[str]:
    return ordered_workflows(r["workflow"] for r in block if r["kind"] in ("train", "base") and r["workflow"] != single_agent_workflow())


def _policies(train: list[dict[str, Any]]) -> list[str]:
    present = {r["policy"] for r in train}
    return [p for p in POLICY_ORDER if p in present] + sorted(present - set(POLICY_ORDER))


def _policy_label(policy: str) -> str:
    return POLICY_LABELS.get(policy, policy)


def val_acc_grid(block: list[dict[str, Any]], curves: Callable[[str], Curves]) -> Grid:
    """One row: a panel per workflow with its IP, SP, the SA-RL cells and its base control."""
    train = [r for r in block if r["kind"] == "train"]
    sa_rl = [r for r in block if r["kind"] == "sa_rl"]
    base_acc = {r["workflow"]: r["val_acc_step0"] for r in block if r["kind"] == "base"}
    panels: list[Panel | None] = []

    def val_acc(row: dict[str, Any]) -> Series:
        return curves(row["cell"]).val_acc

    for workflow in _workflows(block):
        lines = []
        for index, policy in enumerate(_policies(train)):
            label = _policy_label(policy)
            cells = [r for r in train if r["workflow"] == workflow and r["policy"] == policy]
            color = SERIES_COLORS.get(label, OKABE_ITO[3 + index % 5])
            lines.append(_line(label, color, cells, val_acc))
        lines.append(_line("SA-RL", SERIES_COLORS["SA-RL"], sa_rl, val_acc))
        base = base_acc.get(workflow)
        panels.append(Panel(workflow, lines, 100 * float(base) if base is not None and pd.notna(base) else None))
    return [panels]


def grad_share_grid(block: list[dict[str, Any]], curves: Callable[[str], Curves]) -> Grid:
    """A row per workflow, a column per policy: each role's gradient share in that train cell."""
    train = [r for r in block if r["kind"] == "train"]
    policies = _policies(train)
    grid: Grid = []
    for workflow in _workflows(train):
        row: list[Panel | None] = []
        for policy in policies:
            cells = [r for r in train if r["workflow"] == workflow and r["policy"] == policy]
            if not cells:
                row.append(None)
                continue
            roles = list(dict.fromkeys(role for r in cells for role in curves(r["cell"]).grad_share))
            lines = [
                # (mypy cannot type a lambda with a default argument)
                _line(role, OKABE_ITO[i % len(OKABE_ITO)], cells, lambda r, role=role: curves(r["cell"]).grad_share.get(role, {}))  # type: ignore[misc]
                for i, role in enumerate(roles)
            ]
            row.append(Panel(f"{workflow} · {_policy_label(policy)}", lines))
        grid.append(row)
    return grid


# --- drawing -----------------------------------------------------------------------------------
def _plot_line(ax: Any, line: Line) -> bool:
    """Draw a series; whether there was anything to draw."""
    runs = [run for run in line.seeds if run]
    stopped = [run for run in line.stopped if run]

    def plot(run: Series, steps: list[int], **style: Any) -> None:
        # A marker keeps a lone point (step 0 only) visible; dense per-step curves go without.
        ax.plot(steps, [run[s] for s in steps], color=line.color, marker="." if len(steps) <= 40 else None, **style)

    if len(runs) == 1 and not stopped:
        plot(runs[0], sorted(runs[0]), linewidth=1.5, label=line.label)
        return True
    thin_runs(ax, runs, line.color, linewidth=0.8, alpha=0.35)
    for index, run in enumerate(stopped):
        label = f"{line.label} (failed/cancelled)" if index == 0 and not runs else None
        plot(run, sorted(run), linewidth=0.8, alpha=0.5, linestyle=":", label=label)
    if runs:
        common = sorted(set.intersection(*(set(run) for run in runs)))
        mean = {s: sum(run[s] for run in runs) / len(runs) for s in common}
        plot(mean, common, linewidth=2, label=f"{line.label} (mean of {len(runs)})" if len(runs) > 1 else line.label)
    return bool(runs or stopped)


def _draw(grid: Grid, title: str, ylabel: str, ylim: tuple[float, float] | None) -> bytes:
    from matplotlib.ticker import MaxNLocator

    nrows, ncols = len(grid), max(len(row) for row in grid)
    figure = new_figure(4.5 * ncols, 3.2 * nrows + 0.5)
    axes = figure.subplots(nrows, ncols, squeeze=False)
    for grid_row, axes_row in zip(grid, axes):
        for position, ax in enumerate(axes_row):
            panel = grid_row[position] if position < len(grid_row) else None
            if panel is None:
                ax.set_visible(False)
                continue
            drawn = [_plot_line(ax, line) for line in panel.lines]
            if panel.baseline is not None:
                ax.axhline(panel.baseline, color="black", linestyle="--", linewidth=1, label="base")
            if any(drawn) or panel.baseline is not None:
                legend(ax)
            else:
                ax.text(0.5, 0.5, "no metrics yet", ha="center", va="center", transform=ax.transAxes, color="grey")
            ax.set_title(panel.title)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, not 2.5
            ax.set_ylabel(ylabel)
            if ylim is not None:
                ax.set_ylim(*ylim)
            ax.grid(alpha=0.3)
    figure.suptitle(title)
    return to_png(figure)


def grid_png(grid: Grid, title: str, ylabel: str, ylim: tuple[float, float] | None = None) -> bytes | None:
    """The grid drawn, or None when no panel has anything to draw."""
    if not any(panel is not None and panel.has_data() for row in grid for panel in row):
        return None
    return _draw(grid, title, ylabel, ylim)


def figure_jobs(sweep: SweepDir, cells: pd.DataFrame, columns: dict[str, MetricColumns]) -> list[Job]:
    """The two figures of every (task, scale) in `cells` (collect's cell frame), drawn from
    each cell's metric columns when `render` runs them."""
    records = cells.to_dict("records")

    @functools.cache
    def curves(cell_id: str) -> Curves:
        return read_curves(columns.get(cell_id, MetricColumns()))

    jobs: list[Job] = []
    for task, scale in dict.fromkeys((r["task"], r["scale"]) for r in records):
        block = [r for r in records if r["task"] == task and r["scale"] == scale]
        where = f"{task} · {scale} · sweep {sweep.name}"
        jobs.append((sweep.figure("val_acc", task, scale), functools.partial(
            lambda b, w: grid_png(val_acc_grid(b, curves), f"Validation accuracy — {w}", "validation accuracy (%)"),
            block, where)))
        jobs.append((sweep.figure("grad_share", task, scale), functools.partial(
            lambda b, w: grid_png(grad_share_grid(b, curves), f"Gradient share per role (train) — {w}", "gradient share",
                                  (-0.02, 1.02)),
            block, where)))
    return jobs
