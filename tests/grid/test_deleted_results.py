"""A results folder deleted under a running sweep stays deleted: the cell's run writes nothing
into what survives `rm -rf` (nor into a folder planned again in its place), and the next plan
moves any leftovers aside instead of demanding --replace."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gridrun.grid.sweepdir import SweepDir
from gridrun.seam import cellstate
from gridrun.seam.rundir import NotARunDir, RunDir
from tests.grid.conftest import Gridrun

pytestmark = pytest.mark.usefixtures("recording_launcher")

ROW = {"step": 1, "split": "train", "reward/mean": 0.5}


def test_a_run_writes_nothing_into_what_rm_rf_left(smoke: SweepDir) -> None:
    cell = smoke.cell(smoke.cell_ids()[0])
    run = RunDir(cell.root)
    with run.hold():
        # `rm -rf` part way: the files it reached first are gone, the folder not yet.
        for path in (cell.config_yaml, cell.cell_json, cell.state_json):
            path.unlink()
        with pytest.raises(NotARunDir, match="is gone"):
            run.append_metrics([ROW])
        with pytest.raises(NotARunDir):
            run.record(cellstate.progressed(step=1))
        with pytest.raises(NotARunDir):
            run.check_present()
    assert not cell.metrics_jsonl.exists() and not cell.state_json.exists()


def test_a_run_writes_nothing_into_a_folder_planned_again_in_its_place(gridrun: Gridrun, smoke: SweepDir) -> None:
    cell_id = smoke.cell_ids()[0]
    run = RunDir(smoke.cell(cell_id).root)
    with run.hold():
        shutil.rmtree(smoke.root)
        assert gridrun("plan", "conf=smoke", "grid.launcher.name=record").code == 0
        # Same path, another folder: the old run's rows are not this cell's.
        with pytest.raises(NotARunDir, match="planned again"):
            run.append_metrics([ROW])
        with pytest.raises(NotARunDir, match="planned again"):
            run.record(cellstate.progressed(step=1))
    fresh = smoke.cell(cell_id)
    assert not fresh.metrics_jsonl.exists() and fresh.read_state().to_json()["state"] == "planned"


def test_leftovers_of_a_deleted_run_are_moved_aside_without_replace(gridrun: Gridrun, results: Path) -> None:
    # What a race with `rm -rf` can leave: metric rows and a state, no config.yaml or cell.json.
    assert gridrun("plan", "conf=smoke", "kind=sa_rl", "grid.launcher.name=record").code == 0
    cell = SweepDir(results, "smoke").cell("sa_rl-toy-arith-s0")
    for path in (cell.config_yaml, cell.cell_json):
        path.unlink()
    cell.metrics_jsonl.write_text('{"step": 1, "split": "train"}\n')
    result = gridrun("plan", "conf=smoke", "kind=sa_rl", "grid.launcher.name=record")
    assert result.code == 0 and "1 replaced" in result.out, result.out + result.err
    (aside,) = (results / "smoke" / "replaced").iterdir()
    assert (aside / "metrics.jsonl").read_text() == '{"step": 1, "split": "train"}\n'
    assert cell.read_state().to_json()["state"] == "planned"


def test_a_run_whose_config_yaml_alone_is_gone_still_needs_replace(gridrun: Gridrun, results: Path) -> None:
    # cell.json still says what ran: its history is not moved aside without being asked.
    assert gridrun("plan", "conf=smoke", "kind=sa_rl", "grid.launcher.name=record").code == 0
    cell = SweepDir(results, "smoke").cell("sa_rl-toy-arith-s0")
    cell.config_yaml.unlink()
    cell.metrics_jsonl.write_text('{"step": 1, "split": "train"}\n')
    result = gridrun("plan", "conf=smoke", "kind=sa_rl", "grid.launcher.name=record")
    assert result.code == 2 and "--replace" in result.err
