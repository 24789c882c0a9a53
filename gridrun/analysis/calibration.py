"""The alerts' thresholds chosen on some seeds of a study and reported on the others.

A sweep file's `early_warning:` section (spec.EarlyWarningPlan, recorded in sweep.json when
the sweep is planned, so before it runs) names the fit seeds, the held-out seeds and candidate
values for `Thresholds` fields. For each mechanism and each candidate collapse signal
(CALIBRATED), every combination of the candidates of its own fields (ALERT_FIELDS; a field
not searched keeps its default) is replayed on the rows of the fit seeds' cells
(`alert_history`), and scored as the early warning scores alerts
(gridrun/analysis/warning.py: recall on cliff cells, warned LEAD_VALIDATIONS ahead;
false-alarm rate on the others). The choice: the highest recall among candidates whose
false-alarm rate is below FALSE_ALARM_CAP; then the lower false-alarm rate; then the earlier
candidate (fields in `Thresholds` order, values in the file's order). With no candidate under
the cap: the lowest false-alarm rate, then the highest recall. The held-out seeds' cells are
then scored once, under the chosen thresholds and under the defaults beside them.

Outputs (tables, written by collect as md/csv/tex and in the report's "Early warning"):

    early_warning_calibration  per mechanism and candidate signal: the chosen thresholds, fit and held-out recall
                               and false alarms, the held-out ones under the defaults too
    early_warning_search       every candidate's fit scores (how the choice was made)
    mechanism_shown            per workflow x policy x variant: seeds with a cliff, seeds
                               where the applicable mechanism's alert fired (chosen
                               thresholds), the mean cliff: does the injected variant show
                               its mechanism, and its natural twin less?

Leaves out: significance (a held-out seed is a handful of cells), and thresholds shared
between alerts: each is chosen for its own alert, and the candidate signals' signal_window,
searched for each signal alone, may come out different for each (one Thresholds holds one).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gridrun.analysis.summary import cell_grouping, planned_validations
from gridrun.analysis.tables import Table, number
from gridrun.analysis.warning import (
    CLIFF_SE,
    LEAD_VALIDATIONS,
    alert_counts,
    peak_drop,
    warning_columns,
)
from gridrun.grid.spec import EarlyWarningPlan
from gridrun.grid.sweepdir import SweepDir, SweepPlan
from gridrun.seam.accuracy import val_accuracy
from gridrun.seam.cellstate import CellState
from gridrun.seam.mechanisms import (
    CANDIDATES,
    ENTROPY_COLLAPSE,
    GRAD_NORM_SPIKE,
    GRADIENT_AMPLIFICATION,
    LENGTH_BLOWUP,
    LENGTH_COLLAPSE,
    MECHANISMS,
    SP_ROLE_CAPTURE,
    THRESHOLDS,
    TRUNCATION_SPIKE,
    ZERO_VARIANCE,
    Groups,
    Thresholds,
    alert_history,
    applies,
    firings,
    signature_steps,
)
from gridrun.seam.records import ValidationRecord
from gridrun.seam.runconfig import TRAINED_KINDS, CellKind
from gridrun.seam.rundir import RunDir
from gridrun.seam.significance import CLIFF_PP

# A calibrated alert must cry wolf on fewer than this share of the cells without a cliff.
FALSE_ALARM_CAP = 0.10
# The Thresholds fields each calibrated alert reads.
ALERT_FIELDS = {
    GRADIENT_AMPLIFICATION: ("chi2_factor", "ppl_factor", "chi2_floor", "ratio_window"),
    SP_ROLE_CAPTURE: ("share_window", "share_shrink", "gap_close", "terse_drop"),
    ENTROPY_COLLAPSE: ("signal_window", "entropy_fall"),
    LENGTH_BLOWUP: ("signal_window", "length_rise"),
    LENGTH_COLLAPSE: ("signal_window", "length_fall"),
    TRUNCATION_SPIKE: ("signal_window", "trunc_level"),
    GRAD_NORM_SPIKE: ("signal_window", "grad_norm_factor"),
    ZERO_VARIANCE: ("signal_window", "zero_var_level"),
}
# The alerts calibrated: the mechanisms, then the candidate collapse signals.
CALIBRATED = (*MECHANISMS, *CANDIDATES)


@dataclass(frozen=True)
class CellCurve:
    """What scoring an alert on a cell needs: its coordinates, metric rows and validations."""

    cell: str
    seed: int
    workflow: str
    policy: str | None
    variant: str | None
    rows: list[dict[str, Any]]
    val_acc: dict[int, float]
    # A grouped cell's adapters and their roles (summary.cell_grouping); None: read `policy`.
    groups: Groups | None = None
    # step -> val/acc_se (empty: rows without it; the cliff is then points alone).
    val_se: dict[int, float] = field(default_factory=dict)
    # step -> per-problem record (empty: a run from before them; its falls are unpaired).
    records: dict[int, ValidationRecord] = field(default_factory=dict)
    # The run's planned validations (the cliff rule's K); None: the ones it has.
    validations: int | None = None

    def applies(self, mechanism: str) -> bool:
        return applies(mechanism, self.workflow, self.policy, self.groups)

    def first_firing(self, mechanism: str, thresholds: Thresholds) -> int | None:
        fired = firings(alert_history(self.rows, self.workflow, self.policy, thresholds, self.groups, (mechanism,)),
                        mechanism)
        return fired[0] if fired else None


def val_se(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """step -> val/acc_se of a cell's validation rows (none before validations recorded it)."""
    return {int(r["step"]): float(r["val/acc_se"]) for r in rows
            if r.get("split") == "val" and isinstance(r.get("val/acc_se"), (int, float)) and math.isfinite(r["val/acc_se"])}


