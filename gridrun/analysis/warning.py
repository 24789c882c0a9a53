"""The cliff early warning: did an alert fire validations before a cell's accuracy fell?

Per cell (cells.parquet's columns, from its validation accuracy and the alerts replayed on
its rows, gridrun/seam/mechanisms.py):

    val_acc_se_pp         a validation's own noise: the mean standard error of its validations
                          (`val/acc_se`, over problems and samples), in points
    fall_se_pp            the noise of a fall: the mean standard error of the difference of
                          consecutive validations, paired by problem where both have records
                          (gridrun/seam/records.py), else as independent draws
    noise_floor_pp        the smallest true fall the cliff rule finds with 80% power at that
                          noise (and at least CLIFF_PP)
    val_paired            whether every validation has its per-problem record (False: an
                          older run, judged unpaired)
    peak_drop_pp          the largest drop of validation accuracy below its running peak (the
                          best so far), in points (0.0 when it never fell)
    peak_drop_se_pp       that drop's standard error, in points
    peak_drop_cliff       whether the run has a cliff: a fall of at least CLIFF_PP points
                          between two validations whose z clears the one-sided Bonferroni
                          bound over all pairs of its planned validations (FallRule,
                          gridrun/seam/significance.py: a flat run is called a cliff at most
                          5% of the time); points alone for rows with neither records nor
                          `val/acc_se`
    cliff_z, cliff_z_needed, cliff_test
                          the strongest such fall's z, the rule's bound, and the test in words
    peak_drop_step        the validation where that drop is reached
    peak_drop_peak_step   the running peak it is measured from (the first step reaching it)
    peak_drop_onset_step  where the fall shows: the validation after the last one still at the
                          peak before the drop's lowest point: within ONSET_PP points of it or
                          within k standard errors of the difference (k: `cliff_se`; the
                          first one below the peak would be a validation's noise, often the
                          very next validation, and no alert could lead it)
    alert/<a>/lead        validations before the onset at which alert <a> first fired: the
                          count of validations after its first firing up to and including the
                          onset (2: it fired before the last two validations ahead of the
                          fall; 0: in the onset's step; negative: after it). None without a
                          cliff or a firing.

Per cell, `noise_table` (noise_floor): the validation SE, the noise floor, the largest fall in
points and in its standard errors; `alert_actions_table` (alert_actions): where train.on_alert
acted, the steps a stop saved and the peak kept against the would-be end.

Per alert (`early_warning_table`): among the training cells it applies to (train, sa_rl and
shuffled cells, done), recall = cliff cells (a drop of at least CLIFF_PP points) warned at
least LEAD_VALIDATIONS validations ahead / cliff cells (`peak_drop_cliff`); false-alarm rate =
cells without such a cliff (shuffled twins included) where it fired at all / those cells. The report's "Early
warning" figure draws each cell's validation curve with its alerts' first firings and its
cliff marked. What this leaves out: choosing thresholds (the alerts' `Thresholds` are
replayable: collect with others to compare).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gridrun.analysis.plotting import OKABE_ITO, legend, new_figure, to_png
from gridrun.analysis.summary import MetricColumns
from gridrun.analysis.tables import POLICY_LABELS, Table, number
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.accuracy import first_peak
from gridrun.seam.cellstate import CellState
from gridrun.seam.mechanisms import ALERTS
from gridrun.seam.records import ValidationRecord
from gridrun.seam.runconfig import TRAINED_KINDS
from gridrun.seam.significance import CLIFF_PP, Evaluations, Fall, FallRule, first_cliff, largest_fall

# A validation within this many points of the peak is still at it (a 200 x 4 validation's
# noise is ~2-3 points): the fall starts after the last such one...
ONSET_PP = 5.0
# ...or within this many standard errors of the difference (a sweep file's
# early_warning.cliff_se replaces it; whether a fall is a cliff is FallRule's to say).
CLIFF_SE = 2.0
# Warned in time: the alert fired at least this many validations before the fall showed.
LEAD_VALIDATIONS = 2


@dataclass(frozen=True)
class PeakDrop:
    """A series' largest drop below its running peak (the early warning's target; the cliff,
    summary.cliff, is the largest drop between consecutive validations), and the fall the
    cliff rule judges (`fall`: the pair of validations with the strongest evidence)."""

    drop_pp: float
    step: int | None = None
    peak_step: int | None = None
    onset_step: int | None = None
    # The drop's standard error in points (None: no records and no val/acc_se in the rows).
    se_pp: float | None = None
    fall: Fall | None = None

    @property
    def cliff(self) -> bool:
        """A fall of CLIFF_PP+ points that clears the rule (significance.FallRule)."""
        return self.fall is not None and self.fall.cliff


def peak_drop(val_acc: Mapping[int, float], val_se: Mapping[int, float] | None = None, k: float = CLIFF_SE,
              records: Mapping[int, ValidationRecord] | None = None, validations: int | None = None) -> PeakDrop | None:
    """The largest drop below the running peak of a step -> accuracy (0-1) series, with its
    standard error (paired by problem where `records` has both ends, else from `val_se`), and
    the fall judged by the cliff rule over the run's `validations` (planned; default: those
    it has); None without validations. Ties keep the earlier step (of the peak and of the drop)."""
    if not val_acc:
        return None
    return _peak_drop(Evaluations.of(val_acc, val_se, records), FallRule(max(validations or 0, len(val_acc))), k)


def _peak_drop(evals: Evaluations, rule: FallRule, k: float) -> PeakDrop:
    """peak_drop of evaluations that hold at least one. Without a pair the rule judges (none
    falls its points), the fall reported is the largest drop itself, with its test."""
    steps = sorted(evals.acc)
    best, paired = PeakDrop(0.0), evals.paired
    peak = steps[0]
    for step in steps:
        if evals.acc[step] > evals.acc[peak]:
            peak = step
        drop = 100 * (evals.acc[peak] - evals.acc[step])
        if drop > best.drop_pp:
            near = [s for s in steps if peak <= s < step and _at_peak(evals, k, peak, s)]
            onset = next(s for s in steps if s > near[-1])
            diff = evals.difference(peak, step)
            best = PeakDrop(drop, step, peak, onset, None if diff is None else 100 * diff.se)
            paired = diff is not None and diff.paired
    fall = largest_fall(evals, rule) or Fall(best.drop_pp, best.peak_step, best.step, best.se_pp, paired, rule)
    return dataclasses.replace(best, fall=fall)


def _at_peak(evals: Evaluations, k: float, peak: int, step: int) -> bool:
    """Whether validation `step` is still at the peak: within ONSET_PP points, or within k
    standard errors of the difference."""
    fall = 100 * (evals.acc[peak] - evals.acc[step])
    diff = evals.difference(peak, step)
    return fall <= ONSET_PP + 1e-9 or (diff is not None and fall < k * 100 * diff.se)


def detector_columns(evals: Evaluations, rule: FallRule) -> dict[str, Any]:
    """Where train.fall_alert with on_alert=stop would have ended the run (replayed on its
    validations: a stopped run is its full run's prefix, since validating leaves training's
    RNG alone), whether the peak so far is the full run's (Table 1's peak kept), and the
    accuracy it would have ended at (Table 1's final column, had it stopped)."""
    found = first_cliff(evals, rule)
    if found is None:
        return {"detector_step": None, "detector_peak_kept": None, "detector_final_acc": None}
    step = found[0]
    before = {s: a for s, a in evals.acc.items() if s <= step}
    return {"detector_step": step, "detector_peak_kept": first_peak(before) == first_peak(evals.acc),
            "detector_final_acc": evals.acc[step]}


def noise(evals: Evaluations, rule: FallRule) -> tuple[float | None, float | None]:
    """(the typical SE of a fall between two validations, the noise floor), in points: the SE
    is the mean over consecutive validations (paired by problem where both have records), the
    floor the smallest true fall the rule finds at 80% power; (None, None) without SEs."""
    steps = sorted(evals.acc)
    ses = [d.se for a, b in itertools.pairwise(steps) if (d := evals.difference(a, b)) is not None]
    if not ses:
        return None, None
    se_pp = 100 * sum(ses) / len(ses)
    return se_pp, rule.detectable_pp(se_pp)


def lead(val_steps: Sequence[int], onset: int | None, fired: int | None) -> int | None:
    """Validations after `fired` up to and including `onset` (negative: validations after the
    onset up to and including `fired`); None without either."""
    if onset is None or fired is None:
        return None
    if fired < onset:
        return sum(fired < s <= onset for s in val_steps)
    return -sum(onset < s <= fired for s in val_steps)


def warning_columns(val_acc: Mapping[int, float], summary: Mapping[str, Any], val_se: Mapping[int, float] | None = None,
                    k: float = CLIFF_SE, records: Mapping[int, ValidationRecord] | None = None,
                    validations: int | None = None) -> dict[str, Any]:
    """A cell's noise, its drop below its running peak, its cliff test and each alert's lead
    (the module docstring); `summary` holds the replayed alerts' `alert/<a>/first_step`,
    `val_se` the validations' val/acc_se, `records` their per-problem records, `validations`
    the run's planned count."""
    evals = Evaluations.of(val_acc, val_se, records)
    rule = FallRule(max(validations or 0, len(val_acc)))
    drop = _peak_drop(evals, rule, k) if val_acc else None
    fall = None if drop is None else drop.fall
    mean_se = 100 * sum(evals.se.values()) / len(evals.se) if evals.se else None
    fall_se, floor = noise(evals, rule)
    out: dict[str, Any] = {
        "val_acc_se_pp": mean_se,
        "fall_se_pp": fall_se,
        "noise_floor_pp": floor,
        "val_paired": evals.paired,
        "peak_drop_pp": None if drop is None else drop.drop_pp,
        "peak_drop_se_pp": None if drop is None else drop.se_pp,
        "peak_drop_cliff": None if drop is None else drop.cliff,
        "cliff_z": None if fall is None else fall.z,
        "cliff_z_needed": None if fall is None else rule.z,
        "cliff_test": None if fall is None else fall.test(),
        **detector_columns(evals, rule),
        "peak_drop_step": None if drop is None else drop.step,
        "peak_drop_peak_step": None if drop is None else drop.peak_step,
        "peak_drop_onset_step": None if drop is None else drop.onset_step,
    }
    steps = sorted(val_acc)
    for alert in ALERTS:
        out[f"alert/{alert}/lead"] = lead(steps, None if drop is None else drop.onset_step,
                                          summary.get(f"alert/{alert}/first_step"))
    return out


def alert_counts(cells: pd.DataFrame, alert: str) -> dict[str, int]:
    """Recall's and false alarms' counts of `alert` over cells.parquet-shaped rows: the one
    definition of a warned cliff and a false alarm (the calibration scores candidates with it)."""
    steps = f"alert/{alert}/steps"
    if steps not in cells:
        return {"cells": 0, "cliffs": 0, "warned": 0, "calm": 0, "calm_shuffled": 0, "false": 0}
    eligible = cells[cells["kind"].isin(TRAINED_KINDS) & (cells["state"] == CellState.DONE) & cells[steps].notna()
                     & cells["peak_drop_pp"].notna()]
    # A frame from before the noise-scaled cliff (no peak_drop_cliff): points alone.
    cliff = (eligible["peak_drop_cliff"].astype(bool) if "peak_drop_cliff" in eligible
             else eligible["peak_drop_pp"] >= CLIFF_PP)
    leads = eligible[f"alert/{alert}/lead"]
    fired = eligible[f"alert/{alert}/first_step"].notna()
    calm = eligible[~cliff]
    return {
        "cells": len(eligible),
        "cliffs": int(cliff.sum()),
        "warned": int((cliff & leads.notna() & (leads.fillna(-1) >= LEAD_VALIDATIONS)).sum()),
        "calm": int((~cliff).sum()),
        "calm_shuffled": int((calm["kind"] == "shuffled").sum()),
        "false": int((~cliff & fired).sum()),
    }


def _rate(part: int, whole: int) -> str:
    return f"{part}/{whole} ({number(100 * part / whole, 0)}%)" if whole else "n/a"


def early_warning_table(cells: pd.DataFrame, name: str = "early_warning") -> Table:
    """Per alert: recall on cliff cells and false-alarm rate on the others."""
    columns = ["alert", "cells", "cliff_cells", "warned", "recall", "calm_cells", "calm_shuffled", "false_alarms",
               "false_alarm_rate"]
    rows, shown = [], []
    for alert in ALERTS:
        c = alert_counts(cells, alert)
        recall = c["warned"] / c["cliffs"] if c["cliffs"] else None
        false_rate = c["false"] / c["calm"] if c["calm"] else None
        rows.append([alert, str(c["cells"]), str(c["cliffs"]), str(c["warned"]), number(recall, 3),
                     str(c["calm"]), str(c["calm_shuffled"]), str(c["false"]), number(false_rate, 3)])
        shown.append([alert, str(c["cells"]), _rate(c["warned"], c["cliffs"]),
                      _rate(c["false"], c["calm"]) + (f", {c['calm_shuffled']} shuffled" if c["calm_shuffled"] else "")])
    return Table(
        name=name, title="Early warning — did the alert fire before the cliff?",
        caption=(f"Training cells (done) each alert applies to. A cliff: a fall of at least {CLIFF_PP:.0f} points "
                 "between two validations that clears the one-sided Bonferroni bound over the pairs of the run's "
                 "planned validations (cells.parquet's peak_drop_cliff; the noise_floor table gives each test). "
                 f"Recall: cliff cells whose alert first fired at least {LEAD_VALIDATIONS} "
                 "validations before the fall showed. False alarms: cells without such a cliff (shuffled-reward "
                 "twins included) where it fired at all. Thresholds: gridrun/seam/mechanisms.py's, provisional."),
        columns=columns, headers=["Alert", "Cells", "Recall (warned / cliffs)", "False alarms (fired / calm)"],
        rows=rows, shown=shown, left=1,
    )


# --- the figure ---------------------------------------------------------------------------------
MARKERS = {alert: marker for alert, marker in zip(ALERTS, ("^", "s", "D", "X", "v", "<", ">", "P", "*", "h"), strict=True)}


def _panels(records: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(title, cells) per workflow x policy of the trained cells, in the sweep's order."""
    keyed: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["kind"] not in TRAINED_KINDS:
            continue
        policy = POLICY_LABELS.get(record.get("policy") or "", "")
        title = " ".join(p for p in (record["workflow"], policy, "shuffled" if record["kind"] == "shuffled" else "") if p)
        keyed.setdefault(title, []).append(record)
    return list(keyed.items())


def early_warning_png(records: list[dict[str, Any]], accuracy: Callable[[str], dict[int, float]], title: str) -> bytes | None:
    """Validation accuracy (%) per cell, a panel per workflow x policy (colour: variant or
    seed), each alert's first firing marked on the curve and the cliff's bottom as a cross."""
    panels = [(t, cells) for t, cells in _panels(records) if any(accuracy(c["cell"]) for c in cells)]
    if not panels:
        return None
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    figure = new_figure(5.5 * ncols, 3.4 * nrows + 0.5)
    axes = figure.subplots(nrows, ncols, squeeze=False).flatten()
    for ax, (panel_title, cells) in zip(axes, panels):
        labels = list(dict.fromkeys(str(c.get("variant") or f"s{c.get('seed')}") for c in cells))
        colours = {label: OKABE_ITO[i % len(OKABE_ITO)] for i, label in enumerate(labels)}
        shown: set[str] = set()
        for cell in cells:
            series = accuracy(cell["cell"])
            if not series:
                continue
            steps = sorted(series)
            label = str(cell.get("variant") or f"s{cell.get('seed')}")
            ax.plot(steps, [100 * series[s] for s in steps], color=colours[label], linewidth=1,
                    label=label if label not in shown else None)
            shown.add(label)
            for alert, marker in MARKERS.items():
                fired = cell.get(f"alert/{alert}/first_step")
                if fired is not None and not pd.isna(fired):
                    # On the curve, between the validations around its step.
                    y = 100 * float(np.interp(fired, steps, [series[s] for s in steps]))
                    ax.scatter([fired], [y], marker=marker, color=colours[label], s=30, zorder=3)
            bottom = cell.get("peak_drop_step")
            cliff = cell.get("peak_drop_cliff")
            if bottom is not None and not pd.isna(bottom) and cliff is not None and not pd.isna(cliff) and bool(cliff):
                ax.scatter([bottom], [100 * series[int(bottom)]], marker="x", color="black", s=40, zorder=4)
        for alert, marker in MARKERS.items():
            ax.scatter([], [], marker=marker, color="grey", label=alert)
        ax.scatter([], [], marker="x", color="black", label=f"cliff >= {CLIFF_PP:.0f} pt")
        legend(ax, ncols=2)
        ax.set_title(panel_title)
        ax.set_xlabel("step")
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    figure.suptitle(title)
    return to_png(figure)


def early_warning_jobs(sweep: SweepDir, cells: pd.DataFrame, columns: dict[str, MetricColumns]) -> list[Any]:
    """The Early warning figure of every (task, scale), as `render` jobs."""
    records = cells.to_dict("records")

    def accuracy(cell: str) -> dict[int, float]:
        return columns.get(cell, MetricColumns()).series("val", "val/acc")

    jobs = []
    for task, scale in dict.fromkeys((r["task"], r["scale"]) for r in records):
        block = [r for r in records if r["task"] == task and r["scale"] == scale]
        jobs.append((sweep.figure("early_warning", task, scale), functools.partial(
            early_warning_png, block, accuracy, f"Early warning — {task} · {scale} · sweep {sweep.name}")))
    return jobs


# --- each cell's noise, and what acting alerts saved ---------------------------------------------
def noise_table(cells: pd.DataFrame) -> Table:
    """Per trained cell with validations: its noise, the fall the rule can find, and its
    strongest fall's test (is the fall told from noise, and by which test?)."""
    rows = []

    def value(r: dict[str, Any], key: str) -> Any:
        v = r.get(key)
        return None if v is None or (isinstance(v, float) and pd.isna(v)) else v

    if "val_acc_se_pp" in cells:
        trained = cells[cells["kind"].isin(TRAINED_KINDS) & cells["peak_drop_pp"].notna()]
        for r in trained.to_dict("records"):
            cliff, paired = value(r, "peak_drop_cliff"), value(r, "val_paired")
            rows.append([r["cell"], str(r["state"]), number(value(r, "val_acc_se_pp"), 2),
                         number(value(r, "fall_se_pp"), 2), number(value(r, "noise_floor_pp"), 1),
                         number(r["peak_drop_pp"], 1), number(value(r, "cliff_z"), 2),
                         number(value(r, "cliff_z_needed"), 2),
                         "" if paired is None else ("paired" if paired else "unpaired"),
                         "" if cliff is None else ("yes" if bool(cliff) else "no")])
    return Table(
        name="noise_floor", title="Noise — each cell's validation noise, the fall it can show, and its cliff test",
        caption=("Validation SE: the mean over the cell's validations of val/acc_se (problems and samples; samples "
                 "of one problem clustered). Fall SE: the mean standard error of the difference of consecutive "
                 "validations, paired by problem where the run kept per-problem records (unpaired: an older run, "
                 "whose validations are treated as independent, which overstates the noise). Detectable: the "
                 "smallest true fall the rule finds with 80% power at that noise. Largest fall: below the running "
                 f"peak, points. Cliff: a fall of {CLIFF_PP:.0f}+ points between two validations whose z clears the "
                 "one-sided Bonferroni bound over all pairs of the run's planned validations (z needed): a run "
                 "that never truly fell is called a cliff at most 5% of the time (docs/analysis.md)."),
        columns=["cell", "state", "val_acc_se_pp", "fall_se_pp", "noise_floor_pp", "peak_drop_pp", "cliff_z",
                 "cliff_z_needed", "pairing", "cliff"],
        headers=["Cell", "State", "Validation SE (pp)", "Fall SE (pp)", "Detectable fall (pp)", "Largest fall (pp)",
                 "Cliff z", "z needed", "Pairing", "Cliff"],
        rows=rows, left=2,
        notes=[] if rows else [("No cell has validations with a standard error (val/acc_se): cells trained before "
                               "it was recorded.")],
    )


def detector_table(cells: pd.DataFrame) -> Table:
    """Per trained done cell: where the collapse detector (train.fall_alert, on_alert=stop)
    would have stopped it, the steps that saves, whether the peak was kept, and Table 1's
    final column had it stopped; the totals in the notes."""
    rows = []
    saved = total = kept = stopped = 0
    final_lost: list[float] = []
    if "detector_step" in cells:
        done = cells[cells["kind"].isin(TRAINED_KINDS) & (cells["state"] == CellState.DONE) & cells["peak_drop_pp"].notna()]
        for r in done.to_dict("records"):
            steps = int(r["total_steps"]) if r.get("total_steps") is not None and not pd.isna(r["total_steps"]) else None
            at = r.get("detector_step")
            at = None if at is None or pd.isna(at) else int(at)
            if steps is not None:
                total += steps
            if at is None:
                rows.append([r["cell"], "" if steps is None else str(steps), "", "0", "", "", number(100 * r["final_val_acc"], 1)])
                continue
            stopped += 1
            kept += bool(r["detector_peak_kept"])
            if steps is not None:
                saved += steps - at
            final_lost.append(100 * (r["final_val_acc"] - r["detector_final_acc"]))
            rows.append([r["cell"], "" if steps is None else str(steps), str(at), "" if steps is None else str(steps - at),
                         "yes" if r["detector_peak_kept"] else "no", number(100 * r["detector_final_acc"], 1),
                         number(100 * r["final_val_acc"], 1)])
    notes = []
    if rows:
        notes.append(f"{stopped} of {len(rows)} cells would have stopped; {saved} of {total} training steps saved "
                     f"({number(100 * saved / total, 1) if total else 'n/a'}%); the peak kept in {kept} of {stopped}"
                     + (f"; Table 1's final column {number(sum(final_lost) / len(final_lost), 1, signed=True)} points "
                        "on average for the stopped cells (full run's final minus the final at the stop)"
                        if final_lost else "") + ".")
    return Table(
        name="detector", title="The collapse detector — where a stop would have ended each run, and what it saves",
        caption=("Replayed on each done training cell's validations (a stopped run is its full run's prefix): the "
                 "validation at which train.fall_alert finds a cliff (the cliff rule applied to the validations so "
                 "far), the training steps a stop there saves, whether the peak so far is the full run's (Table 1's "
                 "peak kept), and the accuracy at the stop against the full run's final."),
        columns=["cell", "total_steps", "stop_step", "steps_saved", "peak_kept", "final_at_stop", "final"],
        headers=["Cell", "Steps", "Stop at", "Steps saved", "Peak kept", "Final at stop (%)", "Final (%)"],
        rows=rows, left=1, notes=notes or ["No done training cell with validations."],
    )


def alert_actions_table(cells: pd.DataFrame, twin_of: Callable[[str], str | None]) -> Table:
    """Per cell whose train.on_alert acted (export_peak, stop): the steps its stop saved and
    the accuracy it kept (its peak at the alert) against the would-be end: its own final
    validation where it trained on (export_peak), else its twin's (`twin_of`: a cell alike
    but for train.on_alert that ran to the end)."""
    rows, shown = [], []
    acted = cells[cells["alert_step"].notna()] if "alert_step" in cells else cells.iloc[0:0]
    finals = dict(zip(cells["cell"], cells.get("final_val_acc", [None] * len(cells))))
    for r in acted.to_dict("records"):
        stopped = r["state"] == CellState.STOPPED
        total = r.get("total_steps")
        saved = int(total) - int(r["step"]) if stopped and total is not None and not pd.isna(total) else 0
        twin = twin_of(r["cell"]) if stopped else r["cell"]
        end = finals.get(twin) if twin else None
        kept = r.get("peak_val_acc")
        known = kept is not None and not pd.isna(kept) and end is not None and not pd.isna(end)
        diff = 100 * (kept - end) if known else None
        rows.append([r["cell"], str(r["on_alert"]), str(r["alert"]).split(":", 1)[0], str(int(r["alert_step"])),
                     str(saved), "" if total is None or pd.isna(total) else str(int(total)),
                     number(None if kept is None or pd.isna(kept) else 100 * kept, 1), twin or "",
                     number(None if end is None or pd.isna(end) else 100 * end, 1), number(diff, 1),
                     str(r.get("peak_export") or "")])
        shown.append(rows[-1][:10])
    return Table(
        name="alert_actions", title="Alerts that acted — the compute a stop saved and the accuracy it kept",
        caption=("Cells whose train.on_alert acted on a mechanism alert's first firing. Steps saved: the steps a stop "
                 "left untrained (0 under export_peak, which trains on). Kept: the peak validation accuracy up to the "
                 "alert (its adapters exported). Would-be end: the final validation of the cell itself (export_peak) "
                 "or of its twin, the cell alike but for train.on_alert that ran to the end (none: no such cell in the "
                 "sweep). Kept − end > 0: the alert kept a better model than running on would have ended with."),
        columns=["cell", "on_alert", "alert", "alert_step", "steps_saved", "total_steps", "kept_pct", "twin",
                 "twin_final_pct", "kept_minus_end_pp", "peak_export"],
        headers=["Cell", "Action", "Alert", "Alert step", "Steps saved", "Steps", "Kept (%)", "Ran on (twin)",
                 "Would-be end (%)", "Kept − end (pp)"],
        rows=rows, shown=shown, left=3,
        notes=[] if rows else ["No cell's alert acted (train.on_alert is warn, or no mechanism alert fired)."],
    )
