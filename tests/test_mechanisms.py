"""Mechanism alerts on metric histories written by hand, each at its threshold's edge: every
firing case sits exactly on the threshold (the comparisons are >=), every silent one just
short of it, with numbers exact in binary floating point."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gridrun.analysis.summary import alert_summary
from gridrun.seam.mechanisms import (
    CANDIDATES,
    LIVE_ALERTS,
    THRESHOLDS,
    MechanismWatch,
    Thresholds,
    alert_flags,
    alert_history,
    applies,
    firings,
)


def train_rows(**series: list[float]) -> list[dict[str, Any]]:
    """Train rows at steps 1..n; keyword `generator_chi2` is `role/generator/chi2`."""
    n = len(next(iter(series.values())))
    return [{"step": s + 1, "split": "train", **{"role/" + k.replace("_", "/", 1): v[s] for k, v in series.items()}}
            for s in range(n)]


# --- gradient_amplification -----------------------------------------------------------------------
def amplification(rows: list[dict[str, Any]], workflow: str = "voting", policy: str = "isolated") -> list[str]:
    return [a for a in alert_history(rows, workflow, policy)[-1][1] if a.startswith("gradient_amplification")]


def test_amplification_fires_at_twice_every_other_roles_chi2_ratio() -> None:
    # Generator 0.25 -> 1.0: ratio 4.0; aggregator 0.5 -> 1.0: ratio 2.0; 4.0 >= 2.0 * 2.0.
    rows = train_rows(generator_chi2=[0.25, 1.0], aggregator_chi2=[0.5, 1.0])
    assert amplification(rows) == ["gradient_amplification: generator chi2 peak/first 4.00 vs aggregator 2.00"]
    # The aggregator peaking at 1.0078125 (ratio 2.015625) needs 4.03125: silent.
    assert amplification(train_rows(generator_chi2=[0.25, 1.0], aggregator_chi2=[0.5, 1.0078125])) == []


def test_amplification_is_the_parallel_roles_under_isolated_policy_only() -> None:
    rows = train_rows(generator_chi2=[0.25, 1.0], aggregator_chi2=[0.5, 1.0])
    assert amplification(rows, policy="shared") == []  # SP's failure surface is capture
    assert amplification(rows, workflow="eval_opt") == []  # no same-role multiplicity
    # The other way round: the aggregator's ratio 4.0 over the generator's 2.0 is not the mechanism.
    assert amplification(train_rows(generator_chi2=[0.5, 1.0], aggregator_chi2=[0.25, 1.0])) == []
    # Orch-Workers: the worker is the parallel role, and must beat every other role's ratio.
    workers = train_rows(worker_chi2=[0.25, 1.0], orchestrator_chi2=[0.5, 1.0], synthesizer_chi2=[0.5, 0.75])
    assert amplification(workers, workflow="orch_workers") == [
        "gradient_amplification: worker chi2 peak/first 4.00 vs orchestrator 2.00"]


def test_amplification_needs_another_role_to_compare() -> None:
    assert amplification(train_rows(generator_chi2=[0.25, 1.0])) == []
    # A perplexity ratio to a non-positive first value is unknown and keeps ppl silent.
    assert amplification(train_rows(generator_ppl=[1.0, 4.0], aggregator_ppl=[0.0, 1.0])) == []


# The smoke demo's Voting-IP aggregator: its data fits one mini-batch, so its chi2 is the
# float rounding of E[rho^2] - 1 on the update's own forward (2.4e-7, 1.6e-7, 6.4e-7, and it
# can be negative). Below the 1e-4 floor every value counts as 1e-4: its ratio is 1.
NOISE = [2.4e-7, 1.6e-7, 6.4e-7]


def test_a_role_whose_chi2_is_rounding_noise_neither_silences_nor_triggers() -> None:
    # Generator 0.001 -> 0.0021 (ratio 2.1) against the aggregator's noise (floored: 1.0):
    # 2.1 >= 2.0 * 1.0 fires. Before the floor the noise's own ratio 2.67 (6.4e-7 / 2.4e-7)
    # silenced it; and a negative first value (-1e-7) made the ratio unknown: silent too.
    rows = train_rows(generator_chi2=[0.001, 0.0015, 0.0021], aggregator_chi2=NOISE)
    assert amplification(rows) == ["gradient_amplification: generator chi2 peak/first 2.10 vs aggregator 1.00"]
    rows = train_rows(generator_chi2=[0.001, 0.0015, 0.0021], aggregator_chi2=[-1e-7, 3e-7, 2e-7])
    assert amplification(rows) == ["gradient_amplification: generator chi2 peak/first 2.10 vs aggregator 1.00"]
    # The parallel role's own noise (2.67 of rounding) does not fire against a flat role.
    rows = train_rows(generator_chi2=NOISE, aggregator_chi2=[0.001, 0.001, 0.001])
    assert amplification(rows) == []
    # Both at rounding level: 1.0 vs 1.0, silent (it used to read 2.67 vs 1.00 the other way).
    assert amplification(train_rows(generator_chi2=NOISE, aggregator_chi2=[1e-7, 1e-7, 1e-7])) == []
    # A value at the floor is no baseline: a warmup from 0 makes every role's first chi2 0
    # (LR 0). From 0 to a flat 0.002 is no amplification (its first off-policy value is its
    # baseline: ratio 1, where the floor would read 20x) ...
    rows = train_rows(generator_chi2=[0.0, 0.002, 0.002], aggregator_chi2=NOISE)
    assert amplification(rows) == []
    # ... and from 0 to 0.001, then 0.0021, is 2.1x its first off-policy value: fires.
    rows = train_rows(generator_chi2=[0.0, 0.001, 0.0021], aggregator_chi2=NOISE)
    assert amplification(rows) == ["gradient_amplification: generator chi2 peak/first 2.10 vs aggregator 1.00"]


def test_ratio_window_compares_means_of_consecutive_steps() -> None:
    # Window 2: first = mean(0.25, 0.25) = 0.25; peak = max mean of 2 consecutive values:
    # (0.25 + 0.75) / 2 = 0.5, then (0.75 + 1.25) / 2 = 1.0 -> ratio 4.0; the aggregator's
    # 0.5, 0.5, 1.0, 1.0 gives 1.0 / 0.5 = 2.0: 4.0 >= 2 * 2.0 fires at step 4, not before.
    windowed = Thresholds(ratio_window=2)
    rows = train_rows(generator_chi2=[0.25, 0.25, 0.75, 1.25], aggregator_chi2=[0.5, 0.5, 1.0, 1.0])
    assert firings(alert_history(rows, "voting", "isolated", windowed), "gradient_amplification") == [4]
    # A one-step spike: window 1 (Table 2's peak/first) fires from step 2 on (1.0 / 0.25 = 4
    # vs 1); window 2 averages it away: first (0.25 + 1.0) / 2 = 0.625 is also the peak.
    spike = train_rows(generator_chi2=[0.25, 1.0, 0.25, 0.25], aggregator_chi2=[0.5, 0.5, 0.5, 0.5])
    assert firings(alert_history(spike, "voting", "isolated"), "gradient_amplification") == [2, 3, 4]
    assert firings(alert_history(spike, "voting", "isolated", windowed), "gradient_amplification") == []


def test_amplification_on_perplexity_alone() -> None:
    # Generator ppl 1.0 -> 1.5 (1.5); aggregator 1.0 -> 1.25 (1.25): 1.5 >= 1.2 * 1.25 = 1.5.
    rows = train_rows(generator_ppl=[1.0, 1.5], aggregator_ppl=[1.0, 1.25])
    assert amplification(rows) == ["gradient_amplification: generator ppl peak/first 1.50 vs aggregator 1.25"]
    assert amplification(train_rows(generator_ppl=[1.0, 1.4921875], aggregator_ppl=[1.0, 1.25])) == []


def test_history_counts_the_steps_it_held() -> None:
    # Step 1: both ratios 1 (silent). Step 2: 4.0 vs 1.0. Step 3: the aggregator's peak 2.0 makes
    # its ratio 4.0: silent again. Step 4: the generator's peak 2.0 (ratio 8.0) vs 4.0: fires.
    rows = [{"step": 0, "split": "val", "val/acc": 0.3}]
    rows += train_rows(generator_chi2=[0.25, 1.0, 0.5, 2.0], aggregator_chi2=[0.5, 0.5, 2.0, 1.0])
    history = alert_history(rows, "voting", "isolated")
    assert [step for step, _ in history] == [1, 2, 3, 4]  # from the first training row on
    assert firings(history, "gradient_amplification") == [2, 4]
    assert firings(history, "sp_role_capture") == []


# --- sp_role_capture ------------------------------------------------------------------------------
EDGE = Thresholds(share_window=2, share_shrink=0.25, gap_close=0.25, terse_drop=0.25)


def capture_rows(generator_shares: list[float], aggregator_len: float, terse: float) -> list[dict[str, Any]]:
    """Voting-SP: validation at steps 0 and 4, four train steps between (shares sum to 1).
    Step 0: aggregator length 10, generator 50 (gap 40), terse rate 0.75."""
    rows: list[dict[str, Any]] = [{"step": 0, "split": "val", "val/role/aggregator/len_mean": 10.0,
                                   "val/role/generator/len_mean": 50.0, "val/role/aggregator/terse_rate": 0.75}]
    rows += train_rows(generator_grad_share=generator_shares, aggregator_grad_share=[1 - s for s in generator_shares])
    rows.append({"step": 4, "split": "val", "val/role/aggregator/len_mean": aggregator_len,
                 "val/role/generator/len_mean": 50.0, "val/role/aggregator/terse_rate": terse})
    return rows


def capture(rows: list[dict[str, Any]], policy: str = "shared", thresholds: Thresholds = EDGE) -> list[str]:
    history = alert_history(rows, "voting", policy, thresholds)
    return [a for a in history[-1][1] if a.startswith("sp_role_capture")] if history else []


RISING = [0.5, 0.5, 0.625, 0.625]  # generator 0.5 -> 0.625: the aggregator's 0.5 -> 0.375, a quarter taken


def test_capture_fires_on_a_rising_share_and_a_closing_length_gap() -> None:
    # Aggregator 10 -> 20: the gap to the generator's 50 goes 40 -> 30 = (1 - 0.25) * 40.
    assert capture(capture_rows(RISING, aggregator_len=20.0, terse=0.75)) == [
        "sp_role_capture: generator grad share 0.50->0.62; aggregator length 10->20 (generator 50)"]
    # 10 -> 19.75 leaves a gap of 30.25: silent.
    assert capture(capture_rows(RISING, aggregator_len=19.75, terse=0.75)) == []


def test_capture_fires_on_a_falling_terse_rate() -> None:
    # 0.75 -> 0.5 is the 0.25 fall; 0.75 -> 0.515625 is short of it.
    assert capture(capture_rows(RISING, aggregator_len=10.0, terse=0.5)) == [
        "sp_role_capture: generator grad share 0.50->0.62; aggregator terse rate 75%->50%"]
    assert capture(capture_rows(RISING, aggregator_len=10.0, terse=0.515625)) == []


def test_capture_needs_the_dominant_share_to_rise() -> None:
    # Last window 0.625 and 0.609375: the aggregator's 0.5 -> 0.3828125, 0.234375 of it taken < 0.25.
    assert capture(capture_rows([0.5, 0.5, 0.625, 0.609375], aggregator_len=40.0, terse=0.0)) == []
    # Under Isolated-Policy there is no shared adapter to capture.
    assert capture(capture_rows(RISING, aggregator_len=40.0, terse=0.0), policy="isolated") == []
    # Three steps: the two 2-step windows would share step 2; nothing is compared.
    short = [r for r in capture_rows(RISING, aggregator_len=40.0, terse=0.0) if r["step"] != 3]
    assert capture(short) == []


def test_capture_sees_a_role_that_owns_nearly_all_of_the_gradient_take_the_rest() -> None:
    # Voting-SP on the toy world: the generator owns ~99% from the first step, so no absolute
    # rise is possible. 31/32 -> 63/64 halves the aggregator's 1/32: at least a quarter taken.
    assert capture(capture_rows([31 / 32, 31 / 32, 63 / 64, 63 / 64], aggregator_len=20.0, terse=0.75)) != []
    # 31/32 -> 47/48 (the rest 1/32 -> 1/48) takes a third; at shrink 0.5 that is too little.
    shares = [31 / 32, 31 / 32, 47 / 48, 47 / 48]
    assert capture(capture_rows(shares, aggregator_len=20.0, terse=0.75)) != []
    half = Thresholds(share_window=2, share_shrink=0.5, gap_close=0.25, terse_drop=0.25)
    assert capture(capture_rows(shares, aggregator_len=20.0, terse=0.75), thresholds=half) == []


def test_capture_length_must_move_toward_the_dominant_role() -> None:
    # The aggregator shrinking 10 -> 5 widens the gap: no capture, though the share rose.
    assert capture(capture_rows(RISING, aggregator_len=5.0, terse=0.75)) == []
    # Overshooting past the generator (10 -> 70, gap 40 -> -20, |20| <= 30) still moved toward it.
    assert capture(capture_rows(RISING, aggregator_len=70.0, terse=0.75)) != []


def test_watch_sees_rows_one_at_a_time_like_the_replay() -> None:
    rows = capture_rows(RISING, aggregator_len=20.0, terse=0.5)
    watch = MechanismWatch("voting", "shared", EDGE)
    seen = [watch.see(row) for row in rows]
    # Only the step-4 validation shows the drift: every earlier row is silent.
    assert seen[:-1] == [[]] * (len(rows) - 1) and len(seen[-1]) == 1
    assert firings(alert_history(rows, "voting", "shared", EDGE), "sp_role_capture") == [4]


def test_capture_ignores_a_role_whose_chi2_is_rounding_noise() -> None:
    # sp_role_capture reads gradient shares and signatures, never chi2: the same rows with
    # an aggregator chi2 of rounding noise (or none) give the same verdict.
    rows = capture_rows(RISING, aggregator_len=20.0, terse=0.75)
    noisy = [{**row, "role/aggregator/chi2": 2.4e-7} if row["split"] == "train" else row for row in rows]
    assert capture(noisy) == capture(rows) != []


# --- signature_drift and non_finite ---------------------------------------------------------------
def val_row(step: int, **signature: float) -> dict[str, Any]:
    return {"step": step, "split": "val", **{f"val/role/{k.replace('_', '/', 1)}": v for k, v in signature.items()}}


def test_signature_drift_against_the_first_validation() -> None:
    # Terse rate 0.5 -> 0.24 halves (< 0.25) from at least 0.5; box rate 0.4 is below the 0.5
    # floor, so its fall says nothing; code fences 0.1 -> 0.25 cross 0.2; p95 reaches the cap 48;
    # slots' Jaccard 0.6 -> 0.95 crosses 0.9 from below 0.7.
    rows = [val_row(0, aggregator_terse_rate=0.5, generator_box_rate=0.4, evaluator_code_fence_rate=0.1,
                    generator_len_p95=40.0, generator_slot_jaccard3=0.6),
            {"step": 1, "split": "train"},
            {**val_row(1, aggregator_terse_rate=0.24, generator_box_rate=0.1, evaluator_code_fence_rate=0.25,
                       generator_len_p95=48.0, generator_slot_jaccard3=0.95), "val/response_cap": 48}]
    alerts = alert_history(rows, "voting", "shared")[-1][1]
    assert alerts == ["signature_drift: aggregator terse rate 50%->24%", "signature_drift: evaluator writes code 25%",
                      "signature_drift: generator p95 length at cap",
                      "signature_drift: generator slots collapsed (jaccard 0.95)"]
    # A terse rate of 0.25 is exactly half: not below it, silent; no cap on the row (a run
    # logged before the trainer wrote it): lengths unchecked.
    rows[-1] = val_row(1, aggregator_terse_rate=0.25, generator_len_p95=48.0)
    assert alert_history(rows, "voting", "shared")[-1][1] == []


def test_non_finite_steps_sum_over_train_rows() -> None:
    rows = [{"step": 1, "split": "train", "train/skipped_nonfinite": 2},
            {"step": 2, "split": "train", "train/skipped_nonfinite": 0},
            {"step": 3, "split": "train", "train/skipped_nonfinite": 1}]
    history = alert_history(rows, "single", None)
    assert [alerts for _, alerts in history] == [
        ["non_finite: 2 optimizer steps skipped"]] * 2 + [["non_finite: 3 optimizer steps skipped"]]


def test_default_thresholds() -> None:
    # The documented defaults (docs/cell.md, mechanisms.py): provisional until the mechanisms study.
    assert THRESHOLDS == Thresholds(chi2_factor=2.0, ppl_factor=1.2, chi2_floor=1e-4, ratio_window=1,
                                    share_window=5, share_shrink=0.25, gap_close=0.25, terse_drop=0.2,
                                    rate_floor=0.5, fence_rate=0.2, trunc_rate=0.2, jaccard_high=0.9,
                                    jaccard_low=0.7, signal_window=3, entropy_fall=0.5, length_rise=2.0,
                                    length_fall=0.5, trunc_level=0.2, grad_norm_factor=5.0, zero_var_level=0.5)


def test_the_sp_signature_alone_is_the_drift_toward_the_dominant_role() -> None:
    # Voting-SP: the generator owns 99% of the gradient throughout (no share taken: the
    # alert's share test fails), and the aggregator's terse rate falls 100% -> 90% -> 10%
    # while its length moves 6 -> 6 -> 30 tokens (the generator's 19): the signature holds at
    # the step-6 validation (a 90-point terse fall), not at step 3 (10 points, under the
    # default terse_drop of 20), and the alert never fires.
    from gridrun.seam.mechanisms import signature_steps

    rows: list[dict] = []
    for step, terse, length in ((0, 1.0, 6.0), (3, 0.9, 6.0), (6, 0.1, 30.0)):
        if step:
            rows += [{"step": s, "split": "train", "role/generator/grad_share": 0.99, "role/aggregator/grad_share": 0.01}
                     for s in range(step - 2, step + 1)]
        rows.append({"step": step, "split": "val", "val/role/aggregator/terse_rate": terse,
                     "val/role/aggregator/len_mean": length, "val/role/generator/len_mean": 19.0})
    assert signature_steps(rows, "voting", "shared") == [6]
    assert firings(alert_history(rows, "voting", "shared"), "sp_role_capture") == []
    # Under IP there is no shared adapter to capture.
    assert signature_steps(rows, "voting", "isolated") == []


# --- the candidate collapse signals ---------------------------------------------------------------
# A 2-step window: "first" is steps 1-2's mean, "now" the last two steps', known from step 4 on
# (the windows disjoint).
PAIRS = dataclasses.replace(THRESHOLDS, signal_window=2)


def fired(rows: list[dict[str, Any]], signal: str, thresholds: Thresholds = PAIRS, workflow: str = "voting",
          policy: str | None = "isolated") -> list[int]:
    return firings(alert_history(rows, workflow, policy, thresholds), signal)


def test_entropy_collapse_fires_when_the_last_window_is_half_the_first() -> None:
    # First (1 + 1) / 2 = 1; step 4's (0.75 + 0.25) / 2 = 0.5 <= 0.5 x 1. Step 3 has one
    # value before the last window: not yet known.
    assert fired(train_rows(generator_entropy=[1.0, 1.0, 0.75, 0.25]), "entropy_collapse") == [4]
    # (0.75 + 0.3125) / 2 = 0.53125: above half, silent.
    assert fired(train_rows(generator_entropy=[1.0, 1.0, 0.75, 0.3125]), "entropy_collapse") == []
    # A later window that recovers clears it: step 5's (0.25 + 1) / 2 = 0.625.
    assert fired(train_rows(generator_entropy=[1.0, 1.0, 0.75, 0.25, 1.0]), "entropy_collapse") == [4]


def test_length_blowup_and_collapse_are_the_two_directions() -> None:
    # 100 -> (150 + 250) / 2 = 200 = 2 x 100: a blowup; 199.5 is not. 100 -> 50 = 0.5 x 100: a collapse; 51 is not.
    up, short_of_up = train_rows(aggregator_len_mean=[100.0, 100.0, 150.0, 250.0]), train_rows(
        aggregator_len_mean=[100.0, 100.0, 150.0, 249.0])
    down, short_of_down = train_rows(aggregator_len_mean=[100.0, 100.0, 50.0, 50.0]), train_rows(
        aggregator_len_mean=[100.0, 100.0, 50.0, 52.0])
    assert (fired(up, "length_blowup"), fired(up, "length_collapse")) == ([4], [])
    assert (fired(down, "length_collapse"), fired(down, "length_blowup")) == ([4], [])
    assert fired(short_of_up, "length_blowup") == fired(short_of_down, "length_collapse") == []
    assert alert_history(up, "voting", "isolated", PAIRS)[-1][1] == ["length_blowup: aggregator length 100->200"]


def test_truncation_spike_needs_a_rise_from_at_most_the_level() -> None:
    level = dataclasses.replace(PAIRS, trunc_level=0.25)
    # First (0.25 + 0.25) / 2 = 0.25 <= 0.25, now 0.5 > 0.25: fires; now exactly 0.25: silent (strictly above).
    assert fired(train_rows(generator_trunc_rate=[0.25, 0.25, 0.5, 0.5]), "truncation_spike", level) == [4]
    assert fired(train_rows(generator_trunc_rate=[0.25, 0.25, 0.25, 0.25]), "truncation_spike", level) == []
    # Truncated from the start (first 0.375): no spike, however high it goes.
    assert fired(train_rows(generator_trunc_rate=[0.5, 0.25, 1.0, 1.0]), "truncation_spike", level) == []


def test_grad_norm_spike_is_against_the_median_before_the_last_window() -> None:
    # Step 4: median of [1, 2] = 1.5, now (3 + 10) / 2 = 6.5 < 5 x 1.5. Step 5: median of
    # [1, 2, 3] = 2, now (10 + 10) / 2 = 10 >= 5 x 2: fires. With 9.5 at step 5: 9.75, silent.
    assert fired(train_rows(generator_grad_norm=[1.0, 2.0, 3.0, 10.0, 10.0]), "grad_norm_spike") == [5]
    assert fired(train_rows(generator_grad_norm=[1.0, 2.0, 3.0, 10.0, 9.5]), "grad_norm_spike") == []


def test_grad_norm_spike_reads_a_shared_adapter_and_skips_an_adapter_named_after_its_role() -> None:
    norms = [1.0, 2.0, 3.0, 10.0, 10.0]
    shared = [{"step": s + 1, "split": "train", "adapter/shared/grad_norm": v} for s, v in enumerate(norms)]
    assert alert_history(shared, "voting", "shared", PAIRS)[-1][1] == [
        "grad_norm_spike: adapter shared grad norm 10 vs median 2"]
    # Isolated-Policy: adapter `generator` is the role's own series; the alert names it once.
    isolated = [{**row, "role/generator/grad_norm": row["adapter/shared/grad_norm"], "adapter/generator/grad_norm":
                 row["adapter/shared/grad_norm"]} for row in shared]
    assert [a for a in alert_history(isolated, "voting", "isolated", PAIRS)[-1][1] if a.startswith("grad_norm")] == [
        "grad_norm_spike: generator grad norm 10 vs median 2; adapter shared grad norm 10 vs median 2"]


def test_zero_variance_fires_when_the_share_rises_to_the_level() -> None:
    # First (0.25 + 0.5) / 2 = 0.375 < 0.5, now 0.5 >= 0.5: fires; now (0.5 + 0.375) / 2 = 0.4375: silent.
    assert fired(train_rows(aggregator_zero_var_share=[0.25, 0.5, 0.5, 0.5]), "zero_variance") == [4]
    assert fired(train_rows(aggregator_zero_var_share=[0.25, 0.5, 0.5, 0.375]), "zero_variance") == []
    # At the level from the start: nothing rose.
    assert fired(train_rows(aggregator_zero_var_share=[0.5, 0.5, 1.0, 1.0]), "zero_variance") == []


def test_a_run_without_a_signals_metric_keeps_it_silent() -> None:
    # Rows from before the metric was logged (chi2 only), or holding a non-number: no series.
    old = train_rows(generator_chi2=[0.5, 0.5, 0.5, 0.5, 0.5])
    broken = [{**row, "role/generator/entropy": value} for row, value in zip(old, [1.0, None, float("nan"), "x", 0.0])]
    for rows in (old, broken):
        history = alert_history(rows, "voting", "isolated", PAIRS)
        assert all(firings(history, signal) == [] for signal in CANDIDATES)
    # The summary's columns for it: replayed, never fired.
    summary = alert_summary(old, "voting", "isolated", PAIRS)
    assert (summary["alert/entropy_collapse/fired"], summary["alert/entropy_collapse/first_step"]) == (0, None)


def test_the_watch_runs_only_the_signals_it_is_given() -> None:
    rows = train_rows(generator_entropy=[1.0, 1.0, 0.25, 0.25], generator_len_mean=[10.0, 10.0, 40.0, 40.0])
    live = MechanismWatch("voting", "isolated", PAIRS, signals=LIVE_ALERTS)
    listed = MechanismWatch("voting", "isolated", PAIRS, signals=["entropy_collapse"])
    for row in rows:
        quiet, heard = live.see(row), listed.see(row)
    assert quiet == [] and heard == ["entropy_collapse: generator entropy 1->0.25"]
    assert listed.flagged == ("gradient_amplification", "sp_role_capture", "entropy_collapse")
    assert alert_flags(heard, listed.flagged)["alert/entropy_collapse"] == 1
    with pytest.raises(ValueError, match="unknown alert 'entropy'"):
        MechanismWatch("voting", "isolated", signals=["entropy"])
    assert all(applies(signal, "single", None) for signal in CANDIDATES)
