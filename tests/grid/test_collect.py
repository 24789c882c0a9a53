"""The collector against a results dir made by hand: Table 1 values and residuals worked
out on paper, missing and unfinished cells shown as words, the step-0/base check."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.rundir import RunDir
from tests.conftest import TOY_CELL, merge
from tests.grid.conftest import Gridrun
from tests.states import put_state


def add_cell(
    sweep: SweepDir, data: dict, cell_id: str, kind: str, coords: dict, state: str, accs: dict[int, float],
    grad_shares: dict[int, dict[str, float]] | None = None,
) -> None:
    """A cell with validation accuracies by step and, for the figures, train rows with each
    role's gradient share by step."""
    data["cells"].append({"id": cell_id, "kind": kind, "coords": coords, "fingerprint": "x", "total_steps": 20})
    run_dir = sweep.cell(cell_id)
    run_dir.root.mkdir(parents=True)
    run_dir.config_yaml.write_text(f"cell:\n  id: {cell_id}\n")  # a planned cell has one (else: missing)
    put_state(run_dir, state=state, step=max(accs, default=0), total_steps=20, attempt=1)
    train = [
        {"step": s, "split": "train", **{f"role/{role}/grad_share": v for role, v in shares.items()}}
        for s, shares in sorted((grad_shares or {}).items())
    ]
    run_dir.append_metrics(train + [{"step": s, "split": "val", "val/acc": a} for s, a in sorted(accs.items())])


def coords(workflow: str, policy: str | None = None, seed: int | None = 0, task: str = "math", scale: str = "1.7b") -> dict:
    return {"workflow": workflow, "task": task, "scale": scale, "policy": policy, "seed": seed}


@pytest.fixture
def hand(results: Path) -> SweepDir:
    sweep = SweepDir(results, "hand")
    data: dict = {"name": "hand", "cells": [], "plans": []}
    add_cell(
        sweep, data, "voting-ip-1.7b-math-s0", "train", coords("voting", "isolated"), "done", {0: 0.40, 10: 0.55, 20: 0.60},
        grad_shares={1: {"voter": 0.8, "aggregator": 0.2}, 2: {"voter": 0.7, "aggregator": 0.3}},
    )
    # Step 0 is 3 points above its base control (0.40): flagged.
    add_cell(sweep, data, "voting-sp-1.7b-math-s0", "train", coords("voting", "shared"), "done", {0: 0.43, 10: 0.52, 20: 0.48})
    add_cell(sweep, data, "eval_opt-ip-1.7b-math-s0", "train", coords("eval_opt", "isolated"), "done", {0: 0.30, 10: 0.56, 20: 0.50})
    # Unfinished: its 0.70 so far must not show up as a number.
    add_cell(sweep, data, "eval_opt-sp-1.7b-math-s0", "train", coords("eval_opt", "shared"), "running", {0: 0.30, 10: 0.70})
    add_cell(sweep, data, "sa_rl-1.7b-math-s0", "sa_rl", coords("single"), "done", {0: 0.35, 10: 0.50, 20: 0.45})
    add_cell(sweep, data, "base-voting-1.7b-math", "base", coords("voting", seed=None), "done", {0: 0.40})
    add_cell(sweep, data, "base-single-1.7b-math", "base", coords("single", seed=None), "done", {0: 0.35})
    # base-eval_opt-1.7b-math is not in the sweep at all.
    sweep.write(data)
    return sweep


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    return {row["workflow"]: row for row in csv.DictReader(io.StringIO(path.read_text()))}


