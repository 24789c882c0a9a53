"""The paper's Figures 2-6 as PNGs under figures/, from collect's cells frame and metric columns.

    fig2_delta.png                  per-cell peak accuracy minus the base control (top) and
                                    minus SA-RL (bottom), per workflow, IP vs SP, a panel per
                                    (task, scale)
    fig3_ip_vs_sp.png               IP against SP peak accuracy on matched cells; marker =
                                    workflow, colour = task, size = scale; above the diagonal
                                    favours IP
    fig4_dynamics-<task>-<scale>.png  training success rate (top) and validation accuracy
                                    (bottom) per workflow, IP vs SP
    fig5_amplitude.png              max chi2, max adapter grad norm and entropy collapse depth
                                    per matched cell, IP vs SP
    fig6-<cell>.png                 one cell's per-role chi2, perplexity, grad norm and entropy
                                    normalised to their first value, and its validation accuracy
                                    over its other-policy twin's (`gridrun plot <cell>`; collect
                                    draws it for the most telling cell, see `fig6_cell`)

Several seeds: every seed thin, their mean bold with a 95% t band (curves) or error bars
(points); only `done` cells enter means of final statistics, as in the tables, while curves
show every cell's metrics so far. Colours are Okabe-Ito (colour-blind safe), and series
are told apart by marker or line style too. What this leaves out: interactive plots and
per-(task, scale) copies of Figures 2, 3 and 5 (one figure holds every block).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from gridrun.analysis.plotting import (
    OKABE_ITO,
    SERIES_COLORS,
    Job,
    legend,
    new_figure,
    save_png,
    thin_runs,
    to_png,
)
from gridrun.analysis.stats import mean_ci95, t95
from gridrun.analysis.summary import MetricColumns
from gridrun.analysis.tables import POLICY_LABELS, ordered_workflows
from gridrun.grid.errors import GridError
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.cellstate import CellState
from gridrun.seam.metric_keys import role_key
from gridrun.seam.rundir import RunDir

POLICY_MARKER = {"IP": "o", "SP": "s"}
WORKFLOW_MARKER = {"eval_opt": "o", "voting": "s", "orch_workers": "^"}
WORKFLOW_CODE = {"eval_opt": "E", "voting": "V", "orch_workers": "O"}
DIAGNOSTICS = (("chi2", "χ²"), ("ppl", "perplexity"), ("grad_norm", "grad norm"), ("entropy", "entropy"))


def _integer_steps(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, not 2.5
Series = dict[int, float]


def mean_band(runs: Sequence[Series]) -> tuple[list[int], list[float], list[float]]:
    """Steps every run reached, the mean there and the 95% t half-width (0 for one run)."""
    import numpy as np

    runs = [run for run in runs if run]
    if not runs:
        return [], [], []
    steps = sorted(set.intersection(*(set(run) for run in runs)))
    values = np.array([[run[s] for s in steps] for run in runs]).reshape(len(runs), len(steps))
    mean = values.mean(axis=0)
    if len(runs) < 2:
        return steps, mean.tolist(), [0.0] * len(steps)
    half = t95(len(runs) - 1) * values.std(axis=0, ddof=1) / math.sqrt(len(runs))
    return steps, mean.tolist(), half.tolist()


def _draw_runs(ax: Any, runs: Sequence[Series], color: str, label: str, linestyle: str = "-") -> bool:
    runs = [run for run in runs if run]
    if not runs:
        return False
    if len(runs) == 1:
        steps = sorted(runs[0])
        ax.plot(steps, [runs[0][s] for s in steps], color=color, linestyle=linestyle, linewidth=1.6, label=label,
                marker="." if len(steps) <= 40 else None)
        return True
    thin_runs(ax, runs, color, linestyle=linestyle, linewidth=0.6, alpha=0.35)
    steps, mean, half = mean_band(runs)
    ax.plot(steps, mean, color=color, linestyle=linestyle, linewidth=2, label=f"{label} (mean of {len(runs)}, 95% band)")
    ax.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], color=color, alpha=0.2)
    return True


def _done(frame: pd.DataFrame, column: str) -> list[float]:
    return [float(v) for v in frame.loc[(frame["state"] == CellState.DONE) & frame[column].notna(), column]]


def _blocks(cells: pd.DataFrame) -> list[tuple[str, str]]:
    train = cells[cells["kind"] == "train"]
    return list(dict.fromkeys(zip(train["task"], train["scale"])))


def _matched(cells: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(workflow, task, scale) with IP and SP train cells."""
    train = cells[cells["kind"] == "train"]
    keys = []
    for (workflow, task, scale), group in train.groupby(["workflow", "task", "scale"], sort=False):
        if {"isolated", "shared"} <= set(group["policy"]):
            keys.append((workflow, task, scale))
    rank = {w: i for i, w in enumerate(ordered_workflows(k[0] for k in keys))}
    return sorted(keys, key=lambda k: (k[1], k[2], rank[k[0]]))