@dataclass(frozen=True)
class Score:
    """An alert's early-warning counts on some cells, and its lead on each cliff it fired on
    (validations before the onset; negative: after it)."""

    cliffs: int = 0
    warned: int = 0
    calm: int = 0
    false: int = 0
    leads: tuple[int, ...] = ()

    @property
    def mean_lead(self) -> float | None:
        return sum(self.leads) / len(self.leads) if self.leads else None

    @property
    def recall(self) -> float | None:
        return self.warned / self.cliffs if self.cliffs else None

    @property
    def false_rate(self) -> float | None:
        return self.false / self.calm if self.calm else None


def score(curves: Sequence[CellCurve], mechanism: str, thresholds: Thresholds, k: float = CLIFF_SE) -> Score:
    """Recall and false alarms of `mechanism`'s alert under `thresholds` on `curves`: each
    curve's cliff and lead as collect writes them (`warning_columns`), counted as the early
    warning table counts them (`alert_counts`)."""
    first = f"alert/{mechanism}/first_step"
    records = []
    for curve in curves:
        fired = curve.first_firing(mechanism, thresholds)
        # Steps replayed: none (no training row) leaves the cell out, as collect's alert_summary does.
        trained = sum(row.get("split") == "train" for row in curve.rows) or None
        records.append({"kind": CellKind.TRAIN.value, "state": CellState.DONE.value, f"alert/{mechanism}/steps": trained, first: fired,
                        **warning_columns(curve.val_acc, {first: fired}, curve.val_se, k, curve.records, curve.validations)})
    frame = pd.DataFrame.from_records(records)
    counts = alert_counts(frame, mechanism)
    leads = tuple(int(r[f"alert/{mechanism}/lead"]) for r in records
                  if r["peak_drop_cliff"] and r[f"alert/{mechanism}/lead"] is not None)
    return Score(counts["cliffs"], counts["warned"], counts["calm"], counts["false"], leads)


def candidates(mechanism: str, search: Mapping[str, Sequence[float]]) -> list[Thresholds]:
    """Every combination of the searched values of `mechanism`'s fields, in tie-break order."""
    fields = [f.name for f in dataclasses.fields(Thresholds) if f.name in ALERT_FIELDS[mechanism] and f.name in search]
    combos: list[dict[str, Any]] = [dict(zip(fields, values, strict=True))
                                    for values in itertools.product(*(search[f] for f in fields))]
    return [dataclasses.replace(THRESHOLDS, **combo) for combo in combos]


def choose(scored: Sequence[tuple[Thresholds, Score]]) -> tuple[Thresholds, Score]:
    """The module docstring's rule; `scored` in tie-break order."""
    def rate(s: Score) -> float:
        return s.false_rate if s.false_rate is not None else 0.0

    under = [(t, s) for t, s in scored if rate(s) < FALSE_ALARM_CAP]
    if under:
        return max(under, key=lambda item: (item[1].recall or 0.0, -rate(item[1])))
    return min(scored, key=lambda item: (rate(item[1]), -(item[1].recall or 0.0)))


@dataclass(frozen=True)
class Calibration:
    mechanism: str
    chosen: Thresholds
    fit: Score
    held_out: Score
    held_out_default: Score
    searched: list[tuple[Thresholds, Score]]