def test_table1_values_and_residuals(gridrun: Gridrun, hand: SweepDir) -> None:
    result = gridrun("collect", "conf=hand")
    assert result.code == 0, result.err
    rows = read_csv(hand.table1("csv"))
    assert list(next(iter(rows.values()))) == [
        "task", "scale", "workflow", "base", "sa_rl", "ip", "sp", "ip_minus_sa", "sp_minus_sa",
        "sa_rl_peak_checkpoint", "ip_peak_checkpoint", "sp_peak_checkpoint",
        *(f"{name}_test{suffix}" for name in ("base", "sa_rl", "ip", "sp") for suffix in ("", "_n", "_ci95")),
    ]
    # Peaks: IP 60, SP 52, SA-RL 50 (at step 10, not its final 45); residuals in points. No
    # cell here kept a checkpoint of its peak (made by hand, without any), nor has a test row
    # (a results folder from before the test split): its test columns say so.
    untested = {f"{name}_test{suffix}": value for name in ("base", "sa_rl", "ip", "sp")
                for suffix, value in (("", "no test"), ("_n", "0"), ("_ci95", ""))}
    assert rows["voting"] == {
        "task": "math", "scale": "1.7b", "workflow": "voting", "base": "40.0", "sa_rl": "50.0",
        "ip": "60.0", "sp": "52.0", "ip_minus_sa": "10.0", "sp_minus_sa": "2.0",
        "sa_rl_peak_checkpoint": "deleted", "ip_peak_checkpoint": "deleted", "sp_peak_checkpoint": "deleted",
        **untested,
    }
    # No base control planned, SP still running: words, never numbers; its residual is n/a.
    assert rows["eval_opt"]["base"] == "missing"
    assert rows["eval_opt"]["sp"] == "running" and rows["eval_opt"]["sp_minus_sa"] == "n/a"
    assert rows["eval_opt"]["ip"] == "56.0" and rows["eval_opt"]["ip_minus_sa"] == "6.0"
    md = hand.table1("md").read_text()
    assert ("| math | 1.7b | voting | 40.0 | *no test* | 50.0 | *no test* | 60.0 | *no test* | 52.0 | *no test* "
            "| +10.0 | +2.0 |") in md
    assert "| Base (val) | Base (test) | SA-RL (val) |" in md and "6 done cells have no test evaluation" in md
    assert "nothing to measure" in hand.table("selection_bias", "md").read_text()
    assert "*running*" in md and "*missing*" in md
    tex = hand.table1("tex").read_text()
    assert r"eval\_opt" in tex and r"\textit{running}" in tex and r"\begin{tabular}" in tex


def test_step0_disagreeing_with_its_base_control_is_flagged(gridrun: Gridrun, hand: SweepDir) -> None:
    result = gridrun("collect", "conf=hand")
    assert "Step 0 disagrees with the base control" in result.out
    assert "voting-sp-1.7b-math-s0: step 0 43.0% vs base-voting-1.7b-math 40.0% (+3.0 pp)" in result.out
    cells = pd.read_parquet(hand.cells_parquet).set_index("cell")
    assert cells.loc["voting-sp-1.7b-math-s0", "base_mismatch"]
    assert cells.loc["voting-sp-1.7b-math-s0", "step0_minus_base_pp"] == pytest.approx(3.0)
    # Same model, same problems: IP starts exactly at its base, SA-RL at base-single.
    assert not cells.loc["voting-ip-1.7b-math-s0", "base_mismatch"]
    assert cells.loc["sa_rl-1.7b-math-s0", "base_cell"] == "base-single-1.7b-math"
    assert not cells.loc["sa_rl-1.7b-math-s0", "base_mismatch"]
    # No base control to compare with: not flagged.
    assert not cells.loc["eval_opt-ip-1.7b-math-s0", "base_mismatch"]
    assert "voting-sp-1.7b-math-s0" in hand.table1("md").read_text().split("disagrees")[1]


def test_cells_parquet_has_one_row_per_cell(gridrun: Gridrun, hand: SweepDir) -> None:
    assert gridrun("collect", "conf=hand").code == 0
    cells = pd.read_parquet(hand.cells_parquet).set_index("cell")
    assert len(cells) == 7
    row = cells.loc["sa_rl-1.7b-math-s0"]
    assert (row["kind"], row["task"], row["scale"], row["state"]) == ("sa_rl", "math", "1.7b", "done")
    assert (row["peak_val_acc"], row["peak_step"], row["final_val_acc"]) == (0.50, 10, 0.45)
    assert cells.loc["eval_opt-sp-1.7b-math-s0", "state"] == "running"