def _point(ax: Any, x: float, values: list[float], color: str, marker: str, label: str | None) -> None:
    """Seeds as small dots, their mean with a 95% error bar."""
    if not values:
        return
    mean, ci = mean_ci95(values)
    if len(values) > 1:
        ax.scatter([x] * len(values), values, color=color, s=10, alpha=0.4, zorder=2)
    ax.errorbar([x], [mean], yerr=None if math.isnan(ci) else [[ci], [ci]], color=color, marker=marker,
                markersize=7, capsize=3, linestyle="none", label=label, zorder=3)


# --- Figure 2 -----------------------------------------------------------------------------------
def fig2(cells: pd.DataFrame, sweep_name: str) -> bytes | None:
    blocks = _blocks(cells)
    if not blocks or cells.loc[cells["kind"] == "train", "peak_val_acc"].notna().sum() == 0:
        return None
    figure = new_figure(max(6.0, 3.8 * len(blocks)), 6.6)
    axes = figure.subplots(2, len(blocks), squeeze=False)
    any_point = False
    for column, (task, scale) in enumerate(blocks):
        block = cells[(cells["task"] == task) & (cells["scale"] == scale)]
        train = block[block["kind"] == "train"]
        workflows = ordered_workflows(train["workflow"])
        sa_rl = _done(block[block["kind"] == "sa_rl"], "peak_val_acc")
        sa_mean = sum(sa_rl) / len(sa_rl) if sa_rl else None
        for row, (reference, name) in enumerate((("base", "base control"), ("sa_rl", "SA-RL (mean)"))):
            ax = axes[row][column]
            labelled = set()
            for x, workflow in enumerate(workflows):
                if reference == "base":
                    base = _done(block[(block["kind"] == "base") & (block["workflow"] == workflow)], "final_val_acc")
                    ref = base[0] if base else None
                else:
                    ref = sa_mean
                for offset, policy in ((-0.15, "isolated"), (0.15, "shared")):
                    label = POLICY_LABELS[policy]
                    peaks = _done(train[(train["workflow"] == workflow) & (train["policy"] == policy)], "peak_val_acc")
                    if ref is None or not peaks:
                        continue
                    _point(ax, x + offset, [100 * (p - ref) for p in peaks], SERIES_COLORS[label], POLICY_MARKER[label],
                           None if label in labelled else label)
                    labelled.add(label)
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_xticks(range(len(workflows)), workflows)
            ax.set_xlim(-0.6, len(workflows) - 0.4)
            ax.set_ylabel(f"peak acc − {name} (pp)")
            ax.set_title(f"{task} · {scale}")
            ax.grid(axis="y", alpha=0.3)
            any_point |= bool(labelled)
            if labelled:
                legend(ax)
            else:
                ax.text(0.5, 0.5, f"no finished {name}", ha="center", va="center", transform=ax.transAxes, color="grey")
    if not any_point:
        return None  # nothing to compare against yet
    figure.suptitle(f"Fig. 2 — peak validation accuracy vs base and vs SA-RL\nsweep {sweep_name}; seeds as dots, mean ± 95% CI")
    return to_png(figure)