def read_curves(sweep: SweepDir, cells: pd.DataFrame, metric_rows: Mapping[str, list[dict[str, Any]]]) -> list[CellCurve]:
    """The done training cells' curves (the only cells an alert is scored on), from the metric
    rows collect read (cell -> rows)."""
    done = cells[cells["kind"].isin(TRAINED_KINDS) & (cells["state"] == CellState.DONE)]
    curves = []
    for record in done.to_dict("records"):
        run_dir = RunDir(sweep.cell(record["cell"]).root)
        rows = metric_rows[record["cell"]]
        variant = record.get("variant")
        curves.append(CellCurve(record["cell"], int(record["seed"]), str(record["workflow"]), record.get("policy"),
                                None if variant is None or pd.isna(variant) else str(variant), rows, val_accuracy(rows),
                                cell_grouping(run_dir, record.get("policy")), val_se(rows), run_dir.read_records("val")[0],
                                planned_validations(run_dir)))
    return curves


def calibrate(curves: Sequence[CellCurve], plan: EarlyWarningPlan) -> list[Calibration]:
    """Each calibrated alert's thresholds chosen on the fit seeds and scored on the held-out ones."""
    out = []
    for mechanism in CALIBRATED:
        own = [c for c in curves if c.applies(mechanism)]
        fit = [c for c in own if c.seed in plan.fit_seeds]
        held = [c for c in own if c.seed in plan.held_out_seeds]
        k = CLIFF_SE if plan.cliff_se is None else plan.cliff_se
        searched = [(t, score(fit, mechanism, t, k)) for t in candidates(mechanism, plan.search) or [THRESHOLDS]]
        chosen, fit_score = choose(searched)
        out.append(Calibration(mechanism, chosen, fit_score, score(held, mechanism, chosen, k),
                               score(held, mechanism, THRESHOLDS, k), searched))
    return out


def _thresholds_text(mechanism: str, thresholds: Thresholds) -> str:
    return ", ".join(f"{name}={getattr(thresholds, name)}" for name in ALERT_FIELDS[mechanism])


def _counts(s: Score) -> tuple[str, str]:
    recall = f"{s.warned}/{s.cliffs}" + (f" ({number(100 * s.recall, 0)}%)" if s.recall is not None else "")
    false = f"{s.false}/{s.calm}" + (f" ({number(100 * s.false_rate, 0)}%)" if s.false_rate is not None else "")
    return recall, false


def calibration_table(results: Sequence[Calibration], plan: EarlyWarningPlan) -> Table:
    columns = ["mechanism", "thresholds", "fit_cliffs", "fit_warned", "fit_calm", "fit_false", "held_cliffs",
               "held_warned", "held_calm", "held_false", "held_mean_lead", "default_held_warned", "default_held_false",
               "default_held_mean_lead"]
    rows, shown = [], []
    for r in results:
        rows.append([r.mechanism, _thresholds_text(r.mechanism, r.chosen),
                     *(str(v) for v in (r.fit.cliffs, r.fit.warned, r.fit.calm, r.fit.false, r.held_out.cliffs,
                                        r.held_out.warned, r.held_out.calm, r.held_out.false)),
                     number(r.held_out.mean_lead, 2), str(r.held_out_default.warned), str(r.held_out_default.false),
                     number(r.held_out_default.mean_lead, 2)])
        shown.append([r.mechanism, _thresholds_text(r.mechanism, r.chosen), *_counts(r.fit), *_counts(r.held_out),
                      _lead(r.held_out), *_counts(r.held_out_default), _lead(r.held_out_default)])
    seeds = ", ".join(str(s) for s in plan.held_out_seeds)
    k = CLIFF_SE if plan.cliff_se is None else plan.cliff_se
    return Table(
        name="early_warning_calibration", title="Early warning — thresholds chosen on the fit seeds, held-out seeds reported",
        caption=(f"Chosen on seeds {', '.join(str(s) for s in plan.fit_seeds)} (the highest recall with false alarms "
                 f"under {FALSE_ALARM_CAP:.0%}), reported on seed{'s' if len(plan.held_out_seeds) > 1 else ''} {seeds}. "
                 f"Recall: cliff cells (a fall of {CLIFF_PP:.0f}+ points clearing the Bonferroni bound over the run's "
                 f"validation pairs; its onset within {k:g} standard errors) warned {LEAD_VALIDATIONS}+ validations ahead. False alarms: cells without such a cliff where the "
                 "alert fired. Lead: the mean, over the cliff cells it fired on, of the validations from its first "
                 "firing to the fall's onset (negative: after it). The last three columns: the held-out cells under "
                 "the default thresholds. The candidate collapse signals (entropy, length, truncation, gradient norm, "
                 "zero-variance groups) run live only where a run's train.alert_signals lists them: indicative until a "
                 "study supports them."),
        columns=columns,
        headers=["Alert", "Thresholds", "Fit recall", "Fit false alarms", "Held-out recall",
                 "Held-out false alarms", "Held-out lead", "Held-out recall (defaults)",
                 "Held-out false alarms (defaults)", "Held-out lead (defaults)"],
        rows=rows, shown=shown, left=2,
    )