def test_several_seeds_give_means_counts_and_intervals(gridrun: Gridrun, results: Path) -> None:
    sweep = SweepDir(results, "seeds")
    data: dict = {"name": "seeds", "cells": [], "plans": []}
    for seed, peak in enumerate((0.50, 0.60, 0.55)):
        add_cell(sweep, data, f"voting-ip-1.7b-math-s{seed}", "train", coords("voting", "isolated", seed), "done", {0: 0.4, 10: peak})
    for seed, peak in enumerate((0.40, 0.44, 0.42)):
        add_cell(sweep, data, f"sa_rl-1.7b-math-s{seed}", "sa_rl", coords("single", None, seed), "done", {0: 0.3, 10: peak})
    add_cell(sweep, data, "voting-sp-1.7b-math-s0", "train", coords("voting", "shared", 0), "failed", {0: 0.4})
    sweep.write(data)
    assert gridrun("collect", "conf=seeds").code == 0
    row = read_csv(sweep.table1("csv"))["voting"]
    # IP: mean 55, sd 5, se 5/sqrt(3) = 2.887, t(2) = 4.303 -> 12.4.
    assert (row["ip"], row["ip_n"], row["ip_ci95"]) == ("55.0", "3", "12.4")
    # SA-RL: mean 42, sd 2, se 1.155 -> 5.0.
    assert (row["sa_rl"], row["sa_rl_n"], row["sa_rl_ci95"]) == ("42.0", "3", "5.0")
    # IP - SA = 13; se sqrt(2.887^2 + 1.155^2) = 3.109, x 4.303 -> 13.4.
    assert (row["ip_minus_sa"], row["ip_minus_sa_ci95"]) == ("13.0", "13.4")
    assert (row["sp"], row["sp_n"], row["sp_minus_sa"]) == ("failed", "0", "n/a")
    assert row["base"] == "missing"


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_figures_are_drawn_for_the_task_and_scale_with_metrics(gridrun: Gridrun, hand: SweepDir) -> None:
    result = gridrun("collect", "conf=hand")
    assert result.code == 0, result.err
    written = sorted(p.name for p in hand.figures_dir.iterdir())
    # Fig. 3 has one matched pair (Voting: both policies done); Fig. 5 nothing (no chi2, grad
    # norm or entropy logged); Fig. 6 the deepest cliff: Eval-Opt IP 56 -> 50 (Voting SP: 52 -> 48);
    # the early warning's curves.
    assert written == [
        "early_warning-math-1.7b.png", "fig2_delta.png", "fig3_ip_vs_sp.png", "fig4_dynamics-math-1.7b.png", "fig6-eval_opt-ip-1.7b-math-s0.png",
        "grad_share-math-1.7b.png", "val_acc-math-1.7b.png",
    ]
    for name in written:
        assert (hand.figures_dir / name).read_bytes()[:8] == PNG_SIGNATURE
    assert f"{hand.figures_dir}/ (7 figures)" in result.out


