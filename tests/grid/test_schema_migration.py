"""Upgrades that keep a sweep: a cell planned before a run key existed re-plans unchanged.

cell.json records the run schema's version (runconfig.SCHEMA_VERSION); runconfig.MIGRATIONS
says what each key added since meant in older cells, so their fingerprints keep their meaning
and a started cell resumes instead of being `replaced`. A key that really changed still refuses.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from gridrun.seam.runconfig import SCHEMA_VERSION, load_config
from gridrun.seam.rundir import config_digest
from tests.grid.conftest import Gridrun

CELL = "voting-sp-toy-arith-s0"


def _as_planned_before_the_keys(cell: Path) -> str:
    """Rewrite `cell` as an older gridrun planned it: config.yaml without the keys added since
    (grpo.policy_loss, optim.role_lr_ramp), cell.json with that tree's fingerprint and no schema."""
    tree = yaml.safe_load((cell / "config.yaml").read_text())
    del tree["grpo"]["policy_loss"]
    del tree["optim"]["role_lr_ramp"]
    text = yaml.safe_dump(tree, sort_keys=False)
    (cell / "config.yaml").write_text(text)
    old = hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    record = json.loads((cell / "cell.json").read_text())
    record.pop("schema", None)
    record.update(fingerprint=old, config_sha256=config_digest(text.encode()))
    (cell / "cell.json").write_text(json.dumps(record))
    # A started cell: its metric rows must survive the re-plan.
    (cell / "metrics.jsonl").write_text('{"step": 1, "train/reward": 0.5}\n')
    return old


def test_a_cell_planned_before_a_key_existed_replans_unchanged_and_resumes(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    cell = results / "smoke" / "cells" / CELL
    planned = json.loads((cell / "cell.json").read_text())
    assert planned["schema"] == SCHEMA_VERSION
    old = _as_planned_before_the_keys(cell)
    assert old != planned["fingerprint"]  # the added keys moved the hash: what stranded sweeps
    again = gridrun("plan", "conf=smoke")
    assert again.code == 0, again.err
    assert "replaced" not in again.out or "0 replaced" in again.out
    assert not (results / "smoke" / "replaced").exists()
    assert (cell / "metrics.jsonl").read_text().startswith('{"step": 1')
    record = json.loads((cell / "cell.json").read_text())
    # Migrated: the current schema and fingerprint, config.yaml written out in full again.
    assert record["schema"] == SCHEMA_VERSION and record["fingerprint"] == planned["fingerprint"]
    config = load_config(cell / "config.yaml")
    assert config.grpo.policy_loss == "vanilla" and config.optim.role_lr_ramp == 0
    assert gridrun("plan", "conf=smoke").code == 0  # and stays unchanged


def test_a_migrated_cell_whose_key_really_changed_refuses_naming_it(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke", "workflow=voting", "policy=shared", "kind=train").code == 0
    _as_planned_before_the_keys(results / "smoke" / "cells" / CELL)
    refused = gridrun("plan", "conf=smoke", "workflow=voting", "policy=shared", "kind=train", "optim.role_lr_ramp=5")
    assert refused.code == 2
    lines = [line for line in refused.err.splitlines() if CELL in line]
    # One line naming the key, with the value the older cell ran with (not '<absent>').
    assert lines == [f"  {CELL}: optim.role_lr_ramp: 0 -> 5"], refused.err
