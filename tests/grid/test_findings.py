"""The findings table, the mechanism-alert counts and Table 1's shuffled columns, through
`gridrun collect` on a sweep written by hand (three seeds; every number worked out below).

t(2) = 4.303 for three seeds: values 10, 12, 14 have mean 12, sd 2, se 2/sqrt(3) = 1.1547 and
half-width 4.97; values with sd 1 have half-width 2.48; with sd 10, 24.84."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gridrun.analysis.findings import FINDINGS_COLUMNS, STATEMENTS, findings_table, verdict
from gridrun.grid.sweepdir import SweepDir
from tests.grid.conftest import Gridrun
from tests.grid.test_analysis import add_cell, coords

VERDICT = FINDINGS_COLUMNS.index("verdict")

SEEDS = (0, 1, 2)


def rows(val_acc: dict[int, float], train: dict[str, list[float]] | None = None,
         signatures: dict[str, tuple[float, float]] | None = None) -> list[dict[str, Any]]:
    """Train rows at steps 1..n and validations, in step order (a step's train row first);
    signatures at the first and last validation."""
    train = train or {}
    n = len(next(iter(train.values()))) if train else 0
    out: list[dict[str, Any]] = [{"step": s + 1, "split": "train", **{k: v[s] for k, v in train.items()}} for s in range(n)]
    steps = sorted(val_acc)
    for step in steps:
        row: dict[str, Any] = {"step": step, "split": "val", "val/acc": val_acc[step]}
        for key, (first, last) in (signatures or {}).items():
            if step in (steps[0], steps[-1]):
                row[key] = first if step == steps[0] else last
        out.append(row)
    return sorted(out, key=lambda r: (r["step"], r["split"] != "train"))  # as the trainer writes them


# Voting-IP: generator chi2 0.25 -> 1.0, 1.25, 1.5 (ratios 4, 5, 6) against the aggregator's
# 0.5 -> 1.0 (ratio 2); perplexity 1.0 -> 1.5 against 1.0 -> 1.25 in every seed.
def voting_ip_train(seed: int) -> dict[str, list[float]]:
    return {"role/generator/chi2": [0.25, 1.0 + 0.25 * seed], "role/aggregator/chi2": [0.5, 1.0],
            "role/generator/ppl": [1.0, 1.5], "role/aggregator/ppl": [1.0, 1.25]}


@pytest.fixture
def study(results: Path) -> SweepDir:
    sweep = SweepDir(results, "study")
    data: dict = {"name": "study", "cells": [], "plans": []}
    add_cell(sweep, data, "base-voting-1.7b-math", "base", coords("voting", None, None), "done", rows({0: 0.40}))
    add_cell(sweep, data, "base-eval_opt-1.7b-math", "base", coords("eval_opt", None, None), "done", rows({0: 0.30}))
    add_cell(sweep, data, "base-single-1.7b-math", "base", coords("single", None, None), "done", rows({0: 0.35}))
    for seed in SEEDS:
        # Voting-IP peaks 56, 58, 60 at step 1 and stays there; SP peaks 46, 44, 42 and ends 4 lower.
        ip_peak, sp_peak = 0.56 + 0.02 * seed, 0.46 - 0.02 * seed
        add_cell(sweep, data, f"voting-ip-1.7b-math-s{seed}", "train", coords("voting", "isolated", seed), "done",
                 rows({0: 0.40, 1: ip_peak, 2: ip_peak}, voting_ip_train(seed)))
        # SP: the aggregator's terse rate 0.9 -> 0.6, 0.5, 0.4; its length 10 -> 10, 11, 9. Two
        # training steps: too few for sp_role_capture's 5-step windows.
        add_cell(sweep, data, f"voting-sp-1.7b-math-s{seed}", "train", coords("voting", "shared", seed), "done",
                 rows({0: 0.40, 1: sp_peak, 2: sp_peak - 0.04},
                      {"role/generator/grad_share": [0.5, 0.9], "role/aggregator/grad_share": [0.5, 0.1]},
                      {"val/role/aggregator/terse_rate": (0.9, 0.6 - 0.1 * seed),
                       "val/role/aggregator/len_mean": (10.0, [10.0, 11.0, 9.0][seed])}))
        # Eval-Opt-IP only falls from its step 0 (the base model's 30): its peak is step 0's.
        add_cell(sweep, data, f"eval_opt-ip-1.7b-math-s{seed}", "train", coords("eval_opt", "isolated", seed), "done",
                 rows({0: 0.30, 1: 0.26 - 0.01 * seed}))
        # The reward controls: Voting-IP's twin peaks at 45; SA-RL and its twin both at 50.
        add_cell(sweep, data, f"shuffled-voting-ip-1.7b-math-s{seed}", "shuffled", coords("voting", "isolated", seed),
                 "done", rows({0: 0.40, 1: 0.45}))
        add_cell(sweep, data, f"sa_rl-1.7b-math-s{seed}", "sa_rl", coords("single", None, seed), "done",
                 rows({0: 0.35, 1: 0.50}))
        add_cell(sweep, data, f"shuffled-sa_rl-1.7b-math-s{seed}", "shuffled", coords("single", None, seed), "done",
                 rows({0: 0.35, 1: 0.50}))
    sweep.write(data)
    return sweep


def findings(sweep: SweepDir) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(sweep.table("findings", "csv").read_text())))


def claim_rows(table: list[dict[str, str]], claim: str) -> list[dict[str, str]]:
    return [r for r in table if r["claim"] == claim]


def test_claims_measured_with_intervals_over_seeds(gridrun: Gridrun, study: SweepDir) -> None:
    result = gridrun("collect", "conf=study")
    assert result.code == 0, result.err
    table = findings(study)
    a = {(r["measurement"], r["workflow"], r["policy"]): r for r in claim_rows(table, "a")}
    # Voting-IP over base: 16, 18, 20 pp -> 18 ± 4.97: holds.
    over_base = a[("peak − base", "voting", "IP")]
    assert (over_base["n"], over_base["mean"], over_base["ci95"], over_base["verdict"]) == ("3", "18.00", "4.97", "holds")
    # Voting-SP: 6, 4, 2 -> 4 ± 4.97: inconclusive. Eval-Opt-IP: 0 in every seed, 0 ± 0: does
    # not hold. 1 of 3 holds, and the inconclusive one cannot make a majority either way: the
    # part is inconclusive.
    assert a[("peak − base", "voting", "SP")]["verdict"] == "inconclusive"
    eval_opt = a[("peak − base", "eval_opt", "IP")]
    assert (eval_opt["mean"], eval_opt["ci95"], eval_opt["verdict"]) == ("0.00", "0.00", "does not hold")
    assert a[("beats base in most cells", "", "")]["verdict"] == "inconclusive"
    # Over the shuffled twin at the end, paired by seed: 56, 58, 60 against 45 -> 11, 13, 15
    # -> 13 ± 4.97: holds (Voting-IP has the only twins).
    shuffled = a[("final − shuffled twin's final", "voting", "IP")]
    assert (shuffled["mean"], shuffled["ci95"], shuffled["verdict"]) == ("13.00", "4.97", "holds")
    assert a[("beats its shuffled control in most cells", "", "")]["verdict"] == "holds"
    # SA-RL equals its shuffled twin in every seed: 0 ± 0, which does not hold (shown, not counted).
    control = a[("SA-RL final − shuffled SA-RL final", "single", "")]
    assert (control["mean"], control["ci95"], control["verdict"]) == ("0.00", "0.00", "does not hold")
    assert claim_rows(table, "a")[0]["verdict"] == "inconclusive"

    b = {r["measurement"]: r for r in claim_rows(table, "b")}
    # IP - SP peaks: 10, 14, 18 -> 14 ± 9.94 (sd 4): holds. IP never falls, SP falls 4: IP's
    # fall minus SP's is -4 in every seed: does not hold, so claim (b) does not hold.
    assert (b["peak"]["mean"], b["peak"]["ci95"], b["peak"]["verdict"]) == ("14.00", "9.94", "holds")
    assert (b["fall from peak to the end"]["mean"], b["fall from peak to the end"]["verdict"]) == ("-4.00", "does not hold")
    assert b[STATEMENTS["b"]]["verdict"] == "does not hold"

    c = {r["measurement"]: r for r in claim_rows(table, "c")}
    # chi2 ratios 4, 5, 6 minus 2 -> 2, 3, 4: 3 ± 2.48; perplexity 1.5 - 1.25 = 0.25 in every seed.
    assert (c["generator − aggregator χ² peak/first"]["mean"], c["generator − aggregator χ² peak/first"]["ci95"]) == (
        "3.00", "2.48")
    assert c["generator − aggregator perplexity peak/first"]["mean"] == "0.25"
    assert claim_rows(table, "c")[0]["verdict"] == "holds"

    d = {r["measurement"]: r for r in claim_rows(table, "d")}
    # Terse rate -30, -40, -50 pp -> -40 ± 24.84: fell. Length 0, +1, -1 -> 0 ± 2.48: inconclusive.
    terse = d["aggregator terse rate, last − first validation"]
    assert (terse["mean"], terse["ci95"], terse["verdict"]) == ("-40.00", "24.84", "holds")
    assert d["aggregator mean length, last − first validation"]["verdict"] == "inconclusive"
    assert claim_rows(table, "d")[0]["verdict"] == "inconclusive"

    md = study.report("md").read_text()
    assert "## Findings" in md and "|  | peak − base | math 1.7b voting IP | +18.00 ± 4.97 pp (n=3) | holds |" in md
    # Every row names its test and what it could detect: 3 paired seeds with a spread of 2
    # points detect (t(0.975, 2) + t(0.8, 2)) x 2 / sqrt(3) = 6.19 points.
    assert "| t over 3 seeds paired by number; detects 6.19 pp |" in md


def test_a_claim_without_its_cells_is_not_measured(gridrun: Gridrun, study: SweepDir) -> None:
    assert gridrun("collect", "conf=study").code == 0
    cells = pd.read_parquet(study.cells_parquet)
    table = findings_table(cells[cells["workflow"] != "voting"])
    verdicts = {row[0]: row[VERDICT] for row in table.rows if row[1] in STATEMENTS.values()}
    assert verdicts["b"] == "not measured (needs IP and SP `train` cells of the same workflow, task and scale)"
    assert verdicts["c"] == "not measured (needs Voting-IP `train` cells)"
    assert verdicts["d"] == "not measured (needs Voting-SP `train` cells)"
    # (a) is measured against base only: its shuffled part says what it needs (SA-RL's control
    # check is shown but not counted), so the base part's verdict is the claim's where measured.
    parts = {row[1]: row[VERDICT] for row in table.rows if row[0] == "a"}
    assert parts["beats its shuffled control in most cells"] == (
        "not measured (needs `shuffled` cells: add `shuffled` to the sweep's `kind` axis)")
    assert parts["beats base in most cells"] == "does not hold"  # Eval-Opt-IP alone, 0 ± 0
    assert verdicts["a"] == "does not hold"


def test_verdict_at_the_intervals_edge() -> None:
    # One seed has no interval; an interval touching 0 from above is inconclusive, from below
    # (or a point at 0) does not hold; a claimed fall (sign -1) reads the values flipped.
    assert verdict([5.0]) == "inconclusive"
    assert verdict([1.0, 1.0]) == "holds"  # 1 ± 0
    assert verdict([0.0, 0.0]) == "does not hold"
    assert verdict([-1.0, 1.0]) == "inconclusive"
    assert verdict([-3.0, -3.0], sign=-1) == "holds"


def test_alerts_fired_per_cell_and_against_the_peak(gridrun: Gridrun, study: SweepDir) -> None:
    assert gridrun("collect", "conf=study").code == 0
    table = list(csv.DictReader(io.StringIO(study.table("findings_alerts", "csv").read_text())))
    by_cell = {(r["cell"], r["mechanism"]): r for r in table}
    # Voting-IP: ratios 1 vs 1 at step 1, chi2 4 vs 2 at step 2 (fires); the peak was step 1: +1.
    assert by_cell[("voting-ip-1.7b-math-s0", "gradient_amplification")] == {
        "cell": "voting-ip-1.7b-math-s0", "state": "done", "mechanism": "gradient_amplification",
        "fired_steps": "1", "steps": "2", "first_step": "2", "peak_step": "1", "first_minus_peak": "+1"}
    # Voting-SP: two training steps never fill two 5-step windows: evaluated, never fired.
    sp = by_cell[("voting-sp-1.7b-math-s0", "sp_role_capture")]
    assert (sp["fired_steps"], sp["steps"], sp["first_step"], sp["first_minus_peak"]) == ("0", "2", "", "")
    # Cells that cannot show a mechanism (Eval-Opt has no parallel role; SA-RL one role) are not listed.
    assert {cell for cell, _ in by_cell} == {f"voting-{p}-1.7b-math-s{s}" for p in ("ip", "sp") for s in SEEDS}
    cells = pd.read_parquet(study.cells_parquet).set_index("cell")
    assert cells.loc["voting-ip-1.7b-math-s0", "mechanism_alerts"] == (
        "gradient_amplification: generator chi2 peak/first 4.00 vs aggregator 2.00; "
        "generator ppl peak/first 1.50 vs aggregator 1.25")
    assert pd.isna(cells.loc["eval_opt-ip-1.7b-math-s0", "alert/gradient_amplification/fired"])


def test_table1_shows_the_shuffled_twins(gridrun: Gridrun, study: SweepDir) -> None:
    assert gridrun("collect", "conf=study").code == 0
    table1 = {r["workflow"]: r for r in csv.DictReader(io.StringIO(study.table1("csv").read_text()))}
    # Columns for the kinds of twin the sweep has (SA-RL's and IP's; no SP twin), after the rest.
    header = list(table1["voting"])
    assert header[:11] == ["task", "scale", "workflow", "base", "sa_rl", "ip", "sp", "ip_minus_sa", "sp_minus_sa",
                           "sa_rl_shuffled", "ip_shuffled"]
    assert (table1["voting"]["ip"], table1["voting"]["ip_shuffled"], table1["voting"]["ip_shuffled_n"]) == ("58.0", "45.0", "3")
    assert table1["voting"]["sa_rl_shuffled"] == "50.0"
    assert table1["eval_opt"]["ip_shuffled"] == "missing"  # no twin planned for Eval-Opt-IP
    md = study.table1("md").read_text()
    assert "IP shuffled" in md and "SP shuffled" not in md
    # Each value beside its test column (these hand-made cells have no test row).
    assert ("| math | 1.7b | voting | 40.0 (n=1) | *no test* | 50.0 ± 0.0 (n=3) | *no test* | 58.0 ± 5.0 (n=3) "
            "| *no test* |") in md