def test_figures_skip_what_has_no_metrics(gridrun: Gridrun, results: Path) -> None:
    sweep = SweepDir(results, "partial")
    data: dict = {"name": "partial", "cells": [], "plans": []}
    # math/1.7b: validation and gradient shares; math/8b: validation only; code/1.7b: not run yet.
    add_cell(
        sweep, data, "voting-ip-1.7b-math-s0", "train", coords("voting", "isolated"), "done", {0: 0.4, 10: 0.5},
        grad_shares={1: {"voter": 0.6, "aggregator": 0.4}},
    )
    add_cell(sweep, data, "voting-ip-8b-math-s0", "train", coords("voting", "isolated", scale="8b"), "running", {0: 0.5})
    add_cell(sweep, data, "voting-ip-1.7b-code-s0", "train", coords("voting", "isolated", task="code"), "planned", {})
    add_cell(sweep, data, "base-voting-1.7b-code", "base", coords("voting", seed=None, task="code"), "queued", {})
    sweep.write(data)
    assert gridrun("collect", "conf=partial").code == 0
    # No base or SA-RL cell to compare with (no Fig. 2) and no IP-SP pair (no Fig. 3, 5); Fig. 6
    # for the first train cell with validation rows.
    assert sorted(p.name for p in sweep.figures_dir.iterdir()) == [
        "early_warning-math-1.7b.png", "early_warning-math-8b.png", "fig4_dynamics-math-1.7b.png", "fig4_dynamics-math-8b.png", "fig6-voting-ip-1.7b-math-s0.png",
        "grad_share-math-1.7b.png", "val_acc-math-1.7b.png", "val_acc-math-8b.png",
    ]


def test_no_figure_for_a_sweep_without_metrics(gridrun: Gridrun, results: Path) -> None:
    sweep = SweepDir(results, "fresh")
    data: dict = {"name": "fresh", "cells": [], "plans": []}
    add_cell(sweep, data, "voting-ip-1.7b-math-s0", "train", coords("voting", "isolated"), "planned", {})
    add_cell(sweep, data, "sa_rl-1.7b-math-s0", "sa_rl", coords("single"), "queued", {})
    add_cell(sweep, data, "base-voting-1.7b-math", "base", coords("voting", seed=None), "failed", {})
    sweep.write(data)
    result = gridrun("collect", "conf=fresh")
    assert result.code == 0, result.err
    assert not sweep.figures_dir.exists() or not any(sweep.figures_dir.iterdir())
    assert "no figures (no cell has metrics yet)" in result.out
    assert "No figure: no cell has metrics yet." in sweep.report("md").read_text()


def test_a_sweep_of_one_sa_rl_cell_has_metrics_but_no_figure_to_draw(gridrun: Gridrun, results: Path) -> None:
    # It said "no cell has metrics yet" though the cell had three validations.
    sweep = SweepDir(results, "solo")
    data: dict = {"name": "solo", "cells": [], "plans": []}
    add_cell(sweep, data, "sa_rl-1.7b-math-s0", "sa_rl", coords("single"), "done", {0: 0.35, 10: 0.5, 20: 0.45})
    sweep.write(data)
    result = gridrun("collect", "conf=solo")
    assert result.code == 0, result.err
    why = "none of Figures 2-6 applies to these cells (they draw multi-agent train cells)"
    # The one figure is the early warning's validation curve, which every cell has.
    assert "(1 figures)" in " ".join(result.out.split())
    assert [p.name for p in sweep.figures_dir.iterdir()] == ["early_warning-math-1.7b.png"]
    assert f"No figure: {why}." in sweep.report("md").read_text()


def test_the_peak_has_one_definition_read_off_metrics(tmp_path: Path) -> None:
    from gridrun.analysis.summary import accuracy_summary
    from gridrun.seam.accuracy import first_peak, val_accuracy
    from gridrun.seam.rundir import RunDir

    run_dir = RunDir(tmp_path / "cell")
    run_dir.root.mkdir()
    # 0.5 is reached at step 10 and again at 20: the peak is the first. Step 30 was validated
    # twice (a resume replayed it): the later row, 0.25, wins. A NaN accuracy and the train
    # row are not validations.
    run_dir.append_metrics([
        {"step": 0, "split": "val", "val/acc": 0.25}, {"step": 10, "split": "val", "val/acc": 0.5},
        {"step": 20, "split": "val", "val/acc": 0.5}, {"step": 25, "split": "val", "val/acc": float("nan")},
        {"step": 30, "split": "val", "val/acc": 0.75}, {"step": 30, "split": "train", "val/acc": 1.0},
        {"step": 30, "split": "val", "val/acc": 0.25},
    ])
    val_acc = val_accuracy(run_dir.read_metrics())
    assert val_acc == {0: 0.25, 10: 0.5, 20: 0.5, 30: 0.25}
    assert first_peak(val_acc) == (10, 0.5) and first_peak({}) is None
    summary = accuracy_summary(val_acc)
    assert (summary["peak_step"], summary["peak_val_acc"], summary["drop_from_peak"]) == (10, 0.5, -0.25)


