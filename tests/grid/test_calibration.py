"""Thresholds chosen on fit seeds and reported on held-out ones (analysis/calibration.py),
and the sweep file's early_warning plan: numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from gridrun.analysis.calibration import CellCurve, Score, calibrate, calibration_table, candidates, choose, score
from gridrun.grid.errors import GridError
from gridrun.grid.spec import EarlyWarningPlan
from gridrun.seam.mechanisms import CANDIDATES, GRADIENT_AMPLIFICATION, THRESHOLDS, Thresholds


def curve(cell: str, seed: int, accs: dict[int, float], generator: list[float], metric: str = "chi2",
          aggregator: float = 0.0) -> CellCurve:
    """A Voting-IP cell: validations `accs`, train steps 1.. with the generator's `metric`
    (the aggregator's flat at `aggregator`: a chi2 of 0, its one mini-batch on-policy), rows
    in the trainer's order."""
    rows: list[dict[str, Any]] = []
    for step in range(max(accs) + 1):
        if step >= 1:
            rows.append({"step": step, "split": "train", f"role/generator/{metric}": generator[step - 1],
                         f"role/aggregator/{metric}": aggregator})
        if step in accs:
            rows.append({"step": step, "split": "val", "val/acc": accs[step]})
    return CellCurve(cell, seed, "voting", "isolated", "natural", rows, accs)


# Cliff: 30% until step 4, then 15% and 10%: 20 points, onset 6 (4 is the last at the peak).
# The generator's chi2: 0 (LR 0 under the warmup), 0.01 (its baseline), 0.1 from step 3: 10x
# at step 3, two validations (4 and 6) before the fall.
FALLS = {0: 0.30, 2: 0.30, 4: 0.30, 6: 0.15, 8: 0.10}
RISING = [0.0, 0.01, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
# Calm: flat at 30%, while the chi2 rises 6x (a false alarm for a factor up to 6).
CALM = {0: 0.30, 2: 0.30, 4: 0.30, 6: 0.30, 8: 0.30}
SPIKE = [0.0, 0.01, 0.06, 0.01, 0.01, 0.01, 0.01, 0.01]


def factor(chi2: float) -> Thresholds:
    return Thresholds(chi2_factor=chi2, ppl_factor=math.inf)


def test_score_counts_warned_cliffs_and_false_alarms() -> None:
    curves = [curve("a", 0, FALLS, RISING), curve("b", 0, CALM, SPIKE)]
    # Factor 5: a fires at 3 (10x), 2 validations ahead (its lead); b fires at 3 (6x): a false alarm.
    assert score(curves, GRADIENT_AMPLIFICATION, factor(5.0)) == Score(cliffs=1, warned=1, calm=1, false=1, leads=(2,))
    # Factor 10: a still warned (10 >= 10), b silent (6 < 10).
    assert score(curves, GRADIENT_AMPLIFICATION, factor(10.0)) == Score(cliffs=1, warned=1, calm=1, false=0, leads=(2,))
    # Factor 20: nothing fires, the cliff goes unwarned.
    assert score(curves, GRADIENT_AMPLIFICATION, factor(20.0)) == Score(cliffs=1, warned=0, calm=1, false=0)
    # A rise one step later (step 5) leads the fall by one validation only: missed (lead 1).
    late = curve("c", 0, FALLS, [0.0, 0.01, 0.01, 0.01, 0.1, 0.1, 0.1, 0.1])
    assert score([late], GRADIENT_AMPLIFICATION, factor(5.0)) == Score(cliffs=1, warned=0, leads=(1,))


def test_choose_takes_the_best_recall_under_the_false_alarm_cap() -> None:
    a, b, c, d = (Thresholds(chi2_factor=f) for f in (2.0, 3.0, 5.0, 10.0))
    scored = [(a, Score(4, 4, 10, 1)),   # 10% false alarms: not under the cap
              (b, Score(4, 3, 10, 0)),   # recall 3/4, none false
              (c, Score(4, 3, 10, 0)),   # the same: the earlier (b) is kept
              (d, Score(4, 2, 10, 0))]
    assert choose(scored)[0] == b
    # Equal recall, fewer false alarms wins over order.
    assert choose([(a, Score(4, 3, 20, 1)), (b, Score(4, 3, 20, 0))])[0] == b
    # None under the cap: the fewest false alarms, then the better recall.
    assert choose([(a, Score(4, 4, 10, 5)), (b, Score(4, 1, 10, 2)), (c, Score(4, 2, 10, 2))])[0] == c


def test_candidates_cross_a_mechanisms_own_fields_in_order() -> None:
    search = {"chi2_factor": [2.0, 5.0], "ratio_window": [1, 2], "share_shrink": [0.5]}
    found = candidates(GRADIENT_AMPLIFICATION, search)
    # share_shrink is sp_role_capture's: not crossed here; unsearched fields keep the defaults.
    assert [(t.chi2_factor, t.ratio_window) for t in found] == [(2.0, 1), (2.0, 2), (5.0, 1), (5.0, 2)]
    assert all(t.share_shrink == THRESHOLDS.share_shrink and t.ppl_factor == THRESHOLDS.ppl_factor for t in found)


def test_calibrate_chooses_on_fit_seeds_and_reports_the_held_out_seed() -> None:
    curves = [curve("a0", 0, FALLS, RISING), curve("b0", 0, CALM, SPIKE),
              curve("a1", 1, FALLS, RISING), curve("b1", 1, CALM, [0.0, 0.01, 0.3, 0.01, 0.01, 0.01, 0.01, 0.01])]
    plan = EarlyWarningPlan(fit_seeds=(0,), held_out_seeds=(1,),
                            search={"chi2_factor": [5.0, 10.0, 20.0], "ppl_factor": [math.inf]})
    amplification = next(r for r in calibrate(curves, plan) if r.mechanism == GRADIENT_AMPLIFICATION)
    # Seed 0: factor 5 cries wolf on b0 (100%), 10 warns a0 without a false alarm, 20 misses.
    assert amplification.chosen.chi2_factor == 10.0
    assert amplification.fit == Score(1, 1, 1, 0, leads=(2,))
    # Seed 1 was not looked at: its calm cell's 30x spike is a false alarm even at 10.
    assert amplification.held_out == Score(1, 1, 1, 1, leads=(2,))
    assert amplification.held_out.mean_lead == 2.0
    # The defaults (2x, perplexity 1.2x) on seed 1: the same counts here.
    assert amplification.held_out_default == Score(1, 1, 1, 1, leads=(2,))


def test_calibrate_chooses_and_reports_a_candidate_signal() -> None:
    # Window 1: entropy_collapse compares each step with step 1's. The cliff cells' entropy
    # falls 1 -> 0.25 at step 3, two validations (4, 6) before the onset (6); seed 0's calm
    # cell falls 1 -> 0.375 (a false alarm at fall 0.5, silent at 0.25), seed 1's stays at 1.
    collapse = [1.0, 1.0] + [0.25] * 6
    curves = [curve(cell, seed, accs, entropy, "entropy", 1.0) for cell, seed, accs, entropy in (
        ("a0", 0, FALLS, collapse), ("b0", 0, CALM, [1.0, 1.0] + [0.375] * 6), ("a1", 1, FALLS, collapse),
        ("b1", 1, CALM, [1.0] * 8))]
    plan = EarlyWarningPlan(fit_seeds=(0,), held_out_seeds=(1,), search={"signal_window": [1], "entropy_fall": [0.5, 0.25]})
    results = {r.mechanism: r for r in calibrate(curves, plan)}
    entropy = results["entropy_collapse"]
    assert [(t.entropy_fall, s) for t, s in entropy.searched] == [
        (0.5, Score(1, 1, 1, 1, leads=(2,))), (0.25, Score(1, 1, 1, 0, leads=(2,)))]
    assert (entropy.chosen.signal_window, entropy.chosen.entropy_fall) == (1, 0.25)
    assert entropy.held_out == Score(1, 1, 1, 0, leads=(2,))
    # The defaults (window 3, fall 0.5) know the collapse only at step 6, the first step with
    # two disjoint windows (first (1 + 1 + 0.25) / 3 = 0.75, now 0.25 <= 0.375): the onset's
    # own step, lead 0, not warned.
    assert entropy.held_out_default == Score(1, 0, 1, 0, leads=(0,))
    # Every candidate signal is reported: length_blowup's signal_window is searched too (a
    # field the candidates share), its length_rise keeps the default; no length here: silent.
    assert set(results) == {"gradient_amplification", "sp_role_capture", *CANDIDATES}
    assert results["length_blowup"].searched == [(dataclasses.replace(THRESHOLDS, signal_window=1), Score(1, 0, 1, 0))]
    # The table names each alert and the thresholds it read.
    table = calibration_table(list(results.values()), plan)
    assert table.rows[[row[0] for row in table.rows].index("entropy_collapse")][1] == "signal_window=1, entropy_fall=0.25"


@pytest.mark.parametrize(("data", "message"), [
    ({"fit_seeds": [0], "held_out_seeds": [0], "search": {"chi2_factor": [2.0]}}, "must not be fit seeds"),
    ({"fit_seeds": [0], "held_out_seeds": [1], "search": {"chi2_factr": [2.0]}}, "did you mean 'chi2_factor'"),
    ({"fit_seeds": [0], "held_out_seeds": [1], "search": {"ratio_window": [1.5]}}, "list of whole numbers"),
    ({"fit_seeds": [], "held_out_seeds": [1], "search": {"chi2_factor": [2.0]}}, "non-empty list of seeds"),
    ({"fit_seeds": [0], "search": {"chi2_factor": [2.0]}}, "must hold fit_seeds, held_out_seeds and search"),
])
def test_a_bad_plan_is_one_line_naming_the_fix(data: dict[str, Any], message: str) -> None:
    with pytest.raises(GridError, match=message):
        EarlyWarningPlan.parse(data, "sweeps/x.yaml")


def test_the_plan_round_trips_through_sweep_json() -> None:
    plan = EarlyWarningPlan.parse({"fit_seeds": [0, 1], "held_out_seeds": [2],
                                   "search": {"chi2_factor": [2.0, 3.0], "ppl_factor": [math.inf]}}, "x")
    assert EarlyWarningPlan.parse(plan.to_dict(), "sweep.json") == plan
    # cliff_se is optional: a plan without it writes sweep.json as before; one with it keeps it.
    assert "cliff_se" not in plan.to_dict()
    scaled = EarlyWarningPlan.parse({**plan.to_dict(), "cliff_se": 3}, "x")
    assert scaled.cliff_se == 3.0 and EarlyWarningPlan.parse(scaled.to_dict(), "sweep.json") == scaled
    with pytest.raises(GridError, match="cliff_se must be a number of standard errors"):
        EarlyWarningPlan.parse({**plan.to_dict(), "cliff_se": "two"}, "x")