# --- Figure 3 -----------------------------------------------------------------------------------
def fig3(cells: pd.DataFrame, sweep_name: str) -> bytes | None:
    points = []
    for workflow, task, scale in _matched(cells):
        group = cells[(cells["kind"] == "train") & (cells["workflow"] == workflow) & (cells["task"] == task)
                      & (cells["scale"] == scale)]
        ip = [100 * v for v in _done(group[group["policy"] == "isolated"], "peak_val_acc")]
        sp = [100 * v for v in _done(group[group["policy"] == "shared"], "peak_val_acc")]
        if ip and sp:
            points.append((workflow, task, scale, mean_ci95(sp), mean_ci95(ip)))
    if not points:
        return None
    tasks = list(dict.fromkeys(p[1] for p in points))
    scales = list(dict.fromkeys(cells.loc[cells["kind"] == "train", "scale"]))
    task_color = {t: OKABE_ITO[(i + 4) % len(OKABE_ITO)] for i, t in enumerate(tasks)}
    scale_size = {s: 40 + 60 * i for i, s in enumerate(scales)}
    figure = new_figure(6.4, 5.6)
    ax = figure.subplots()
    for workflow, task, scale, (sp_mean, sp_ci), (ip_mean, ip_ci) in points:
        ax.errorbar([sp_mean], [ip_mean], xerr=None if math.isnan(sp_ci) else [[sp_ci], [sp_ci]],
                    yerr=None if math.isnan(ip_ci) else [[ip_ci], [ip_ci]], color="grey", linewidth=0.8, zorder=1)
        ax.scatter([sp_mean], [ip_mean], marker=WORKFLOW_MARKER.get(workflow, "D"), s=scale_size[scale], color=task_color[task],
                   edgecolor="black", linewidth=0.8, zorder=2)
    values = [v for p in points for v in (p[3][0], p[4][0])]
    low, high = min(values) - 5, max(values) + 5
    ax.plot([low, high], [low, high], color="black", linestyle="--", linewidth=0.8)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_aspect("equal")
    ax.set_xlabel("SP peak validation accuracy (%)")
    ax.set_ylabel("IP peak validation accuracy (%)")
    ax.text(0.03, 0.97, "above the diagonal: IP higher", transform=ax.transAxes, va="top", fontsize="small")
    handles = [ax.scatter([], [], marker=WORKFLOW_MARKER.get(w, "D"), color="white", edgecolor="black", label=w)
               for w in ordered_workflows(p[0] for p in points)]
    handles += [ax.scatter([], [], marker="o", color=task_color[t], label=f"task {t}") for t in tasks]
    handles += [ax.scatter([], [], marker="o", color="lightgrey", edgecolor="black", s=scale_size[s], label=f"scale {s}")
                for s in scales]
    ax.legend(handles=handles, fontsize="small", loc="lower right")
    ax.grid(alpha=0.3)
    figure.suptitle(f"Fig. 3 — IP vs SP on matched cells — sweep {sweep_name}")
    return to_png(figure)


# --- Figure 4 -----------------------------------------------------------------------------------
def fig4(cells: pd.DataFrame, columns: dict[str, MetricColumns], task: str, scale: str, sweep_name: str) -> bytes | None:
    train = cells[(cells["kind"] == "train") & (cells["task"] == task) & (cells["scale"] == scale)]
    workflows = ordered_workflows(train["workflow"])
    if not workflows:
        return None
    figure = new_figure(4.2 * len(workflows), 6.4)
    axes = figure.subplots(2, len(workflows), squeeze=False)
    drawn = False
    for column, workflow in enumerate(workflows):
        for row, (split, metric, ylabel) in enumerate((("train", "reward/acc", "training success rate (%)"),
                                                       ("val", "val/acc", "validation accuracy (%)"))):
            ax = axes[row][column]
            for policy, linestyle in (("isolated", "-"), ("shared", "--")):
                label = POLICY_LABELS[policy]
                ids = train.loc[(train["workflow"] == workflow) & (train["policy"] == policy), "cell"]
                runs = [{s: 100 * v for s, v in columns[c].series(split, metric).items()} for c in ids if c in columns]
                drawn |= _draw_runs(ax, runs, SERIES_COLORS[label], label, linestyle)
            ax.set_title(workflow)
            ax.set_xlabel("step")
            _integer_steps(ax)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                legend(ax)
    if not drawn:
        return None
    figure.suptitle(f"Fig. 4 — training success rate and validation accuracy, IP vs SP — {task} · {scale} · sweep {sweep_name}")
    return to_png(figure)


# --- Figure 5 -----------------------------------------------------------------------------------
AMPLITUDES = (("max_chi2", "max χ²"), ("max_grad_norm", "max adapter\ngrad norm"),
              ("entropy_collapse", "entropy collapse\n(first − min)"))