def stand_in_weights(name: str) -> bytes:
    """A well-formed safetensors file holding one U8 tensor, the adapter's name (export checks
    the framing of every weights file before copying it)."""
    data = name.encode()
    header = json.dumps({"name": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    return len(header).to_bytes(8, "little") + header + data


def peak_checkpoint_on_disk(sweep: SweepDir, cell_id: str, step: int, roles: dict[str, str | None]) -> Path:
    """A complete checkpoint as the trainer writes it, its adapters' files stand-ins (collect
    and export copy them, never load them), and the cell's config.yaml."""
    run_dir = sweep.cell(cell_id)
    path = run_dir.checkpoint(step)
    for adapter in {a for a in roles.values() if a}:
        folder = path / "adapters" / adapter
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        (folder / "adapter_model.safetensors").write_bytes(stand_in_weights(adapter))
    (path / "roles.json").write_text(json.dumps(roles))
    (path / "COMPLETE").write_text(f"{step}\n")
    config = merge(TOY_CELL, {"cell": {"id": cell_id, "kind": "train"}, "workflow": {"name": "voting"},
                              "policy": {"name": "isolated"}})
    run_dir.config_yaml.write_text(yaml.safe_dump(config))
    return path


def test_the_peaks_checkpoint_is_named_and_exported(gridrun: Gridrun, hand: SweepDir, tmp_path: Path) -> None:
    roles = {"generator": "generator", "aggregator": "aggregator"}
    kept = peak_checkpoint_on_disk(hand, "voting-ip-1.7b-math-s0", 20, roles)
    result = gridrun("collect", "conf=hand", "--export-peaks", str(tmp_path / "peaks"))
    assert result.code == 0, result.err
    assert read_csv(hand.table1("csv"))["voting"]["ip_peak_checkpoint"] == str(kept)
    cells = pd.read_parquet(hand.cells_parquet).set_index("cell")
    assert cells.loc["voting-ip-1.7b-math-s0", "peak_checkpoint"] == str(kept)
    assert cells.loc["sa_rl-1.7b-math-s0", "peak_checkpoint"] == "deleted"
    assert pd.isna(cells.loc["base-voting-1.7b-math", "peak_checkpoint"])  # a base cell trains nothing
    # Only the done cell whose peak is on disk is exported; the others are named.
    out = tmp_path / "peaks" / "hand" / "voting-ip-1.7b-math-s0-step_000020"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "aggregator", "generator", "roles.json"]
    assert (out / "generator" / "adapter_model.safetensors").read_bytes() == stand_in_weights("generator")
    assert "exported 1 peaks to" in result.out and "peaks not on disk:" in result.out
    assert "sa_rl-1.7b-math-s0" in result.out.split("peaks not on disk:")[1]
    # Again: what is there is kept, nothing is overwritten.
    again = gridrun("collect", "conf=hand", "--export-peaks", str(tmp_path / "peaks"))
    assert "exported 0 peaks to" in again.out and "1 already there" in again.out


def test_collect_reads_each_metrics_file_once(gridrun: Gridrun, hand: SweepDir, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration (an early_warning plan) and --export-peaks use the rows collect parsed:
    one read of each cell's metrics.jsonl, and the export finds the same peak collect wrote."""
    plan = json.loads(hand.sweep_json.read_text())
    plan["early_warning"] = {"fit_seeds": [0], "held_out_seeds": [1], "search": {"chi2_factor": [5.0, 2.0]}}
    hand.sweep_json.write_text(json.dumps(plan))
    peak_checkpoint_on_disk(hand, "voting-ip-1.7b-math-s0", 20, {"generator": "generator", "aggregator": "aggregator"})
    reads: dict[str, int] = {}
    lines = RunDir._metric_lines

    def counted(self: RunDir):  # type: ignore[no-untyped-def]
        reads[self.root.name] = reads.get(self.root.name, 0) + 1
        return lines(self)

    monkeypatch.setattr(RunDir, "_metric_lines", counted)
    result = gridrun("collect", "conf=hand", "--export-peaks", str(tmp_path / "peaks"))
    assert result.code == 0, result.err
    assert hand.table("early_warning_calibration", "csv").is_file() and "exported 1 peaks to" in result.out
    assert reads == {cell["id"]: 1 for cell in plan["cells"]}
    card = (tmp_path / "peaks" / "hand" / "voting-ip-1.7b-math-s0-step_000020" / "README.md").read_text()
    assert "| step | 20 of " in card and "(the cell's peak) |" in card and "| validation accuracy at this step | 60.0%" in card


def test_the_peaks_test_evaluation_goes_beside_it_with_the_selection_bias(gridrun: Gridrun, results: Path) -> None:
    sweep = SweepDir(results, "tested")
    data: dict = {"name": "tested", "cells": [], "plans": []}
    add_cell(sweep, data, "voting-ip-1.7b-math-s0", "train", coords("voting", "isolated"), "done", {0: 0.40, 10: 0.60, 20: 0.55})
    add_cell(sweep, data, "base-voting-1.7b-math", "base", coords("voting", seed=None), "done", {0: 0.40})
    add_cell(sweep, data, "sa_rl-1.7b-math-s0", "sa_rl", coords("single"), "done", {0: 0.35, 10: 0.50})
    sweep.write(data)
    # The trained cell's test row is at its peak (step 10); a stale one elsewhere is not read.
    for cell, rows in (("voting-ip-1.7b-math-s0", [(20, 0.1, 0.01), (10, 0.52, 0.02)]), ("base-voting-1.7b-math", [(0, 0.41, 0.03)])):
        sweep.cell(cell).append_metrics([{"step": s, "split": "test", "test/acc": a, "test/acc_se": se} for s, a, se in rows])
    result = gridrun("collect", "conf=tested")
    assert result.code == 0, result.err
    cells = pd.read_parquet(sweep.cells_parquet).set_index("cell")
    ip = cells.loc["voting-ip-1.7b-math-s0"]
    assert (ip["peak_test_acc"], ip["peak_test_se"]) == (0.52, 0.02)
    assert ip["selection_bias_pp"] == pytest.approx(8.0)
    assert cells.loc["base-voting-1.7b-math", "selection_bias_pp"] == pytest.approx(-1.0)
    assert pd.isna(cells.loc["sa_rl-1.7b-math-s0", "selection_bias_pp"])
    row = read_csv(sweep.table1("csv"))["voting"]
    # One seed: the test's own sampling CI, 1.96 x 2 points.
    assert (row["ip"], row["ip_test"], row["ip_test_n"], row["ip_test_ci95"]) == ("60.0", "52.0", "1", "3.9")
    assert (row["base"], row["base_test"], row["sa_rl_test"]) == ("40.0", "41.0", "no test")
    md = sweep.table1("md").read_text()
    assert "| math | 1.7b | voting | 40.0 | 41.0 ± 5.9 | 50.0 | *no test* | 60.0 | 52.0 ± 3.9 |" in md
    assert "+8.0 points on average over 1 trained cells" in md and "1 done cells have no test evaluation" in md
    bias = sweep.table("selection_bias", "md").read_text()
    assert "| voting-ip-1.7b-math-s0 | train | voting | isolated | 0 | 10 | 60.0 | 52.0 | 3.9 | +8.0 |" in bias
    assert "trained cells (the peak chosen among their validations): +8.0 points (n=1)" in bias
    assert "base cells (one validation, nothing chosen: the splits' difference alone): -1.0 points (n=1)" in bias
    assert "Selection bias" in result.out
