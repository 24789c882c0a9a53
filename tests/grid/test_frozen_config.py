"""The frozen config.yaml is verifiably whole: cell.json records its hash at plan time, and
`run`, `show`, `status` and `collect` refuse a config.yaml that does not match it (a cut that
still parses would otherwise train with the schema's defaults)."""

from __future__ import annotations

import json

import pytest

from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.rundir import DamagedFile, RunDir
from tests.grid.conftest import Gridrun

pytestmark = pytest.mark.usefixtures("recording_launcher")


def _truncate(run_dir: RunDir) -> None:
    """Cut config.yaml at a line break, as a full disk or an interrupted copy would: it still parses."""
    lines = run_dir.config_yaml.read_text().splitlines(keepends=True)
    run_dir.config_yaml.write_text("".join(lines[: len(lines) // 2]))


def test_a_truncated_config_yaml_makes_its_cell_damaged_everywhere(gridrun: Gridrun, smoke: SweepDir) -> None:
    ids = smoke.cell_ids()
    bad = smoke.cell(ids[0])
    assert len(json.loads(bad.cell_json.read_text())["config_sha256"]) == 64
    _truncate(bad)

    ran = gridrun("run", str(bad.root))
    assert ran.code == 2 and ran.err.count("\n") == 1, ran.err
    assert str(bad.config_yaml) in ran.err and "gridrun plan conf=<sweep>" in ran.err
    assert not bad.metrics_jsonl.exists() and bad.read_state().to_json()["state"] == "damaged"

    shown = gridrun("show", ids[0])  # show is where a damaged cell is looked at: its state and the fix
    assert shown.code == 0 and "damaged" in shown.out and "gridrun plan conf=<sweep>" in " ".join(shown.out.split())
    rows = {row["cell"]: row for row in json.loads(gridrun("status", "conf=smoke", "--json").out)}
    assert rows[ids[0]]["state"] == "damaged" and str(bad.config_yaml) in rows[ids[0]]["error"]
    assert {rows[i]["state"] for i in ids[1:]} == {"planned"}
    collected = gridrun("collect", "conf=smoke")
    assert collected.code == 0 and "damaged" in collected.out

    # The fix the message names: planning writes config.yaml again from the plan.
    assert gridrun("plan", "conf=smoke", "grid.launcher.name=record").code == 0
    assert bad.read_state().to_json()["state"] == "planned"


@pytest.mark.parametrize("edit", ["drop the hash", "schema abc", "schema null", "hash null", "truncated"])
def test_no_value_of_cell_json_switches_the_hash_check_off(gridrun: Gridrun, smoke: SweepDir, edit: str) -> None:
    # Fails closed: a record that cannot vouch for config.yaml makes the cell damaged, so an
    # edited config.yaml never trains, until `gridrun plan` writes the record again.
    cell = smoke.cell(smoke.cell_ids()[0])
    text = cell.cell_json.read_text()
    record = json.loads(text)
    if edit == "drop the hash":
        del record["config_sha256"]
    elif edit != "truncated":
        key, value = {"schema abc": ("schema", "abc"), "schema null": ("schema", None),
                      "hash null": ("config_sha256", None)}[edit]
        record[key] = value
    cell.cell_json.write_text(text[: len(text) // 2] if edit == "truncated" else json.dumps(record))
    planned = cell.config_yaml.read_text()
    cell.config_yaml.write_text(planned.replace("total_steps: 2", "total_steps: 3"))
    with pytest.raises(DamagedFile, match="gridrun plan conf=<sweep>"):
        cell.require()
    assert cell.inspect().to_json()["state"] == "damaged"
    run = gridrun("run", str(cell.root))
    assert run.code == 2 and run.err.startswith("gridrun: error: ") and run.err.count("\n") == 1, run.err
    # The plan either refuses the edited config as a change (until --replace) or, where the
    # record still names the planned fingerprint, writes the planned config.yaml back.
    again = gridrun("plan", "conf=smoke", "grid.launcher.name=record")
    assert again.code == 2 or (again.code == 0 and cell.config_yaml.read_text() == planned and cell.require())


def test_a_cell_planned_before_the_hash_is_repaired_by_the_plan(gridrun: Gridrun, smoke: SweepDir) -> None:
    cell = smoke.cell(smoke.cell_ids()[0])
    record = json.loads(cell.cell_json.read_text())
    del record["config_sha256"]
    cell.cell_json.write_text(json.dumps(record))
    assert cell.inspect().to_json()["state"] == "damaged"
    planned = gridrun("plan", "conf=smoke", "grid.launcher.name=record")
    assert planned.code == 0 and "1 repaired" in planned.out, planned.out
    assert cell.require() is not None and cell.inspect().to_json()["state"] == "planned"


