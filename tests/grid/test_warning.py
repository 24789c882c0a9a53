"""The cliff early warning (cliff and lead detection, recall and false alarms), findings (e),
and a sweep with variants collected: numbers worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from gridrun.analysis.findings import HOLDS, UNSURE, claim_e, claim_verdict
from gridrun.analysis.warning import LEAD_VALIDATIONS, early_warning_table, lead, peak_drop, warning_columns
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.records import ValidationRecord
from tests.grid.conftest import Gridrun
from tests.grid.test_collect import add_cell, coords


def test_the_cliff_is_a_large_fall_that_clears_the_bound_over_the_runs_pairs() -> None:
    accs = {0: 0.30, 2: 0.40, 4: 0.29}
    # An 11-point fall; without standard errors (rows from before val/acc_se) the points decide.
    plain = peak_drop(accs)
    assert plain is not None and plain.se_pp is None and plain.cliff
    # 3 validations, 3 pairs: the bound is the normal's 1 - 0.05/3 quantile, z = 2.128.
    # SE 5 points per validation: the fall's SE is hypot(5, 5) = 7.07 points, and 11 points
    # are 1.56 of them: noise, not a cliff.
    noisy = peak_drop(accs, {s: 0.05 for s in accs})
    assert noisy is not None and noisy.se_pp == pytest.approx(100 * math.hypot(0.05, 0.05))
    assert noisy.fall is not None and noisy.fall.rule.z == pytest.approx(2.128, abs=1e-3)
    assert noisy.drop_pp == pytest.approx(11.0) and not noisy.cliff
    # SE 2 points: the fall's SE 2.83, 11 points are 3.9 of them: a cliff.
    precise = peak_drop(accs, {s: 0.02 for s in accs})
    assert precise is not None and precise.cliff
    # The run's planned validations set the bound: 3.9 SEs clear 11 validations' 3.12, not
    # 200 validations' 4.4 (19,900 pairs).
    assert peak_drop(accs, {s: 0.02 for s in accs}, validations=11).cliff  # type: ignore[union-attr]
    assert not peak_drop(accs, {s: 0.02 for s in accs}, validations=200).cliff  # type: ignore[union-attr]
    # 9 points of a precise validation are not a cliff either: both tests must hold.
    assert not peak_drop({0: 0.40, 2: 0.31}, {0: 0.001, 2: 0.001}).cliff  # type: ignore[union-attr]
    # The onset: a validation within k SEs of the peak is still at it. Falls of 6 and 7
    # points with SE 2.5 (the difference's SE 3.54, k x SE 7.07) are noise; the fall shows
    # at step 6 (points alone: at step 2, the first more than ONSET_PP below).
    slide = {0: 0.40, 2: 0.34, 4: 0.33, 6: 0.25}
    assert peak_drop(slide).onset_step == 2  # type: ignore[union-attr]
    assert peak_drop(slide, {s: 0.025 for s in slide}, k=2.0).onset_step == 6  # type: ignore[union-attr]
    # The cell's noise floor: the fall the rule finds with 80% power at the fall's SE of 3.54
    # points: (z(1 - 0.05/6) + z(0.8)) x 3.54 = (2.394 + 0.842) x 3.54 = 11.44 points.
    columns = warning_columns(slide, {}, {s: 0.025 for s in slide}, k=2.0)
    assert columns["val_acc_se_pp"] == pytest.approx(2.5) and columns["fall_se_pp"] == pytest.approx(3.536, abs=1e-3)
    assert columns["noise_floor_pp"] == pytest.approx(11.44, abs=0.01)
    assert columns["peak_drop_cliff"] is True and columns["peak_drop_se_pp"] == pytest.approx(100 * math.hypot(0.025, 0.025))
    assert columns["val_paired"] is False and columns["cliff_test"].startswith("unpaired")


def test_records_pair_a_fall_by_problem() -> None:
    # 100 problems: 30 right at both validations, 12 lost, 0 gained: 42% -> 30%. Unpaired
    # (SEs of ~5.0 and ~4.6 points) the 12-point fall is 1.8 SEs; paired, the per-problem
    # differences (12 of -1, 88 of 0) have an SE of 3.3 points: 3.7 SEs, a cliff in a run of
    # 11 planned validations (bound 3.12).
    before = [1] * 42 + [0] * 58
    after = [1] * 30 + [0] * 70
    records = {0: ValidationRecord.from_outcomes("val", 0, ((f"p{i}", bool(c)) for i, c in enumerate(before))),
               5: ValidationRecord.from_outcomes("val", 5, ((f"p{i}", bool(c)) for i, c in enumerate(after)))}
    accs = {0: 0.42, 5: 0.30}
    ses = {0: math.sqrt(0.42 * 0.58 / 99), 5: math.sqrt(0.3 * 0.7 / 99)}
    unpaired = peak_drop(accs, ses, validations=11)
    paired = peak_drop(accs, ses, records=records, validations=11)
    assert unpaired is not None and paired is not None and not unpaired.cliff and paired.cliff
    assert paired.se_pp == pytest.approx(100 * math.sqrt(0.12 * 0.88 / 99 / 100) * 10, rel=1e-6)
    assert paired.fall is not None and paired.fall.paired and paired.fall.test().startswith("paired by problem")
    # A record that does not match its row's accuracy (an earlier attempt's) is not used.
    stale = peak_drop({0: 0.42, 5: 0.31}, ses, records=records)
    assert stale is not None and stale.fall is not None and not stale.fall.paired


def test_the_cliff_is_the_largest_drop_below_the_running_peak() -> None:
    # Peak 0.60 at step 10; below it 15 points at 15, 10 at 20, 30 at 25: the cliff is 30
    # points at step 25, measured from step 10, and the fall shows first at step 15.
    accs = {0: 0.40, 5: 0.55, 10: 0.60, 15: 0.45, 20: 0.50, 25: 0.30}
    cliff = peak_drop(accs)
    assert cliff is not None
    assert (cliff.step, cliff.peak_step, cliff.onset_step) == (25, 10, 15)
    assert cliff.drop_pp == pytest.approx(30.0)
    # A slow slide: each step falls 5 points (the largest consecutive drop), but the running
    # peak 0.50 of step 0 ends 15 points above step 15. Step 5 is within ONSET_PP (5) of the
    # peak, still at it: the fall shows at 10.
    slide = peak_drop({0: 0.50, 5: 0.45, 10: 0.40, 15: 0.35})
    assert slide is not None and (slide.step, slide.peak_step, slide.onset_step) == (15, 0, 10)
    assert slide.drop_pp == pytest.approx(15.0)
    # A noisy dip of 6 points right after the peak, a recovery to 1 point below it, then the
    # fall: the onset is after the recovery (step 8), not the dip (step 2), so an alert at
    # step 5 leads it by 2 validations (6 and 8) where it would trail the dip.
    noisy = {0: 0.315, 2: 0.255, 4: 0.25, 6: 0.305, 8: 0.225, 10: 0.195}
    dip = peak_drop(noisy)
    assert dip is not None and (dip.step, dip.peak_step, dip.onset_step) == (10, 0, 8)
    assert lead(sorted(noisy), dip.onset_step, 5) == 2
    # Never below its running peak: no cliff; no validations: nothing.
    calm = peak_drop({0: 0.3, 5: 0.3, 10: 0.4})
    assert calm is not None and calm.drop_pp == 0.0 and calm.step is None and not calm.cliff
    assert peak_drop({}) is None


def test_lead_counts_validations_between_the_firing_and_the_fall() -> None:
    steps = [0, 5, 10, 15, 20, 25]  # the fall shows at 15
    assert lead(steps, 15, 4) == 3  # validations 5, 10, 15 after it
    assert lead(steps, 15, 10) == 1  # only 15
    assert lead(steps, 15, 15) == 0  # in the onset's own step: no warning
    assert lead(steps, 15, 22) == -1  # after the fall showed (validation 20 came first)
    assert lead(steps, None, 4) is None and lead(steps, 15, None) is None


def test_warning_columns_per_cell() -> None:
    columns = warning_columns({0: 0.40, 5: 0.55, 10: 0.60, 15: 0.45},
                              {"alert/gradient_amplification/first_step": 3})
    assert columns["peak_drop_onset_step"] == 15 and columns["peak_drop_pp"] == pytest.approx(15.0)
    assert columns["alert/gradient_amplification/lead"] == 3  # validations 5, 10, 15
    assert columns["alert/sp_role_capture/lead"] is None  # never fired


def row(cell: str, kind: str, drop: float, first: float | None, lead_: float | None, steps: float | None = 30,
        state: str = "done") -> dict:
    return {"cell": cell, "kind": kind, "state": state, "peak_drop_pp": drop,
            "alert/gradient_amplification/steps": steps, "alert/gradient_amplification/first_step": first,
            "alert/gradient_amplification/lead": lead_}


def test_recall_and_false_alarms_by_hand() -> None:
    cells = pd.DataFrame([
        row("a", "train", 30.0, 5, 3),          # cliff, warned 3 validations ahead: counts
        row("b", "train", 12.0, 12, 1),         # cliff, warned only 1 ahead: missed
        row("c", "train", 10.0, None, None),    # cliff (exactly 10 points), never fired: missed
        row("d", "train", 4.0, 20, None),       # no cliff, fired: a false alarm
        row("e", "shuffled", 0.0, None, None),  # no cliff, silent (a shuffled twin counts)
        row("f", "train", 50.0, 1, 5, steps=None),        # the alert does not apply: left out
        row("g", "train", 50.0, 1, 5, state="failed"),    # not done: left out
    ])
    table = early_warning_table(cells)
    amplification = next(r for r in table.rows if r[0] == "gradient_amplification")
    # cells, cliffs, warned, recall, calm, calm shuffled, false alarms, rate
    assert amplification[1:] == ["5", "3", "1", "0.333", "2", "1", "1", "0.500"]
    capture = next(r for r in table.rows if r[0] == "sp_role_capture")
    assert capture[1:4] == ["0", "0", "0"]  # no column for it in this frame: nothing measured
    # The caption states the lead a warning needs as a number.
    assert f"at least {LEAD_VALIDATIONS} validations before the fall showed" in table.caption


def remedy_cells(natural: list[tuple[float, float]], remedy: list[tuple[float, float]]) -> pd.DataFrame:
    """Voting-IP cells of seeds 0.. with (peak, final) per seed, natural and coherence."""
    rows = []
    for variant, values in (("natural", natural), ("coherence", remedy)):
        for seed, (peak, final) in enumerate(values):
            rows.append({"cell": f"{variant}{seed}", "kind": "train", "state": "done", "task": "arith", "scale": "toy",
                         "workflow": "voting", "policy": "isolated", "seed": seed, "variant": variant,
                         "peak_val_acc": peak, "drop_from_peak": final - peak})
    return pd.DataFrame(rows)


def test_findings_e_remedy_against_natural_on_paired_seeds() -> None:
    # Natural peaks 0.60, 0.62, 0.64 and ends 20, 18, 16 points lower; coherence peaks the
    # same and ends 5, 3, 1 points lower: peak kept (0 + 2 pt margin = 2, 2, 2: holds),
    # late drop shrunk by 15, 15, 15 points (holds).
    cells = remedy_cells([(0.60, 0.40), (0.62, 0.44), (0.64, 0.48)], [(0.60, 0.55), (0.62, 0.59), (0.64, 0.63)])
    claim = claim_e(cells)
    kept, shrunk = claim.parts
    assert kept.rows[0].values == pytest.approx([2.0, 2.0, 2.0])
    assert shrunk.rows[0].values == pytest.approx([15.0, 15.0, 15.0])
    assert kept.verdict == shrunk.verdict == claim_verdict(claim) == HOLDS
    # A remedy that costs 1 point of peak in one seed and 3 in another: 1, -1, 2 -> interval
    # spans 0: inconclusive.
    cells = remedy_cells([(0.60, 0.40), (0.62, 0.44), (0.64, 0.48)], [(0.59, 0.55), (0.59, 0.55), (0.64, 0.63)])
    assert claim_e(cells).parts[0].rows[0].values == pytest.approx([1.0, -1.0, 2.0])
    assert claim_e(cells).parts[0].verdict == UNSURE
    # No variants: not measured, saying what it needs.
    assert "needs a sweep with variants" in claim_verdict(claim_e(cells.drop(columns="variant")))


def test_a_sweep_with_variants_is_collected_per_variant_with_its_early_warning(gridrun: Gridrun, results: Path) -> None:
    sweep = SweepDir(results, "remedies")
    data: dict = {"name": "remedies", "cells": [], "plans": []}
    natural = {0: 0.40, 5: 0.55, 10: 0.60, 15: 0.45, 20: 0.30}  # a 30-point cliff, the fall shows at 15
    add_cell(sweep, data, "voting-ip-1.7b-math-s0-natural", "train",
             {**coords("voting", "isolated"), "variant": "natural"}, "done", natural)
    add_cell(sweep, data, "voting-ip-1.7b-math-s0-coherence", "train",
             {**coords("voting", "isolated"), "variant": "coherence"}, "done", {0: 0.40, 5: 0.55, 10: 0.60, 20: 0.58})
    add_cell(sweep, data, "base-voting-1.7b-math", "base", coords("voting", seed=None), "done", {0: 0.40})
    # The natural cell's generator chi2 rises 1e-3 -> 3e-3 at step 3 against an aggregator at
    # rounding level (floored to 1e-4: ratio 1): gradient_amplification fires at step 3,
    # validations 5, 10 and 15 before the fall shows: lead 3.
    sweep.cell("voting-ip-1.7b-math-s0-natural").append_metrics([
        {"step": s, "split": "train", "role/generator/chi2": c, "role/aggregator/chi2": 2e-7}
        for s, c in ((1, 1e-3), (2, 1e-3), (3, 3e-3))])
    # The coherence cell's stays flat: silent (a cell without train rows replays nothing).
    sweep.cell("voting-ip-1.7b-math-s0-coherence").append_metrics([
        {"step": s, "split": "train", "role/generator/chi2": 1e-3, "role/aggregator/chi2": 2e-7} for s in (1, 2, 3)])
    # The plan the sweep file recorded: thresholds chosen on seed 0, seed 1 held out.
    data["early_warning"] = {"fit_seeds": [0], "held_out_seeds": [1], "search": {"chi2_factor": [5.0, 2.0]}}
    sweep.write(data)
    result = gridrun("collect", "conf=remedies")
    assert result.code == 0, result.err
    cells = pd.read_parquet(sweep.cells_parquet).set_index("cell")
    natural_row = cells.loc["voting-ip-1.7b-math-s0-natural"]
    assert natural_row["variant"] == "natural" and math.isclose(natural_row["peak_drop_pp"], 30.0)
    assert natural_row["alert/gradient_amplification/first_step"] == 3
    assert natural_row["alert/gradient_amplification/lead"] == 3
    assert pd.isna(cells.loc["base-voting-1.7b-math", "variant"])
    for name in ("table1-natural", "table1-coherence", "table2-natural", "findings_alerts-coherence", "findings",
                 "early_warning"):
        assert sweep.table(name, "md").is_file(), name
    assert not sweep.table("table1", "md").exists()
    assert "variant `coherence`" in sweep.table("table1-coherence", "md").read_text()
    report = sweep.report("md").read_text()
    assert "## Early warning" in report and "early_warning-math-1.7b.png" in report
    warning = {r["alert"]: r for r in pd.read_csv(sweep.table("early_warning", "csv")).to_dict("records")}
    # One cliff cell (natural, warned 3 ahead), one calm (coherence: 2 points below its peak).
    assert (warning["gradient_amplification"]["cliff_cells"], warning["gradient_amplification"]["warned"],
            warning["gradient_amplification"]["calm_cells"], warning["gradient_amplification"]["false_alarms"]) == (
        1, 1, 1, 0)
    # Calibrated on seed 0: 5x misses the natural cell's 3x rise, 2x warns it with no false
    # alarm; seed 1 has no cell, so nothing is reported for it.
    calibration = pd.read_csv(sweep.table("early_warning_calibration", "csv")).set_index("mechanism")
    amplification = calibration.loc["gradient_amplification"]
    assert "chi2_factor=2.0" in amplification["thresholds"]
    assert (amplification["fit_cliffs"], amplification["fit_warned"], amplification["fit_false"],
            amplification["held_cliffs"]) == (1, 1, 0, 0)
    shown = pd.read_csv(sweep.table("mechanism_shown", "csv")).set_index("variant")
    assert (shown.loc["natural", "cliffs"], shown.loc["natural", "alerted"]) == (1, 1)
    assert (shown.loc["coherence", "cliffs"], shown.loc["coherence", "alerted"]) == (0, 0)
    assert "thresholds chosen on the fit seeds" in report


def test_findings_e_measures_a_remedy_on_the_injection_against_injected() -> None:
    # injected peaks 0.60 and falls 30 points; injected_credit (the remedy on top of the same
    # injection) peaks 0.61 and falls 10: peak kept (+1 + 2 margin = 3) and the injected late
    # drop shrunk by 20 points, in both seeds. natural is there but is not its reference.
    rows = []
    for variant, (peak, final) in (("natural", (0.9, 0.9)), ("injected", (0.60, 0.30)), ("injected_credit", (0.61, 0.51))):
        for seed in (0, 1):
            rows.append({"cell": f"{variant}{seed}", "kind": "train", "state": "done", "task": "arith", "scale": "toy",
                         "workflow": "voting", "policy": "isolated", "seed": seed, "variant": variant,
                         "peak_val_acc": peak, "drop_from_peak": final - peak})
    kept, shrunk = claim_e(pd.DataFrame(rows)).parts
    assert kept.name == "injected_credit keeps the peak in most blocks"
    assert kept.rows[0].measurement == "injected_credit peak − injected peak (+2 pt margin)"
    assert kept.rows[0].values == pytest.approx([3.0, 3.0]) and shrunk.rows[0].values == pytest.approx([20.0, 20.0])


def test_a_stopped_cell_shows_in_status_and_its_saving_in_the_report(gridrun: Gridrun, results: Path) -> None:
    # Two Voting-IP cells alike but for train.on_alert: `stop` ended at step 10 when
    # gradient_amplification fired (its peak 0.55 at step 10 exported); its `warn` twin ran
    # all 20 steps and ended at 0.30. The stop saved 10 steps and kept 25 points more.
    sweep = SweepDir(results, "acts")
    data: dict = {"name": "acts", "cells": [], "plans": []}
    for cell_id, state, accs, on_alert in (("stop", "stopped", {0: 0.40, 5: 0.50, 10: 0.55}, "stop"),
                                           ("warn", "done", {0: 0.40, 5: 0.50, 10: 0.55, 15: 0.45, 20: 0.30}, "warn")):
        add_cell(sweep, data, cell_id, "train", coords("voting", "isolated"), state, accs)
        config = f"cell:\n  id: {cell_id}\nworkflow:\n  name: voting\ntrain:\n  total_steps: 20\n"
        sweep.cell(cell_id).config_yaml.write_text(config + ("  on_alert: stop\n" if on_alert == "stop" else ""))
    sweep.write(data)
    from tests.states import put_state
    put_state(sweep.cell("stop"), on_alert="stop", alert="gradient_amplification: generator chi2 peak/first 30.00 vs aggregator 1.00",
              alert_step=10, peak_export="/x/exports/step_000010", peak_step=10, peak_val_acc=0.55)
    status = gridrun("status", "conf=acts")
    assert status.code == 0 and "stopped" in status.out
    assert "stop at step 10: gradient_amplification" in " ".join(status.out.split())
    assert gridrun("collect", "conf=acts").code == 0
    table = (sweep.root / "alert_actions.csv").read_text().splitlines()
    assert table[0].startswith("cell,on_alert,alert,alert_step,steps_saved,total_steps,kept_pct,twin,twin_final_pct,"
                               "kept_minus_end_pp")
    assert table[1].startswith("stop,stop,gradient_amplification,10,10,20,55.0,warn,30.0,25.0")
    assert "Alerts that acted" in (sweep.root / "report.md").read_text()


def test_collect_reports_the_calibration_with_held_out_leads_and_the_noise(gridrun: Gridrun, results: Path) -> None:
    # A sweep whose sweep.json holds an early_warning plan (fit seed 0, held-out seed 1,
    # cliff_se 2): collect writes the calibration with the held-out lead columns, the
    # signature column of mechanism_shown and each cell's noise floor. Seed 1's cell falls
    # 20 points with an SE of 2 points per validation (its noise floor 2 x 1.414 x 2 = 5.7).
    sweep = SweepDir(results, "calib")
    data: dict = {"name": "calib", "cells": [], "plans": [],
                  "early_warning": {"fit_seeds": [0], "held_out_seeds": [1], "cliff_se": 2.0,
                                    "search": {"chi2_factor": [2.0, 10.0]}}}
    for seed in (0, 1):
        cell = f"voting-ip-s{seed}"
        add_cell(sweep, data, cell, "train", {**coords("voting", "isolated", seed=seed), "variant": "natural"}, "done",
                 {0: 0.40, 5: 0.50, 10: 0.30})
        sweep.cell(cell).append_metrics([{"step": s, "split": "val", "val/acc": a, "val/acc_se": 0.02}
                                         for s, a in ((0, 0.40), (5, 0.50), (10, 0.30))])
    sweep.write(data)
    assert gridrun("collect", "conf=calib").code == 0
    header = (sweep.root / "early_warning_calibration.csv").read_text().splitlines()[0]
    assert "held_mean_lead" in header and "default_held_mean_lead" in header
    assert "signature" in (sweep.root / "mechanism_shown.csv").read_text().splitlines()[0]
    noise = pd.read_csv(sweep.root / "noise_floor.csv")
    # The fall's SE 2.83 points, 3 validations (bound 2.13): the rule finds (2.13 + 0.84) x
    # 2.83 = 8.4 points with 80% power, under the 10 points a cliff needs.
    assert noise["noise_floor_pp"].tolist() == pytest.approx([10.0, 10.0])
    assert noise["cliff"].tolist() == ["yes", "yes"]
