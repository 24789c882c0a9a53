"""gridrun's tests of a difference (gridrun/seam/significance.py): numbers worked out by hand,
and simulated validation curves (tests/simulated_runs.py) for the cliff rule's false alarms
and power."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gridrun.analysis.warning import peak_drop
from gridrun.seam.records import ValidationRecord
from gridrun.seam.significance import (
    CLIFF_PP,
    FallRule,
    detectable_difference,
    normal_quantile,
    paired_difference,
    t_quantile,
)
from tests.simulated_runs import run

# The toy world's validation as the studies ran it: 200 problems, one answer each at T 0.7,
# about 31% right (bench/measured/early-warning-study.md), 11 validations per curve.
TOY_PROBLEMS, TOY_ACC, VALIDATIONS = 200, 0.31, 11
STEPS = [3 * i for i in range(VALIDATIONS)]


@pytest.mark.parametrize("p, df, table", [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 3, 3.182), (0.975, 5, 2.571),
                                          (0.975, 10, 2.228), (0.975, 30, 2.042), (0.8, 2, 1.061), (0.8, 4, 0.941),
                                          (0.8, 10, 0.879)])
def test_t_quantiles_agree_with_the_printed_table(p: float, df: int, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, rel=0.008)


def test_a_paired_difference_is_the_mean_per_problem_difference() -> None:
    # Two samples per problem: rates a = (1, 0.5, 0), b = (0.5, 0.5, 0.5); differences
    # (0.5, 0, -0.5): mean 0, SD 0.5, SE 0.5 / sqrt(3). Problem "d" is in one record only.
    a = ValidationRecord("val", 0, ("a", "b", "c", "d"), (2, 2, 2, 2), (2, 1, 0, 2))
    b = ValidationRecord("val", 5, ("c", "b", "a"), (2, 2, 2), (1, 1, 1))
    diff = paired_difference(a, b)
    assert diff is not None and diff.paired and diff.problems == 3
    assert diff.value == pytest.approx(0.0) and diff.se == pytest.approx(0.5 / math.sqrt(3))
    assert paired_difference(a, ValidationRecord("val", 5, ("a",), (1,), (1,))) is None


def test_the_rule_and_what_it_can_detect() -> None:
    rule = FallRule(VALIDATIONS)
    assert rule.pairs == 55 and rule.z == pytest.approx(normal_quantile(1 - 0.05 / 55))
    # At a fall's SE of 2 points: (3.12 + 0.84) x 2 = 7.9, under the 10 points a cliff needs.
    assert rule.detectable_pp(2.0) == CLIFF_PP and rule.detectable_pp(4.0) == pytest.approx(3.960 * 4, abs=0.01)
    # One seed per cell, a given spread of 2 points: (1.96 + 0.84) x 2 x sqrt(2) = 7.9 points;
    # 3 measured seeds: t quantiles with 4 degrees of freedom.
    assert detectable_difference(2.0, 1, measured=False) == pytest.approx(2.8016 * 2 * math.sqrt(2), rel=1e-3)
    assert detectable_difference(2.0, 1, measured=True) is None
    three = (t_quantile(0.975, 4) + t_quantile(0.8, 4)) * 2 * math.sqrt(2 / 3)
    assert detectable_difference(2.0, 3, measured=True) == pytest.approx(three)


def old_rule(accs: dict[int, float], ses: dict[int, float]) -> bool:
    """The cliff before records: 10 points below the running peak and 2 SEs of that fall."""
    peak = min(accs)
    for step in sorted(accs):
        if accs[step] > accs[peak]:
            peak = step
        fall = 100 * (accs[peak] - accs[step])
        if fall >= CLIFF_PP and fall >= 2 * 100 * math.hypot(ses[peak], ses[step]):
            return True
    return False


def cliff_rates(rho: float, runs: int, problems: int, fall_pp: float = 0.0, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    counts = {"old": 0, "unpaired": 0, "paired": 0}
    for _ in range(runs):
        accs, ses, records = run(rng, STEPS, problems, TOY_ACC, rho, fall_at=5 if fall_pp else None, fall_pp=fall_pp)
        counts["old"] += old_rule(accs, ses)
        counts["unpaired"] += peak_drop(accs, ses, validations=VALIDATIONS).cliff  # type: ignore[union-attr]
        counts["paired"] += peak_drop(accs, ses, records=records, validations=VALIDATIONS).cliff  # type: ignore[union-attr]
    return {k: v / runs for k, v in counts.items()}


def test_a_flat_curve_is_rarely_a_cliff_under_the_rule_and_often_under_the_old_one() -> None:
    # Independent answers at the toy world's SE (3.3 points): the simulation, where a
    # flat curve of 11 validations falls 10 points below its running peak in ~39% of runs.
    rates = cliff_rates(rho=0.0, runs=600, problems=TOY_PROBLEMS)
    assert 0.28 <= rates["old"] <= 0.50, rates
    assert rates["unpaired"] <= 0.05 and rates["paired"] <= 0.05, rates


def test_a_flat_curve_with_correlated_problems_stays_under_the_rate() -> None:
    # Problems of their own difficulty (one problem's outcomes correlated 0.5 between
    # validations): pairing removes that spread, and the rule still holds its rate.
    rates = cliff_rates(rho=0.5, runs=600, problems=TOY_PROBLEMS, seed=1)
    assert rates["paired"] <= 0.05 and rates["unpaired"] <= 0.05, rates


def test_the_detector_acts_at_the_first_validation_that_holds_a_cliff() -> None:
    from gridrun.seam.significance import Evaluations, first_cliff

    # SE 1 point per validation (a fall's SE 1.41): 0.40 -> 0.38 -> 0.25 holds a cliff (15
    # points, z 10.6 over 6 validations' bound 2.94) at the third validation, not before.
    accs = {0: 0.40, 5: 0.38, 10: 0.25, 15: 0.20, 20: 0.30, 25: 0.31}
    found = first_cliff(Evaluations.of(accs, {s: 0.01 for s in accs}), FallRule(6))
    assert found is not None and found[0] == 10 and (found[1].peak_step, found[1].step) == (0, 10)
    # A wobble of 8 points is never one, however precise.
    calm = {0: 0.40, 5: 0.32, 10: 0.39}
    assert first_cliff(Evaluations.of(calm, {s: 0.001 for s in calm}), FallRule(3)) is None


# One problem's outcomes at two validations of a toy run correlate at 0.695 (sampled at T 0.7:
# conf=val_sizing, bench/measured/val-sizing-2026-11-28.md).
MEASURED_RHO = 0.695


@pytest.mark.parametrize("fall_at", [5, 10])
def test_a_planted_ten_point_fall_is_found_at_the_toy_validation_size(fall_at: int) -> None:
    from gridrun.tasks.arith import ArithParams

    # The toy world's validation as it ships, paired by problem: a 10-point fall halfway, or
    # before the last validation only (one validation after it), is called a cliff in >= 80%
    # of simulated runs.
    problems = ArithParams().n_val
    rng = np.random.default_rng(fall_at)
    found = 0
    for _ in range(300):
        accs, ses, records = run(rng, STEPS, problems, TOY_ACC, MEASURED_RHO, fall_at=fall_at, fall_pp=10.0)
        found += peak_drop(accs, ses, records=records, validations=VALIDATIONS).cliff  # type: ignore[union-attr]
    assert found / 300 >= 0.8, found


def test_the_selection_bias_collect_reports_is_the_simulators() -> None:
    from statistics import NormalDist

    from gridrun.analysis.summary import MetricColumns, cell_summary

    # Flat runs, every answer independent at 31%: the peak of 11 validations is chosen on val,
    # then measured once on a test split of the same size. Collect's selection_bias_pp (val
    # peak - test at that checkpoint) must average the simulator's truth: the expected maximum
    # of 11 draws above their mean, E[max of 11 standard normals] x the validation's SE.
    rng = np.random.default_rng(11)
    problems, runs = 300, 400
    se = math.sqrt(TOY_ACC * (1 - TOY_ACC) / problems)
    # E[max of n standard normals], by integrating 1 - F(x)^n and F(x)^n over the line.
    grid = [(i + 0.5) / 100 for i in range(-800, 800)]  # midpoints: the integrand jumps at 0
    cdf = NormalDist().cdf
    expected_max = sum((1 - cdf(x) ** VALIDATIONS) if x >= 0 else -(cdf(x) ** VALIDATIONS) for x in grid) / 100
    assert expected_max == pytest.approx(1.586, abs=0.002)
    biases = []
    for _ in range(runs):
        accs = rng.binomial(problems, TOY_ACC, VALIDATIONS) / problems
        rows = [{"step": step, "split": "val", "val/acc": float(a)} for step, a in zip(STEPS, accs)]
        peak = STEPS[int(np.argmax(accs))]
        rows.append({"step": peak, "split": "test", "test/acc": float(rng.binomial(problems, TOY_ACC) / problems)})
        biases.append(cell_summary(MetricColumns.from_rows(rows))["selection_bias_pp"])
    # The mean's Monte-Carlo SE is ~0.06 of the validation's SE here (400 runs).
    assert sum(biases) / runs == pytest.approx(100 * expected_max * se, abs=100 * 0.25 * se)