def _lead(s: Score) -> str:
    return "n/a" if s.mean_lead is None else f"{number(s.mean_lead, 1)} (n={len(s.leads)})"


def search_table(results: Sequence[Calibration]) -> Table:
    rows = []
    for r in results:
        for thresholds, s in r.searched:
            rows.append([r.mechanism, _thresholds_text(r.mechanism, thresholds), str(s.cliffs), str(s.warned),
                         str(s.calm), str(s.false), number(s.recall, 3), number(s.false_rate, 3),
                         "yes" if thresholds == r.chosen else ""])
    return Table(
        name="early_warning_search", title="Early warning — every candidate's score on the fit seeds",
        caption="Each combination of the sweep file's early_warning.search values, replayed on the fit seeds' cells.",
        columns=["mechanism", "thresholds", "cliffs", "warned", "calm", "false", "recall", "false_rate", "chosen"],
        headers=["Alert", "Thresholds", "Cliffs", "Warned", "Calm", "False", "Recall", "False-alarm rate", "Chosen"],
        rows=rows, left=2,
    )


def shown_table(curves: Sequence[CellCurve], results: Sequence[Calibration], k: float = CLIFF_SE) -> Table:
    """Per workflow x policy x variant: seeds with a cliff, seeds whose mechanism alert fired."""
    chosen = {r.mechanism: r.chosen for r in results}
    groups: dict[tuple[str, str, str], list[CellCurve]] = {}
    for curve in curves:
        key = (curve.workflow, curve.policy or "", curve.variant or "")
        groups.setdefault(key, []).append(curve)
    rows = []
    for (workflow, policy, variant), members in groups.items():
        mechanism = next((m for m in MECHANISMS if members[0].applies(m)), None)
        found = [c for m in members if (c := peak_drop(m.val_acc, m.val_se, k, m.records, m.validations)) is not None]
        drops = [c.drop_pp for c in found]
        cliffs = sum(c.cliff for c in found)
        fired = (sum(m.first_firing(mechanism, chosen[mechanism]) is not None for m in members)
                 if mechanism is not None else None)
        # SP: seeds where the paper's signature showed (a role's length or terse rate pulled
        # toward the dominant role's), whatever the alert's share test said.
        signed = (sum(bool(signature_steps(m.rows, m.workflow, m.policy, THRESHOLDS, m.groups)) for m in members)
                  if mechanism == SP_ROLE_CAPTURE else None)
        rows.append([workflow, policy, variant, mechanism or "", str(len(members)), str(cliffs),
                     "" if fired is None else str(fired), "" if signed is None else str(signed),
                     number(sum(drops) / len(drops) if drops else None, 1)])
    return Table(
        name="mechanism_shown", title="Does the injected mechanism show? Seeds with a cliff or the alert",
        caption=(f"Per workflow, policy and variant: seeds (done cells), seeds with a cliff of {CLIFF_PP:.0f}+ points "
                 "below the running peak, seeds where the mechanism's alert fired (the calibrated thresholds), under "
                 "SP the seeds showing the paper's signature at some validation (a role's mean length closed a "
                 "quarter of the gap to the dominant role's, or its terse rate fell 20 points, since the first "
                 "validation: sp_role_capture's drift test at the default thresholds, without its share test), and "
                 "the mean cliff in points."),
        columns=["workflow", "policy", "variant", "mechanism", "seeds", "cliffs", "alerted", "signature",
                 "mean_cliff_pp"],
        headers=["Workflow", "Policy", "Variant", "Mechanism", "Seeds", "Cliffs", "Alerted", "SP signature",
                 "Mean cliff (pp)"],
        rows=rows, left=4,
    )


def calibration_tables(sweep: SweepDir, plan: SweepPlan, cells: pd.DataFrame,
                       metric_rows: Mapping[str, list[dict[str, Any]]]) -> list[Table]:
    """The three tables, when sweep.json (`plan`, as collect read it) records an early_warning
    plan (none otherwise); `metric_rows`: each cell's metric rows as collect read them (it
    keeps them for such a plan)."""
    recorded = plan.early_warning
    if recorded is None or cells.empty:
        return []
    early = EarlyWarningPlan.parse(recorded, str(sweep.sweep_json))
    curves = read_curves(sweep, cells, metric_rows)
    results = calibrate(curves, early)
    k = CLIFF_SE if early.cliff_se is None else early.cliff_se
    return [calibration_table(results, early), search_table(results), shown_table(curves, results, k)]
