"""policy=grouped on the toy world: its routing, its adapters learning from their own roles
only, a whole cell trained and exported (one folder per group)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridrun.cellrun import run_cell
from gridrun.export import export
from gridrun.seam.rundir import RunDir
from tests.conftest import make_cell
from tests.test_export import assert_exported_as_trained
from tests.test_training import changed, run_update, seqs_for, snapshot, trainer_for

pytestmark = pytest.mark.usefixtures("toy_world")

PLANNERS = {"name": "grouped", "groups": {"planners": ["orchestrator", "synthesizer"], "workers": ["worker"]}}


def test_a_grouping_routes_each_role_to_its_groups_adapter_and_only_its_tokens_move_it(tmp_path: Path) -> None:
    trainer = trainer_for(make_cell(tmp_path, workflow={"name": "orch_workers"}, policy=PLANNERS))
    routing = trainer.routing
    # Two adapters (not IP's three, not SP's one), each with its own optimizer.
    assert routing.trainable == ("planners", "workers") and set(trainer.optimizers) == {"planners", "workers"}
    assert routing.role_adapter == {"orchestrator": "planners", "worker": "workers", "synthesizer": "planners"}
    assert routing.roles_of("planners") == ["orchestrator", "synthesizer"]
    # The synthesizer's tokens move the planners' adapter and nothing else.
    before = snapshot(trainer.model)
    run_update(trainer, seqs_for(trainer, ["synthesizer"]))
    moved = changed(before, trainer.model)
    assert moved and all(".planners." in n for n in moved)
    assert not any(".workers." in n for n in moved)


def test_a_grouped_cell_trains_and_exports_one_adapter_per_group(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, "orch_workers-planners-toy-arith-s0", workflow={"name": "orch_workers"}, policy=PLANNERS,
                     train={"total_steps": 2, "val_every": 2, "save_every": 2})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    train = [r for r in RunDir(cell).read_metrics() if r["split"] == "train"]
    # The per-adapter diagnostics name the groups; the per-role ones every role.
    assert {"adapter/planners/opt_steps", "adapter/workers/opt_steps"} <= set(train[-1])
    assert all(f"role/{r}/grad_share" in train[-1] for r in ("orchestrator", "worker", "synthesizer"))
    out = export(RunDir(cell), "last", tmp_path / "export")
    assert json.loads((out / "roles.json").read_text()) == {
        "orchestrator": "planners", "worker": "workers", "synthesizer": "planners"}
    assert_exported_as_trained(out, RunDir(cell).checkpoint(2) / "adapters", ("planners", "workers"))