def fig5(cells: pd.DataFrame, sweep_name: str) -> bytes | None:
    matched = _matched(cells)
    train = cells[cells["kind"] == "train"]
    if not matched or not any(_done(train, name) for name, _ in AMPLITUDES):
        return None
    figure = new_figure(max(6.0, 1.0 * len(matched) + 2.5), 8.4)
    axes = figure.subplots(3, 1, squeeze=False)[:, 0]
    labels = [f"{WORKFLOW_CODE.get(w, w)}·{s}·{t}" for w, t, s in matched]
    for ax, (name, title) in zip(axes, AMPLITUDES):
        labelled = set()
        for x, (workflow, task, scale) in enumerate(matched):
            group = train[(train["workflow"] == workflow) & (train["task"] == task) & (train["scale"] == scale)]
            for offset, policy in ((-0.15, "isolated"), (0.15, "shared")):
                label = POLICY_LABELS[policy]
                values = _done(group[group["policy"] == policy], name)
                _point(ax, x + offset, values, SERIES_COLORS[label], POLICY_MARKER[label],
                       None if label in labelled or not values else label)
                if values:
                    labelled.add(label)
        ax.set_xticks(range(len(matched)), labels, rotation=30 if len(matched) > 8 else 0)
        ax.set_xlim(-0.6, len(matched) - 0.4)
        ax.set_ylabel(title)
        ax.grid(axis="y", alpha=0.3)
        if labelled:
            legend(ax)
    axes[-1].set_xlabel("matched cell (E = Eval-Opt, V = Voting, O = Orch-Workers · scale · task)")
    figure.suptitle(f"Fig. 5 — training-side instability amplitude, IP vs SP — sweep {sweep_name}")
    return to_png(figure)


# --- Figure 6 -----------------------------------------------------------------------------------
def twin(cells: pd.DataFrame, cell: str) -> str | None:
    """The same train cell under the other policy (same workflow, task, scale, seed and variant)."""
    row = cells.set_index("cell").loc[cell]
    if row["kind"] != "train":
        return None
    match = cells[(cells["kind"] == "train") & (cells["workflow"] == row["workflow"]) & (cells["task"] == row["task"])
                  & (cells["scale"] == row["scale"]) & (cells["seed"] == row["seed"]) & (cells["policy"] != row["policy"])]
    if "variant" in cells:
        match = match[match["variant"].isna() if pd.isna(row["variant"]) else match["variant"] == row["variant"]]
    return str(match["cell"].iloc[0]) if len(match) else None


def fig6_cell(cells: pd.DataFrame) -> str | None:
    """The cell the report draws Fig. 6 for: the first flagged train cell, else the train cell
    with the deepest cliff, else the first train cell with validation rows."""
    train = cells[(cells["kind"] == "train") & cells["peak_val_acc"].notna()]
    if not len(train):
        return None
    flagged = train[train["flags"] != ""]
    if len(flagged):
        return str(flagged["cell"].iloc[0])
    cliffs = train[train["cliff_drop"].notna() & (train["cliff_drop"] < 0)]
    if len(cliffs):
        return str(cliffs.sort_values("cliff_drop", kind="stable")["cell"].iloc[0])
    return str(train["cell"].iloc[0])


