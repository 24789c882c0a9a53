"""The analysis against metric files written by hand: every per-cell statistic, the Table 2
ratios (per role and for SP's shared adapter), cliff detection, Tables 3-6, metrics.parquet,
the report and `gridrun.results`, with the numbers worked out in the comments."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gridrun.analysis.summary import MetricColumns, cell_hours, cell_summary, cliff
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.cellstate import CellState, StateRecord
from tests.grid.conftest import Gridrun
from tests.states import put_state

# --- a Voting-IP cell, four training steps and five validations ----------------------------------
VAL_ACC = {0: 0.40, 10: 0.55, 20: 0.60, 30: 0.45, 40: 0.50}
TRAIN = {  # metric -> values at steps 1..4
    "reward/acc": [0.30, 0.50, 0.45, 0.20],
    "role/generator/chi2": [0.02, 0.05, 0.08, 0.04],
    "role/aggregator/chi2": [0.10, 0.12, 0.11, 0.10],
    "role/generator/ppl": [1.5, 1.8, 2.4, 2.1],
    "role/aggregator/ppl": [1.2, 1.2, 1.3, 1.25],
    "role/generator/grad_norm": [0.5, 0.6, 1.0, 0.8],
    "role/aggregator/grad_norm": [0.4, 0.4, 0.5, 0.3],
    "adapter/generator/grad_norm": [0.5, 0.7, 1.5, 0.9],
    "adapter/aggregator/grad_norm": [0.4, 0.4, 0.5, 0.3],
    "role/generator/entropy": [2.0, 1.8, 1.0, 1.2],
    "role/aggregator/entropy": [1.0, 1.0, 1.0, 1.0],
    "role/generator/tokens": [300, 300, 300, 300],
    "role/aggregator/tokens": [100, 100, 100, 100],
    "role/generator/opt_steps": [3, 3, 3, 3],
    "role/aggregator/opt_steps": [1, 1, 1, 1],
}
SIGNATURES = {  # validation signatures at steps 0, 20 (the peak) and 40
    "val/role/generator/len_mean": [20.0, 24.0, 31.0],
    "val/role/aggregator/terse_rate": [0.9, 0.8, 0.3],
}


def rows_of(train: dict[str, list[float]], val_acc: dict[int, float], signatures: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    steps = range(1, 1 + len(next(iter(train.values())))) if train else []
    rows = [{"step": s, "split": "train", **{k: v[i] for k, v in train.items()}} for i, s in enumerate(steps)]
    val_rows = [{"step": s, "split": "val", "val/acc": a} for s, a in sorted(val_acc.items())]
    for key, values in (signatures or {}).items():
        for row, value in zip((r for r in val_rows if r["step"] in (0, 20, 40)), values):
            row[key] = value
    # As the trainer writes them: the validation of step s after training step s.
    return sorted(rows + val_rows, key=lambda row: (row["step"], row["split"] == "val"))


def test_every_per_cell_statistic() -> None:
    summary = cell_summary(MetricColumns.from_rows(rows_of(TRAIN, VAL_ACC)))
    assert summary["val_acc_step0"] == 0.40
    assert (summary["peak_val_acc"], summary["peak_step"]) == (0.60, 20)
    assert (summary["final_val_acc"], summary["final_step"]) == (0.50, 40)
    assert summary["drop_from_peak"] == pytest.approx(-0.10)  # 0.50 - 0.60
    # Changes: +0.15 @10, +0.05 @20, -0.15 @30, +0.05 @40: the cliff lands on step 30.
    assert summary["cliff_drop"] == pytest.approx(-0.15) and summary["cliff_step"] == 30
    # reward/acc 0.30, 0.50, 0.45, 0.20.
    assert (summary["train_acc_start"], summary["train_acc_peak"], summary["train_acc_end"]) == (0.30, 0.50, 0.20)
    assert summary["max_chi2"] == 0.12  # the aggregator's step 2, above the generator's 0.08
    assert summary["max_grad_norm"] == 1.5  # adapter/generator at step 3 (the role's own is 1.0)
    # Entropy weighted 300:100 tokens: (2.0*300 + 1.0*100)/400 = 1.75 at step 1, (1.0*300 + 100)/400
    # = 1.0 at step 3 (the minimum): collapse 0.75.
    assert summary["entropy_collapse"] == pytest.approx(0.75)
    # Table 2, per role: peak over the first step's value, and chi2's peak step.
    assert summary["role/generator/chi2_ratio"] == pytest.approx(4.0)  # 0.08 / 0.02
    assert summary["role/generator/chi2_peak_step"] == 3
    assert summary["role/generator/ppl_ratio"] == pytest.approx(1.6)  # 2.4 / 1.5
    assert summary["role/generator/grad_norm_ratio"] == pytest.approx(2.0)  # 1.0 / 0.5
    assert summary["role/aggregator/chi2_ratio"] == pytest.approx(1.2)  # 0.12 / 0.10
    assert summary["role/aggregator/chi2_peak_step"] == 2
    assert summary["role/aggregator/ppl_ratio"] == pytest.approx(1.3 / 1.2)
    assert summary["role/aggregator/grad_norm_ratio"] == pytest.approx(1.25)  # 0.5 / 0.4
    assert (summary["role/generator/opt_steps"], summary["role/aggregator/opt_steps"]) == (3.0, 1.0)
    # Two adapters (IP): no shared-adapter row.
    assert not any(key.startswith("adapter/") for key in summary)


def test_shared_adapter_row_weights_roles_by_their_tokens() -> None:
    train = {
        "role/generator/chi2": [0.02, 0.06, 0.04], "role/aggregator/chi2": [0.10, 0.10, 0.10],
        "role/generator/ppl": [2.0, 2.0, 2.0], "role/aggregator/ppl": [1.0, 3.0, 1.0],
        "role/generator/tokens": [300, 300, 300], "role/aggregator/tokens": [100, 100, 100],
        "adapter/shared/grad_norm": [1.0, 2.0, 1.5],
    }
    summary = cell_summary(MetricColumns.from_rows(rows_of(train, {0: 0.4})))
    # chi2: (0.02*300 + 0.10*100)/400 = 0.04, then 0.07, 0.055 -> 0.07 / 0.04 = 1.75 at step 2.
    assert summary["adapter/shared/chi2_ratio"] == pytest.approx(1.75)
    assert summary["adapter/shared/chi2_peak_step"] == 2
    # ppl: (2.0*300 + 1.0*100)/400 = 1.75, then (600 + 300)/400 = 2.25 -> 2.25 / 1.75.
    assert summary["adapter/shared/ppl_ratio"] == pytest.approx(2.25 / 1.75)
    assert summary["adapter/shared/grad_norm_ratio"] == pytest.approx(2.0)
    # The roles' own rows stay: the aggregator's ppl triples at step 2 while sharing the adapter.
    assert summary["role/aggregator/ppl_ratio"] == pytest.approx(3.0)


def test_missing_metrics_and_zero_first_values_give_no_number() -> None:
    # Only validation rows (a base control): every training statistic is None, not 0.
    summary = cell_summary(MetricColumns.from_rows(rows_of({}, {0: 0.3})))
    assert summary["peak_val_acc"] == 0.3 and summary["cliff_drop"] is None and summary["cliff_step"] is None
    for key in ("train_acc_start", "max_chi2", "max_grad_norm", "entropy_collapse"):
        assert summary[key] is None
    # chi2 logged as E[rho^2]-1 starts at 0 on-policy (LR 0 under the warmup): a ratio to 0
    # says nothing, so its baseline is its first value above the alerts' floor (1e-4):
    # 0 -> 0.05 -> 0.2 is 4x; a chi2 never above the floor (always on-policy) is 1x. A metric
    # the trainer does not log (here ppl) gives no column value.
    summary = cell_summary(MetricColumns.from_rows(rows_of({"role/generator/chi2": [0.0, 0.05, 0.2],
                                                            "role/aggregator/chi2": [0.0, 2e-7, -1e-7]}, {})))
    assert summary["role/generator/chi2_ratio"] == pytest.approx(4.0) and summary["role/generator/chi2_peak_step"] == 3
    assert summary["role/aggregator/chi2_ratio"] == 1.0
    assert summary["role/generator/ppl_ratio"] is None and summary["val_acc_step0"] is None


def test_cliff_detection() -> None:
    assert cliff({0: 0.2, 10: 0.3, 20: 0.5}) == (0.0, None)  # never fell
    assert cliff({0: 0.2}) == (None, None)  # one validation: nothing between
    # Two equal drops (0.5 -> 0.4 at 10 and 30): the first is reported.
    change, step = cliff({0: 0.5, 10: 0.4, 20: 0.5, 30: 0.4})
    assert change == pytest.approx(-0.1) and step == 10
    # The largest single drop, not the drop from peak: 0.6 -> 0.55 -> 0.35 -> 0.3.
    change, step = cliff({0: 0.6, 10: 0.55, 20: 0.35, 30: 0.3})
    assert change == pytest.approx(-0.2) and step == 20


def test_cell_hours_add_up_every_attempt() -> None:
    # Attempt 1 ran 30 min and was preempted; attempt 2 ran 1 h: 1.5 h.
    record = StateRecord.from_json({"state": "done", "started_at": 3600.0, "finished_at": 7200.0,
                                    "attempts": [{"started_at": 0.0, "finished_at": 1800.0}]})
    assert cell_hours(record, now=1e9) == pytest.approx(1.5)
    # A running cell counts up to now; a planned one never started.
    running = StateRecord.from_json({"state": "running", "started_at": 100.0})
    assert cell_hours(running, now=100.0 + 900) == pytest.approx(0.25)
    assert cell_hours(StateRecord.derived(CellState.PLANNED), now=1e9) == 0.0


# --- a hand-made sweep through `gridrun collect` -----------------------------------------------
def add_cell(sweep: SweepDir, data: dict, cell_id: str, kind: str, coords: dict, state: str,
             rows: list[dict[str, Any]], alerts: list[str] | None = None, gpus: int = 0) -> None:
    data["cells"].append({"id": cell_id, "kind": kind, "coords": coords, "fingerprint": "x", "total_steps": 40,
                          "est_hours": 2.0, "resources": {"gpus": gpus, "nodes": 1}})
    run_dir = sweep.cell(cell_id)
    run_dir.root.mkdir(parents=True)
    run_dir.config_yaml.write_text(f"cell:\n  id: {cell_id}\n")  # a planned cell's marker for find_cell
    ran = {} if state == "planned" else {"started_at": 0.0, "finished_at": 3600.0}  # one hour
    put_state(run_dir, state=state, step=40, total_steps=40, attempt=1, alerts=alerts or [], **ran)
    run_dir.append_metrics(rows)


def coords(workflow: str, policy: str | None = None, seed: int | None = 0) -> dict:
    return {"workflow": workflow, "task": "math", "scale": "1.7b", "policy": policy, "seed": seed}


def scaled(train: dict[str, list[float]], factor: float) -> dict[str, list[float]]:
    """The generator's chi2 and perplexity rises scaled by `factor` (chi2's ratio becomes 1 + 3 * factor)."""
    out = dict(train)
    for key in ("role/generator/chi2", "role/generator/ppl"):
        first = train[key][0]
        out[key] = [first + (v - first) * factor for v in train[key]]
    return out


def lengthened(train: dict[str, list[float]], steps: int) -> dict[str, list[float]]:
    """`train` run on to `steps` steps, each metric holding its last value."""
    return {k: v + [v[-1]] * (steps - len(v)) for k, v in train.items()}


@pytest.fixture
def analysed(results: Path) -> SweepDir:
    sweep = SweepDir(results, "analysed")
    data: dict = {"name": "analysed", "cells": [], "plans": [{"at": 0, "argv": ["train.total_steps=40"],
                                                               "git": {"commit": "abc1234def", "dirty": False}}]}
    # IP, two seeds of 40 steps (5-40 as step 4): generator chi2 ratios 4.0 (as above) and 2.0
    # (rise a third: 0.02 -> 0.04), perplexity ratios 1.6 and 1.2 (1.5 -> 1.8).
    add_cell(sweep, data, "voting-ip-1.7b-math-s0", "train", coords("voting", "isolated", 0), "done",
             rows_of(lengthened(TRAIN, 40), VAL_ACC, SIGNATURES), gpus=2)
    add_cell(sweep, data, "voting-ip-1.7b-math-s1", "train", coords("voting", "isolated", 1), "done",
             rows_of(lengthened(scaled(TRAIN, 1 / 3), 40), {0: 0.40, 40: 0.52}))
    # SP: one adapter for both roles, 40 steps (5-40 as step 4). The generator's share of the
    # gradient rises from 0.60 (steps 1-20) to 0.70 (21-40) while the aggregator's terse rate
    # falls 90% -> 80% -> 30% at the validations of steps 0, 20, 40: role capture.
    shared = lengthened({k: v for k, v in TRAIN.items() if not k.startswith("adapter/")}, 40)
    shared["adapter/shared/grad_norm"] = [1.0, 1.2, 1.1] + [1.0] * 37
    shared["role/generator/grad_share"] = [0.6] * 20 + [0.7] * 20
    shared["role/aggregator/grad_share"] = [0.4] * 20 + [0.3] * 20
    add_cell(sweep, data, "voting-sp-1.7b-math-s0", "train", coords("voting", "shared", 0), "done",
             rows_of(shared, {0: 0.40, 20: 0.50, 40: 0.48}, SIGNATURES), alerts=["aggregator terse rate 90%->30%"])
    add_cell(sweep, data, "voting-sp-1.7b-math-s1", "train", coords("voting", "shared", 1), "running",
             rows_of(shared, {0: 0.40, 20: 0.70}))
    add_cell(sweep, data, "sa_rl-1.7b-math-s0", "sa_rl", coords("single", None, 0), "done", rows_of({}, {0: 0.35, 40: 0.50}))
    add_cell(sweep, data, "base-voting-1.7b-math", "base", coords("voting", None, None), "done", rows_of({}, {0: 0.40}))
    # Transfer: Voting's finished at 46%; Eval-Opt's still waits (its row shows the state).
    add_cell(sweep, data, "transfer-voting-1.7b-math-s0", "transfer", coords("voting", None, 0), "done",
             rows_of({}, {0: 0.46}))
    add_cell(sweep, data, "transfer-eval_opt-1.7b-math-s0", "transfer", coords("eval_opt", None, 0), "planned", [])
    sweep.write(data)
    return sweep


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_table2_ratios_per_role_and_shared_adapter(gridrun: Gridrun, analysed: SweepDir) -> None:
    assert gridrun("collect", "conf=analysed").code == 0
    rows = {(r["policy"], r["row"]): r for r in read_csv(analysed.table("table2", "csv"))}
    # IP generator over the two seeds: chi2 ratios 4.0 and 2.0 -> mean 3.0, sd sqrt(2), se 1.0,
    # t(1) = 12.706 -> half-width 12.71; the peak step is 3 in both.
    generator = rows[("IP", "generator")]
    assert (generator["chi2_ratio"], generator["chi2_ratio_n"], generator["chi2_ratio_ci95"]) == ("3.00", "2", "12.71")
    # Perplexity ratios 1.6 and 1.2: mean 1.4.
    assert generator["chi2_peak_step"] == "3" and generator["ppl_ratio"] == "1.40"
    assert rows[("IP", "aggregator")]["chi2_ratio"] == "1.20"
    # SP: only seed 0 is done. Shared adapter: chi2 per step (0.02*300 + 0.10*100)/400 = 0.04,
    # (0.05*300 + 12)/400 = 0.0675, (0.08*300 + 11)/400 = 0.0875, (12 + 10)/400 = 0.055
    # -> 0.0875 / 0.04 = 2.19 at step 3; grad norm 1.2 / 1.0.
    adapter = rows[("SP", "all roles (shared adapter)")]
    assert (adapter["chi2_ratio"], adapter["chi2_ratio_n"], adapter["chi2_peak_step"]) == ("2.19", "1", "3")
    assert adapter["grad_norm_ratio"] == "1.20"
    assert rows[("SP", "generator")]["chi2_ratio"] == "4.00"
    md = analysed.table("table2", "md").read_text()
    assert "| math | 1.7b | voting | IP | generator | 3.00 ± 12.71 (n=2) |" in md


def test_table1_final_accuracy_is_the_floor(gridrun: Gridrun, analysed: SweepDir) -> None:
    assert gridrun("collect", "conf=analysed").code == 0
    peak = read_csv(analysed.table("table1", "csv"))[0]
    final = read_csv(analysed.table("table1_final", "csv"))[0]
    # IP seeds: peaks 60 and 52 (mean 56), finals 50 and 52 (mean 51); SP: seed 1 still running.
    assert (peak["ip"], final["ip"]) == ("56.0", "51.0")
    assert (peak["sp"], peak["sp_n"], final["sp"]) == ("50.0", "1", "48.0")
    # SA-RL peaks and ends at 50: residuals of the floor are IP 51 - 50 = 1, SP 48 - 50 = -2.
    assert (final["ip_minus_sa"], final["sp_minus_sa"]) == ("1.0", "-2.0")


def test_table3_transfer_against_base_and_sa_rl(gridrun: Gridrun, analysed: SweepDir) -> None:
    assert gridrun("collect", "conf=analysed").code == 0
    rows = {r["workflow"]: r for r in read_csv(analysed.table("table3", "csv"))}
    # 46 vs base 40 and SA-RL's peak 50.
    assert rows["voting"] == {"task": "math", "scale": "1.7b", "workflow": "voting", "base": "40.0", "sa_rl": "50.0",
                              "transfer": "46.0", "transfer_minus_base": "6.0", "transfer_minus_sa": "-4.0"}
    assert rows["eval_opt"]["transfer"] == "planned" and rows["eval_opt"]["transfer_minus_base"] == "n/a"
    assert rows["eval_opt"]["base"] == "missing"


def test_flagged_cells_get_signature_tables(gridrun: Gridrun, analysed: SweepDir) -> None:
    assert gridrun("collect", "conf=analysed").code == 0
    cells = pd.read_parquet(analysed.cells_parquet).set_index("cell")
    # The mechanism alerts replayed on the rows. Seed 0: the generator's chi2 peak/first is 2.5
    # at step 2 (0.05 / 0.02), over twice the aggregator's 1.2 (0.12 / 0.10): it holds from
    # step 2 to 40. Seed 1: chi2 2.0 (2.4 needed) and perplexity 1.2 (1.2 x 1.3/1.2 = 1.3
    # needed): never.
    assert cells.loc["voting-ip-1.7b-math-s0", "flags"] == "gradient_amplification (held at 39 of 40 steps, from step 2)"
    assert cells.loc["voting-ip-1.7b-math-s1", "flags"] == ""
    # SP seed 0: the generator's share rose 0.60 -> 0.70; the aggregator's terse rate fell 60
    # points only by the last validation (10 at step 20, under the 20 needed).
    assert cells.loc["voting-sp-1.7b-math-s0", "flags"] == "sp_role_capture (held at 1 of 40 steps, from step 40)"
    table4 = read_csv(analysed.table("table4", "csv"))
    # First, peak (step 20) and last validation, per role that logs signatures (as metrics.jsonl
    # sorts them).
    assert [(r["cell"], r["checkpoint"], r["step"], r["role"]) for r in table4] == [
        ("voting-ip-1.7b-math-s0", checkpoint, step, role)
        for role in ("aggregator", "generator") for checkpoint, step in (("first", "0"), ("peak", "20"), ("last", "40"))
    ]
    assert [r["terse_rate"] for r in table4[:3]] == ["0.900", "0.800", "0.300"]
    assert [r["len_mean"] for r in table4[3:]] == ["20.0", "24.0", "31.0"]
    assert table4[3]["terse_rate"] == ""  # the generator has no terse rate
    table5 = read_csv(analysed.table("table5", "csv"))
    assert {r["cell"] for r in table5} == {"voting-sp-1.7b-math-s0"}
    assert "No cell of this sweep is flagged" in analysed.table("table6", "md").read_text()


def test_cells_parquet_columns_and_cost(gridrun: Gridrun, analysed: SweepDir) -> None:
    assert gridrun("collect", "conf=analysed").code == 0
    cells = pd.read_parquet(analysed.cells_parquet).set_index("cell")
    row = cells.loc["voting-ip-1.7b-math-s0"]
    assert (row["cliff_drop"], row["cliff_step"]) == (pytest.approx(-0.15), 30)
    assert row["drop_from_peak"] == pytest.approx(-0.10)
    # One hour on 2 GPUs.
    assert (row["wall_h"], row["gpu_h"]) == (pytest.approx(1.0), pytest.approx(2.0))
    assert pd.isna(cells.loc["sa_rl-1.7b-math-s0", "max_chi2"])  # no training metrics: no number
    # A transfer cell's generator is not the base model: it is not checked against base.
    assert pd.isna(cells.loc["transfer-voting-1.7b-math-s0", "base_cell"])


def test_metrics_parquet_is_long_form(gridrun: Gridrun, analysed: SweepDir) -> None:
    assert gridrun("collect", "conf=analysed").code == 0
    metrics = pd.read_parquet(analysed.metrics_parquet)
    assert list(metrics.columns) == ["cell", "split", "step", "metric", "value"]
    ip = metrics[metrics["cell"] == "voting-ip-1.7b-math-s0"]
    # 40 training steps x 15 metrics + 5 val/acc + 3 x 2 signatures.
    assert len(ip) == 40 * 15 + 5 + 6
    chi2 = ip[ip["metric"] == "role/generator/chi2"].sort_values("step")
    assert chi2["value"].tolist() == [0.02, 0.05, 0.08] + [0.04] * 37 and set(chi2["split"]) == {"train"}
    assert len(metrics[metrics["cell"] == "transfer-eval_opt-1.7b-math-s0"]) == 0


def test_report_opens_with_coordinates_states_and_cost(gridrun: Gridrun, analysed: SweepDir) -> None:
    result = gridrun("collect", "conf=analysed")
    assert result.code == 0, result.err
    assert f"report: {analysed.report('html')}" in result.out
    md = analysed.report("md").read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections == ["## Sweep", "## Cell states", "## Cost", "## Findings", "## Early warning", "## Tables", "## Figures",
                        "## Appendix"]
    assert "| workflow | voting, single, eval_opt |" in md and "`abc1234def`" in md
    # Every cell ran one hour; only voting-ip-s0 on 2 GPUs. 7 cells started, 1 planned (0 h).
    assert "| **all** | 8 | 7.00 | 2.00 | 16.00 |" in md
    assert "| transfer | 1 | 1 | 0 | 2 |" in md  # kind | done | planned | running | total
    html = analysed.report("html").read_text()
    assert html.count("data:image/png;base64,") == md.count("](figures/") > 0
    assert 'src="figures/' not in html  # self-contained
    assert "<table>" in html and "Figure 3" in html


def test_plot_draws_fig6_for_one_cell(gridrun: Gridrun, analysed: SweepDir) -> None:
    result = gridrun("plot", "voting-sp-1.7b-math-s0")
    assert result.code == 0, result.err
    path = analysed.figure("fig6", "voting-sp-1.7b-math-s0")
    assert result.out.strip() == str(path) and path.read_bytes()[:4] == b"\x89PNG"
    result = gridrun("plot", "transfer-eval_opt-1.7b-math-s0")
    assert result.code == 2 and "has no metrics yet" in result.err
    result = gridrun("plot", "votng-sp-1.7b-math-s0")
    assert result.code == 2 and "did you mean 'voting-sp-1.7b-math-s0'" in result.err


def test_results_api_loads_without_torch_or_matplotlib(gridrun: Gridrun, analysed: SweepDir) -> None:
    code = (
        "import json, sys\n"
        "from gridrun import results\n"
        f"r = results.load({str(analysed.root)!r}, fresh=True)\n"
        "print(json.dumps([len(r.cells), 'torch' in sys.modules, 'matplotlib' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == [8, False, False]
    from gridrun import results
    from gridrun.grid.errors import GridError

    with pytest.raises(GridError, match="has not been collected yet: run `gridrun collect conf=analysed"):
        results.load(analysed.root)
    assert gridrun("collect", "conf=analysed").code == 0
    loaded = results.load(analysed.root)
    assert loaded.curve("voting-ip-1.7b-math-s0", "val/acc").to_dict() == VAL_ACC
    assert loaded.tables["table3"].set_index("workflow").loc["voting", "transfer"] == "46.0"
    with pytest.raises(KeyError, match="no metric 'val/acc'"):
        loaded.curve("transfer-eval_opt-1.7b-math-s0", "val/acc")


def test_render_in_worker_processes_writes_what_one_process_writes(tmp_path: Path) -> None:
    from gridrun.analysis.plotting import render

    # Forked workers draw; the parent writes. A job that draws nothing removes a stale file.
    stale = tmp_path / "stale.png"
    stale.write_bytes(b"old")
    jobs = [(tmp_path / "a.png", lambda: b"\x89PNG a"), (stale, lambda: None), (tmp_path / "b.png", lambda: b"\x89PNG b")]
    assert render(jobs, workers=2) == [tmp_path / "a.png", tmp_path / "b.png"]
    assert (tmp_path / "b.png").read_bytes() == b"\x89PNG b" and not stale.exists()


def test_mean_band_over_seeds_uses_the_steps_all_reached() -> None:
    from gridrun.analysis.paper_figures import mean_band

    # Step 0: 10 and 14 -> mean 12, sd 2.828, se 2, t(1) 12.706 -> 25.41. Step 10: 20 and 30 ->
    # mean 25, se 5 -> 63.53. Step 20: one seed lags, so no mean there (it would jump).
    steps, mean, half = mean_band([{0: 10.0, 10: 20.0, 20: 40.0}, {0: 14.0, 10: 30.0}])
    assert steps == [0, 10] and mean == [12.0, 25.0]
    assert half == [pytest.approx(25.412), pytest.approx(63.53)]
    assert mean_band([{0: 5.0}]) == ([0], [5.0], [0.0])  # one seed: no band


def test_collect_reads_sweep_json_and_each_state_json_once(analysed: SweepDir, monkeypatch: pytest.MonkeyPatch) -> None:
    from gridrun.analysis.collect import collect
    from gridrun.grid.console import console
    from gridrun.seam.rundir import RunDir

    reads: list[str] = []
    sweep_read, state_read = SweepDir.read, RunDir.read_state
    monkeypatch.setattr(SweepDir, "read", lambda self: reads.append("sweep.json") or sweep_read(self))
    monkeypatch.setattr(RunDir, "read_state", lambda self: reads.append(self.root.name) or state_read(self))
    collect(analysed, console())
    assert reads.count("sweep.json") == 1
    cells = analysed.cell_ids()  # read after collect, outside the count
    assert sorted(r for r in reads if r != "sweep.json") == sorted(cells)


MARKUP = "`</code><img src=x onerror=alert(1)><script>alert(2)</script>|x"


def test_markup_in_any_field_collect_renders_reaches_the_report_as_text(results: Path) -> None:
    # A setting's value (logging.wandb_project), an alert, a cell's error and a coordinate, each
    # holding a backtick that would close a code span, a pipe and raw HTML.
    from gridrun.analysis.collect import collect
    from gridrun.grid.console import console

    sweep = SweepDir(results, "planted")
    data: dict = {"name": "planted", "cells": [],
                  "plans": [{"at": 0, "argv": [f"logging.wandb_project={MARKUP}"], "git": {"commit": MARKUP}}]}
    add_cell(sweep, data, "voting-ip-1.7b-math-s0", "train", {**coords("voting", "isolated", 0), "variant": MARKUP},
             "done", rows_of(lengthened(TRAIN, 40), VAL_ACC, SIGNATURES), alerts=[f"generator {MARKUP}"])
    add_cell(sweep, data, "voting-sp-1.7b-math-s0", "train", coords("voting", "shared", 0), "failed", [])
    put_state(sweep.cell("voting-sp-1.7b-math-s0"), state="failed", attempt=1, error=f"boom {MARKUP}")
    sweep.write(data)
    collect(sweep, console())
    page = sweep.report("html").read_text()
    assert "<img src=x" not in page and "<script" not in page and "onerror=alert(1)>" not in page
    assert page.count("&lt;img src=x onerror=alert(1)&gt;") >= 3  # the setting, the alert, the error at least
    markdown = sweep.report("md").read_text()
    assert f"``{MARKUP}``" in markdown or f"`` {MARKUP} ``" in markdown  # the setting: one code span
