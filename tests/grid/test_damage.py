"""Damage is local: one damaged state.json, cell.json, metrics.jsonl or sweep.json shows as
`damaged` (naming the file and the fix: in status for state.json, in show for cell.json,
in collect for metrics.jsonl) and every other cell is still listed, collected and
dispatchable; no command crashes or goes blind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from gridrun.grid.launchers.dispatch import runnable
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam import cellstate
from gridrun.seam.rundir import RunDir
from tests.grid.conftest import Gridrun
from tests.grid.recording import submissions
from tests.states import put_state

# What a damaged state.json may hold: bytes that are not UTF-8, random bytes, JSON that is
# not an object, an object whose fields have the wrong types or an unknown state.
DAMAGE = {
    "not_utf8": b"\xff\xfe\x00garbage\x80",
    "random": os.urandom(64) + b"\xff",
    "list": b"[1,2,3]",
    "null": b"null",
    "wrong_type": b'{"state": "done", "step": "ten"}',
    "bool_count": b'{"state": "failed", "attempt": true}',
    "unknown_state": b'{"state": "exploded", "step": 3}',
    "empty": b"",
}


pytestmark = pytest.mark.usefixtures("recording_launcher")


def squeezed(text: str) -> str:
    """Text without whitespace: rich wraps long lines (and folds long paths) at any width."""
    return "".join(text.split())


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text and "Error:" not in text.replace("gridrun: error:", ""), text


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_state_json_is_one_damaged_cell(gridrun: Gridrun, smoke: SweepDir, damage: str) -> None:
    ids = smoke.cell_ids()
    bad = smoke.cell(ids[0])
    bad.state_json.write_bytes(DAMAGE[damage])
    put_state(smoke.cell(ids[1]), state="failed", attempt=1, error="boom")

    state = bad.read_state().to_json()
    assert state["state"] == "damaged"
    assert str(bad.state_json) in state["error"] and f"rm {bad.state_json}" in state["error"]

    # status: every cell listed, the damaged one as damaged with its file and fix.
    listed = gridrun("status", "conf=smoke", "--json")
    assert listed.code == 0, listed.err
    rows = {row["cell"]: row for row in json.loads(listed.out)}
    assert list(rows) == ids
    assert rows[ids[0]]["state"] == "damaged" and str(bad.state_json) in rows[ids[0]]["error"]
    assert [rows[i]["state"] for i in ids[2:]] == ["planned"] * 9
    table = gridrun("status")
    assert table.code == 0 and "damaged" in table.out and "1 damaged" in table.out, table.out
    # --failed: a panel for the failed cell and one for the damaged cell.
    failed = gridrun("status", "conf=smoke", "--failed")
    assert failed.code == 0 and ids[0] in failed.out and ids[1] in failed.out, failed.out

    # sweep: the 10 others are dispatched (one is failed, dispatched again); the damaged one is not.
    assert runnable(smoke, ids) == ids[1:]
    swept = gridrun("sweep", "conf=smoke", "grid.launcher.name=record")
    assert swept.code == 0, swept.err
    assert "not dispatching 1 damaged cell(s)" in swept.out
    assert [sorted(s["ids"]) for s in submissions(smoke)] == [sorted(ids[1:])]
    assert bad.state_json.read_bytes() == DAMAGE[damage]  # nothing wrote over it

    # resubmit names the damage and skips; cancel cancels the queued ones only.
    resubmit = gridrun("resubmit", "conf=smoke", "--cells", ids[0])
    assert resubmit.code == 0 and squeezed(f"skip {ids[0]}: damaged: {bad.state_json}") in squeezed(resubmit.out)
    cancel = gridrun("cancel", "conf=smoke")
    assert cancel.code == 0 and cancel.out.count(": cancelled") == 10, cancel.out

    # plan, show and collect read on.
    assert gridrun("plan", "conf=smoke", "grid.launcher.name=record").code == 0
    show = gridrun("show", ids[0])
    assert show.code == 0 and "damaged" in show.out, show.err
    collected = gridrun("collect", "conf=smoke")
    assert collected.code == 0, collected.err
    assert "damaged:" in collected.out and "11 cells (" in collected.out
    no_traceback(listed.err, table.err, swept.err, resubmit.err, cancel.err, show.err, collected.err)


def test_removing_a_damaged_state_json_makes_the_cell_dispatchable(gridrun: Gridrun, smoke: SweepDir) -> None:
    ids = smoke.cell_ids()
    smoke.cell(ids[0]).state_json.write_bytes(DAMAGE["list"])
    assert ids[0] not in runnable(smoke, ids)
    smoke.cell(ids[0]).state_json.unlink()  # the fix the message names
    assert runnable(smoke, ids) == ids


def test_a_writer_moves_a_damaged_state_json_aside(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "cell")
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text("{}\n")
    run_dir.state_json.write_bytes(DAMAGE["null"])
    # A damaged record has no state to judge a transition from: the writer records what it
    # knows (here a run starting) over an empty record, nothing merged from the damage.
    state = run_dir.record(cellstate.started(pid=41, node="n1", total_steps=3)).to_json()
    assert (state["state"], state["pid"], state["total_steps"], state["error"]) == ("running", 41, 3, None)
    assert run_dir.read_state().to_json() == state
    (aside,) = run_dir.root.glob("state.json.damaged-*")
    assert aside.read_bytes() == DAMAGE["null"]


@pytest.mark.parametrize("damage", ["not_utf8", "list", "null", "wrong_type"])
def test_a_damaged_cell_json_is_shown_and_repaired_by_planning(gridrun: Gridrun, smoke: SweepDir, damage: str) -> None:
    ids = smoke.cell_ids()
    bad = smoke.cell(ids[2])
    # wrong_type here: resources must be a mapping.
    bad.cell_json.write_bytes(DAMAGE[damage] if damage != "wrong_type" else b'{"resources": 4}')
    state = bad.inspect().to_json()
    assert state["state"] == "damaged" and str(bad.cell_json) in state["error"]
    assert "gridrun plan conf=<sweep>" in state["error"]
    shown = gridrun("show", ids[2])
    assert shown.code == 0 and "damaged" in shown.out
    # status lists every cell; a record that cannot vouch for its config.yaml makes its cell damaged.
    rows = json.loads(gridrun("status", "conf=smoke", "--json").out)
    assert [row["cell"] for row in rows] == ids
    assert {row["cell"]: row["state"] for row in rows} == {c: "damaged" if c == ids[2] else "planned" for c in ids}
    # The fix, which `gridrun sweep` applies first: planning writes it again from config.yaml
    # (whose fingerprint still matches), then every cell is dispatched.
    swept = gridrun("sweep", "conf=smoke", "grid.launcher.name=record")
    assert swept.code == 0 and squeezed("1 repaired (cell.json or config.yaml written again)") in squeezed(swept.out)
    assert bad.read_record()["id"] == ids[2]  # type: ignore[index]
    assert bad.inspect().to_json()["state"] == "queued"
    assert [sorted(s["ids"]) for s in submissions(smoke)] == [sorted(ids)]


def test_damaged_metrics_rows_are_skipped_and_named(gridrun: Gridrun, smoke: SweepDir) -> None:
    ids = smoke.cell_ids()
    run_dir = smoke.cell(ids[0])
    put_state(run_dir, state="done", step=2)
    good = [{"step": 0, "split": "val", "val/acc": 0.25}, {"step": 2, "split": "val", "val/acc": 0.5}]
    lines = [json.dumps(good[0]).encode(), b"\xff\xfe not utf-8", b"[1, 2]", b'{"step": "x", "split": "val"}',
             json.dumps(good[1]).encode()]
    run_dir.metrics_jsonl.write_bytes(b"\n".join(lines) + b"\n")
    # The three bad lines are skipped, the two good rows read in order.
    assert run_dir.read_metrics() == good
    damage = run_dir.metrics_damage()
    assert damage is not None and f"{run_dir.metrics_jsonl} line 2 and 2 more line(s) is damaged (not UTF-8" in damage
    collected = gridrun("collect", "conf=smoke")
    assert collected.code == 0, collected.err
    assert squeezed(f"damaged: {run_dir.metrics_jsonl} line 2") in squeezed(collected.out)


def test_an_impossible_accuracy_is_a_damaged_row_named_in_every_output(gridrun: Gridrun, smoke: SweepDir) -> None:
    # Before: NaN and Infinity were dropped silently (the final accuracy fell back to step 10),
    # 1e308 crashed Figure 3 after a Table 1 with `inf`, and 5.0 showed as 500%.
    bad = {"voting-ip-toy-arith-s0": "NaN", "voting-sp-toy-arith-s0": "Infinity",
           "eval_opt-ip-toy-arith-s0": "1e308", "eval_opt-sp-toy-arith-s0": "5.0"}
    for cell_id in smoke.cell_ids():
        run_dir = smoke.cell(cell_id)
        put_state(run_dir, state="done", step=20, attempt=1)
        final = bad.get(cell_id, "0.5")
        run_dir.metrics_jsonl.write_text(
            '{"split": "val", "step": 0, "val/acc": 0.25}\n{"split": "val", "step": 10, "val/acc": 0.375}\n'
            f'{{"split": "val", "step": 20, "val/acc": {final}}}\n'
        )
    collected = gridrun("collect", "conf=smoke")
    assert collected.code == 0, collected.err
    reasons = {"NaN": "nan", "Infinity": "inf", "1e308": "1e+308", "5.0": "5.0"}
    cells = pd.read_parquet(smoke.cells_parquet).set_index("cell")
    for cell_id, value in bad.items():
        file = smoke.cell(cell_id).metrics_jsonl
        why = f"{file} line 3 is damaged (val/acc is {reasons[value]}, not an accuracy in [0, 1])"
        assert squeezed(f"damaged: {why}") in squeezed(collected.out)
        assert cells.loc[cell_id, "state"] == "damaged" and cells.loc[cell_id, "damage"].startswith(why)
    assert set(cells.loc[~cells.index.isin(list(bad)), "state"]) == {"done"}
    for output in (smoke.table1("md"), smoke.table1("csv"), smoke.report("md")):
        text = output.read_text()
        assert "inf" not in text.replace("Infinity", "") and "nan" not in text.lower().split() and "500" not in text
    assert "damaged" in smoke.report("md").read_text()


def test_a_torn_last_metrics_line_is_not_damage(tmp_path: Path) -> None:
    # A kill mid-write leaves half a row; resuming rewrites it, so it is no damage.
    run_dir = RunDir(tmp_path)
    run_dir.metrics_jsonl.write_text('{"step": 1, "split": "train", "lr": 0.1}\n{"step": 2, "split": "tr')
    assert run_dir.read_metrics() == [{"step": 1, "split": "train", "lr": 0.1}]
    assert run_dir.metrics_damage() is None


@pytest.mark.parametrize("damage", ["not_utf8", "list", "null", "wrong_type", "empty"])
def test_a_damaged_sweep_json_affects_only_its_sweep(gridrun: Gridrun, results: Path, damage: str) -> None:
    assert gridrun("plan", "conf=smoke", "grid.launcher.name=record").code == 0
    assert gridrun("plan", "conf=full_matrix", "scale=0.6b", "task=math", "seed=0").code == 0
    smoke = SweepDir(results, "smoke")
    smoke.sweep_json.write_bytes(DAMAGE[damage] if damage != "wrong_type" else b'{"name": "smoke", "cells": {}}')
    everything = gridrun("status", "--json")
    assert everything.code == 0
    rows = json.loads(everything.out)
    assert {row["sweep"] for row in rows} == {"full_matrix"} and len(rows) > 0
    assert f"gridrun: warning: skipped a sweep: {smoke.sweep_json} is damaged" in everything.err
    assert "gridrun plan conf=smoke" in everything.err
    assert gridrun("status").code == 0
    # Naming the sweep: one line naming the file and the fix, exit 2.
    for args in (["status", "conf=smoke"], ["cancel", "conf=smoke"], ["resubmit", "conf=smoke", "--failed"]):
        result = gridrun(*args)
        assert result.code == 2 and f"{smoke.sweep_json} is damaged" in result.err, (args, result.err)
        assert result.err.count("\n") == 1
    # collect does the others and fails for this one; show finds cells of the others.
    collected = gridrun("collect")
    assert collected.code == 2 and (results / "full_matrix" / "table1.md").is_file()
    assert gridrun("show", "base-single-0.6b-math").code == 0
    # The fix: planning again moves the damaged file aside and writes the plan again.
    assert gridrun("plan", "conf=smoke", "grid.launcher.name=record").code == 0
    assert len(smoke.cell_ids()) == 11
    (aside,) = smoke.root.glob("sweep.json.damaged-*")
    assert aside.read_bytes() == (DAMAGE[damage] if damage != "wrong_type" else b'{"name": "smoke", "cells": {}}')


def test_a_binary_config_yaml_is_one_line(gridrun: Gridrun, smoke: SweepDir) -> None:
    run_dir = smoke.cell(smoke.cell_ids()[0])
    planned = run_dir.config_yaml.read_bytes()
    run_dir.config_yaml.write_bytes(b"\xff\xfe\x00binary")
    for args in (["run", str(run_dir.root)], ["show", str(run_dir.root)]):
        result = gridrun(*args)
        assert result.code == 2, result.err
        assert result.err == f"gridrun: error: {run_dir.config_yaml} is damaged (not UTF-8 text): re-plan its sweep " \
            "(`gridrun plan conf=<sweep>`, with --replace if it says so) to write it again\n"
    # Planning again restores it: cell.json still vouches for the planned fingerprint.
    assert gridrun("plan", "conf=smoke", "grid.launcher.name=record").code == 0
    assert run_dir.config_yaml.read_bytes() == planned
    assert run_dir.inspect().to_json()["state"] == "planned"


def test_a_minimal_sweep_json_reads_as_a_typed_plan(tmp_path: Path) -> None:
    # The least a readable plan holds (an older gridrun wrote no launcher, cluster or
    # estimates): typed, with empty settings and None for what it lacks, and written back as read.
    plan = {"name": "old", "cells": [
        {"id": "sa_rl-toy-arith-s0", "kind": "sa_rl", "coords": {"workflow": "single", "task": "arith", "scale": "toy"}},
        {"id": "transfer-voting-toy-arith-s0", "kind": "transfer", "needs": ["sa_rl-toy-arith-s0"],
         "coords": {"workflow": "voting", "task": "arith", "scale": "toy"}, "est_hours": 0.5, "total_steps": 0},
    ], "written_by": "a key no reader types"}
    sweep = SweepDir(tmp_path, "old")
    sweep.root.mkdir()
    sweep.sweep_json.write_text(json.dumps(plan))
    read = sweep.read()
    assert (read.name, read.launcher, read.cluster, read.early_warning, read.plans) == ("old", {}, {}, None, ())
    first, second = read.cells
    assert (first.kind, first.needs, first.est_hours, first.total_steps, first.resources) == ("sa_rl", (), None, None, {})
    assert (second.needs, second.est_hours, second.total_steps) == (("sa_rl-toy-arith-s0",), 0.5, 0)
    assert read.entries()["sa_rl-toy-arith-s0"] is first and sweep.cell_ids() == [first.id, second.id]
    assert read.to_json() == plan