def fig6(cells: pd.DataFrame, columns: dict[str, MetricColumns], cell: str) -> bytes:
    metrics = columns.get(cell, MetricColumns())
    roles = metrics.roles()
    figure = new_figure(13.0, 6.8)
    axes = figure.subplots(2, 3).ravel()
    for ax, (metric, name) in zip(axes, DIAGNOSTICS):
        raw = []
        for index, role in enumerate(roles):
            series = metrics.series("train", role_key(role, metric))
            if not series:
                continue
            steps = sorted(series)
            first = series[steps[0]]
            if first > 0:
                values, label = [series[s] / first for s in steps], role
            else:  # a ratio to zero or a negative start says nothing: drawn as logged
                values, label = [series[s] for s in steps], f"{role} (raw: first ≤ 0)"
                raw.append(role)
            ax.plot(steps, values, color=OKABE_ITO[index % len(OKABE_ITO)], linestyle=("-", "--", ":", "-.")[index % 4],
                    linewidth=1.5, label=label)
        ax.axhline(1.0, color="black", linewidth=0.6, alpha=0.5)
        ax.set_title(f"{name} / first value")
        ax.set_xlabel("step")
        _integer_steps(ax)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            legend(ax)
        else:
            ax.text(0.5, 0.5, f"no {name} logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    overlay = axes[4]
    other = twin(cells, cell)
    policy = {c: POLICY_LABELS.get(p, str(p)) for c, p in zip(cells["cell"], cells["policy"])}
    for index, (run, linestyle) in enumerate(((cell, "-"), (other, "--"))):
        if run is None or run not in columns:
            continue
        series = {s: 100 * v for s, v in columns[run].series("val", "val/acc").items()}
        label = policy.get(run, "")
        _draw_runs(overlay, [series], SERIES_COLORS.get(label, OKABE_ITO[index]), f"{label}: {run}", linestyle)
    overlay.set_title("validation accuracy, IP vs SP" if other else "validation accuracy (no other-policy twin)")
    overlay.set_xlabel("step")
    _integer_steps(overlay)
    overlay.set_ylabel("validation accuracy (%)")
    overlay.grid(alpha=0.3)
    if overlay.get_legend_handles_labels()[0]:
        legend(overlay)
    share = axes[5]
    for index, role in enumerate(roles):
        series = metrics.series("train", role_key(role, "grad_share"))
        steps = sorted(series)
        share.plot(steps, [series[s] for s in steps], color=OKABE_ITO[index % len(OKABE_ITO)],
                   linestyle=("-", "--", ":", "-.")[index % 4], linewidth=1.5, label=role)
    share.set_title("gradient share per role (not normalised)")
    share.set_xlabel("step")
    share.set_ylim(-0.02, 1.02)
    share.grid(alpha=0.3)
    _integer_steps(share)
    if share.get_legend_handles_labels()[0]:
        legend(share)
    figure.suptitle(f"Fig. 6 — per-role diagnostics normalised to their first value — {cell}")
    return to_png(figure)


def write_fig6(sweep: SweepDir, cells: pd.DataFrame, columns: dict[str, MetricColumns], cell: str) -> Path:
    path = sweep.figure("fig6", cell)
    save_png(path, fig6(cells, columns, cell))
    return path


def paper_figure_jobs(sweep: SweepDir, cells: pd.DataFrame, columns: dict[str, MetricColumns]) -> list[Job]:
    """Figures 2-6 as `render` jobs; Fig. 6 for `fig6_cell`'s choice."""
    jobs: list[Job] = [
        (sweep.figure("fig2_delta"), functools.partial(fig2, cells, sweep.name)),
        (sweep.figure("fig3_ip_vs_sp"), functools.partial(fig3, cells, sweep.name)),
    ]
    jobs += [(sweep.figure("fig4_dynamics", task, scale), functools.partial(fig4, cells, columns, task, scale, sweep.name))
             for task, scale in _blocks(cells)]
    jobs.append((sweep.figure("fig5_amplitude"), functools.partial(fig5, cells, sweep.name)))
    chosen = fig6_cell(cells)
    if chosen is not None:
        jobs.append((sweep.figure("fig6", chosen), functools.partial(fig6, cells, columns, chosen)))
    return jobs


def plot_cell(run_dir: RunDir) -> Path:
    """`gridrun plot <cell>`: Fig. 6 for one cell of a planned sweep (and its other-policy
    twin's validation curve), from the run dirs as they are now; the path written."""
    cells_dir = run_dir.root.parent
    sweep = SweepDir(cells_dir.parent.parent, cells_dir.parent.name)
    plan = sweep.read().cells
    cells = pd.DataFrame([{"cell": c.id, "kind": c.kind, **c.coords} for c in plan])
    cell = run_dir.root.name
    if cell not in set(cells["cell"]):
        raise GridError(f"{run_dir.root} is not a cell of sweep '{sweep.name}': pass a planned cell's id or directory")
    other = twin(cells, cell)
    columns = {c: MetricColumns.from_rows(sweep.cell(c).read_metrics()) for c in (cell, other) if c is not None}
    if not columns[cell].splits:
        raise GridError(f"cell '{cell}' has no metrics yet: plot it once it has run a step (`gridrun status`)")
    return write_fig6(sweep, cells, columns, cell)
