"""Transfer cells on the grid side: planning (ids, config, `needs`, restrict) and the
dependency on their sa_rl cell when queueing (waiting, blocked, released by a resubmit),
with a launcher that only records what it is handed. The local launcher and SLURM run them
for real in tests/grid/test_local_e2e.py and tests/slurm/test_launcher.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.launchers import base, dispatch
from gridrun.grid.plan import make_plan
from gridrun.grid.spec import load_spec
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.runconfig import load_config
from tests.grid.conftest import Gridrun, tree
from tests.grid.recording import submissions
from tests.states import put_state

SA_RL = "sa_rl-toy-arith-s0"
TRANSFERS = ["transfer-eval_opt-toy-arith-s0", "transfer-voting-toy-arith-s0", "transfer-orch_workers-toy-arith-s0"]


@pytest.fixture(autouse=True)
def recording_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(base.LAUNCHERS, "record", "tests.grid.recording:RecordingLauncher")


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer()


def rows(gridrun: Gridrun) -> dict[str, dict]:
    result = gridrun("status", "conf=smoke", "--json")
    assert result.code == 0, result.err
    return {row["cell"]: row for row in json.loads(result.out)}


# ---------------------------------------------------------------- planning
def test_a_transfer_cell_is_its_workflows_base_cell_with_the_sa_rl_adapter_on_the_generator(
    gridrun: Gridrun, results: Path
) -> None:
    assert gridrun("plan", "conf=smoke", "kind=base,sa_rl,transfer").code == 0
    cells = results / "smoke" / "cells"
    transfer = load_config(cells / "transfer-voting-toy-arith-s0" / "config.yaml")
    base = load_config(cells / "base-voting-toy-arith" / "config.yaml")
    assert (transfer.cell.kind, transfer.cell.seed, transfer.policy.name) == ("transfer", 0, "transfer")
    # Named relative to the cell's own run dir, so the fingerprint ignores the results root.
    assert transfer.policy.adapters == {"generator": f"../{SA_RL}"}
    assert not transfer.trains
    # Evaluated like the base cell: same workflow, lengths, rounds and validation.
    for part in ("workflow", "lengths", "task", "engine", "model"):
        assert getattr(transfer, part) == getattr(base, part), part
    assert transfer.train.val_problems == base.train.val_problems
    entry = {cell["id"]: cell for cell in json.loads((results / "smoke" / "sweep.json").read_text())["cells"]}
    assert entry["transfer-voting-toy-arith-s0"]["needs"] == [SA_RL]
    assert entry["transfer-voting-toy-arith-s0"]["total_steps"] == 0
    assert "needs" not in entry[SA_RL] and "needs" not in entry["base-voting-toy-arith"]
    cell_json = json.loads((cells / "transfer-voting-toy-arith-s0" / "cell.json").read_text())
    assert (cell_json["kind"], cell_json["needs"]) == ("transfer", [SA_RL])


def test_transfer_fingerprints_do_not_depend_on_the_results_root(gridrun: Gridrun, results: Path) -> None:
    args = ("plan", "conf=full_matrix", "scale=1.7b", "task=math", "kind=sa_rl,transfer")
    assert gridrun(*args).code == 0
    assert gridrun(*args, "--results-dir", str(results.parent / "elsewhere")).code == 0
    first, second = (json.loads((root / "full_matrix" / "sweep.json").read_text())["cells"]
                     for root in (results, results.parent / "elsewhere"))
    assert [(c["id"], c["fingerprint"]) for c in first] == [(c["id"], c["fingerprint"]) for c in second]
    assert [c["id"] for c in first] == [
        "sa_rl-1.7b-math-s0", "transfer-eval_opt-1.7b-math-s0", "transfer-voting-1.7b-math-s0",
        "transfer-orch_workers-1.7b-math-s0",
    ]


def test_restrict_plans_a_kind_at_fewer_axis_values_and_the_command_line_replaces_it(composer: Composer) -> None:
    def transfer_scales(*overrides: str) -> list[str]:
        plan = make_plan(load_spec("full_matrix", ["task=math", *overrides], composer), composer)
        return sorted({pc.cell.scale for pc in plan.cells if pc.cell.kind == "transfer"})

    assert transfer_scales() == ["1.7b"]  # the sweep file's, as the paper's Table 3
    assert transfer_scales("restrict.transfer.scale=0.6b,4b") == ["0.6b", "4b"]
    # A narrower axis than the restriction: their intersection (no 1.7B, no transfer cell).
    assert transfer_scales("scale=0.6b") == []
    # The restriction touches only its kind: sa_rl cells at every scale still.
    plan = make_plan(load_spec("full_matrix", ["task=math", "kind=sa_rl,transfer"], composer), composer)
    assert [pc.id for pc in plan.cells if pc.cell.kind == "sa_rl"] == [
        "sa_rl-0.6b-math-s0", "sa_rl-1.7b-math-s0", "sa_rl-4b-math-s0"
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("restrict.tranfer.scale=1.7b", "restrict.tranfer: unknown kind 'tranfer' (did you mean 'transfer'?)"),
        ("restrict.transfer.scal=1.7b",
         "restrict.transfer.scal: name an axis (workflow, task, scale, policy, seed) (did you mean 'scale'?)"),
        ("restrict.transfer.scale=2b", "unknown scale '2b' (did you mean '4b'?)"),
        ("restrict.transfer.seed=x", "seed 'x' is not an integer"),
    ],
)
def test_a_bad_restriction_is_one_line_naming_the_fix(composer: Composer, override: str, message: str) -> None:
    with pytest.raises(GridError, match=re.escape(message)):
        load_spec("full_matrix", [override], composer)


def test_a_transfer_cell_without_its_sa_rl_cell_is_refused_until_that_is_planned(
    gridrun: Gridrun, results: Path
) -> None:
    refused = gridrun("plan", "conf=smoke", "kind=transfer")
    # Refused before anything is written (the sweep's lock file aside).
    assert refused.code == 2 and tree(results) == ["smoke", "smoke/.lock"]
    assert (
        f"transfer-eval_opt-toy-arith-s0 needs {SA_RL}, which is neither in this plan nor in sweep 'smoke': "
        "plan it too (add sa_rl to kind=)"
    ) in refused.err
    assert gridrun("plan", "conf=smoke", "kind=sa_rl").code == 0
    added = gridrun("plan", "conf=smoke", "kind=transfer")
    assert added.code == 0 and "3 new" in added.out


# ---------------------------------------------------------------- queueing
@pytest.fixture
def smoke(gridrun: Gridrun, results: Path) -> SweepDir:
    assert gridrun("plan", "conf=smoke", "kind=transfer,sa_rl", "grid.launcher.name=record").code == 0
    return SweepDir(results, "smoke")


def test_transfer_cells_are_handed_over_after_their_sa_rl_and_show_waiting(gridrun: Gridrun, smoke: SweepDir) -> None:
    # Handed in after them: queued after their sa_rl all the same.
    with smoke.lock():
        handed = dispatch.queue(smoke, [*TRANSFERS, SA_RL], base.make_launcher({"name": "record"}))
    assert handed == [SA_RL, *TRANSFERS]
    status = rows(gridrun)
    assert [status[t]["waiting"] for t in TRANSFERS] == [SA_RL] * 3
    assert {status[t]["state"] for t in TRANSFERS} == {"queued"} and status[SA_RL]["waiting"] is None
    table = gridrun("status", "conf=smoke")
    assert table.out.count(f"waiting: {SA_RL}") == 3
    put_state(smoke.cell(SA_RL), state="done")
    assert {rows(gridrun)[t]["waiting"] for t in TRANSFERS} == {None}


def test_a_failed_sa_rl_blocks_its_transfer_cells_and_resubmitting_it_releases_them(
    gridrun: Gridrun, smoke: SweepDir
) -> None:
    with smoke.lock():
        dispatch.queue(smoke, smoke.cell_ids(), base.make_launcher({"name": "record"}))
    put_state(smoke.cell(SA_RL), state="failed", error="boom")
    status = rows(gridrun)
    assert {status[t]["state"] for t in TRANSFERS} == {"blocked"}
    assert status[TRANSFERS[0]]["error"] == (
        f"blocked: it needs {SA_RL}, which is failed; resubmit that (`gridrun resubmit --cells {SA_RL}`) "
        "and this cell follows it"
    )
    # Written state.json is untouched: blocked is how the grid reads a queued cell.
    assert smoke.cell(TRANSFERS[0]).read_state().to_json()["state"] == "queued"
    assert gridrun("status", "conf=smoke").out.count(f"blocked: {SA_RL}") == 3
    # A blocked cell alone is not queued again: it would wait for nothing.
    alone = gridrun("resubmit", "conf=smoke", "--cells", TRANSFERS[1])
    assert alone.code == 0 and len(submissions(smoke)) == 1
    # Resubmitting the sa_rl cell (as --failed does) brings its blocked cells along, after it.
    again = gridrun("resubmit", "conf=smoke", "--failed")
    assert again.code == 0 and "resubmitted 4 cells" in again.out
    assert submissions(smoke)[-1]["ids"] == [SA_RL, *TRANSFERS]
    status = rows(gridrun)
    assert {status[t]["state"] for t in TRANSFERS} == {"queued"} and {status[t]["attempt"] for t in TRANSFERS} == {2}
    assert [a["state"] for a in smoke.cell(TRANSFERS[0]).read_state().to_json()["attempts"]] == ["blocked"]


def test_cancel_takes_blocked_cells_too(gridrun: Gridrun, smoke: SweepDir) -> None:
    with smoke.lock():
        dispatch.queue(smoke, smoke.cell_ids(), base.make_launcher({"name": "record"}))
    put_state(smoke.cell(SA_RL), state="failed")
    result = gridrun("cancel", "conf=smoke")
    assert result.code == 0
    assert {smoke.cell(t).read_state().to_json()["state"] for t in TRANSFERS} == {"cancelled"}
    # A cell the user cancelled stays cancelled: it is no longer read as blocked.
    assert {rows(gridrun)[t]["state"] for t in TRANSFERS} == {"cancelled"}


# ---------------------------------------------------------------- eval cells
def test_eval_cells_take_the_sweeps_adapters_with_their_own_coordinates_filled_in(composer: Composer) -> None:
    # sweeps/rescore.yaml: every role of each eval cell takes the peak adapter of the smoke
    # cell at its coordinates ({cell}: the train cell, sa_rl for single), greedily, on the
    # whole validation split. Two seeds: each eval cell names its own seed's cell.
    plan = make_plan(load_spec("rescore", ["seed=0,1"], composer), composer)
    by_id = {pc.id: pc.config for pc in plan.cells}
    # The single workflow too (an SA-RL adapter re-scored), as base cells add it; the policy
    # axis says whose adapters a multi-agent eval cell takes.
    assert len(by_id) == 2 * (1 + 3 * 2)
    assert {"eval-single-toy-arith-s1", "eval-voting-ip-toy-arith-s0", "eval-orch_workers-sp-toy-arith-s1"} < set(by_id)
    smoke = "../../../smoke/cells"
    assert by_id["eval-voting-sp-toy-arith-s1"].policy.adapters == {"all_roles": f"{smoke}/voting-sp-toy-arith-s1@peak"}
    assert by_id["eval-single-toy-arith-s0"].policy.adapters == {"all_roles": f"{smoke}/sa_rl-toy-arith-s0@peak"}
    config = by_id["eval-voting-ip-toy-arith-s1"]
    assert (config.policy.name, config.trains, config.steps_to_train) == ("transfer", False, 0)
    assert (config.sampling.val_temperature, config.train.val_problems) == (0.0, None)
    # A one-role source from the command line, a cell id of the same sweep ({policy}: the tag).
    one = load_spec("smoke", ["kind=eval", "workflow=voting", "policy=shared",
                              "+policy.adapters.generator='{workflow}-{policy}-{scale}-{task}-s{seed}@5'"], composer)
    assert make_plan(one, composer).cells[-1].config.policy.adapters == {"generator": "voting-sp-toy-arith-s0@5"}
    bad = load_spec("smoke", ["kind=eval", "+policy.adapters.generator='{workflow}-s{sed}'"], composer)
    with pytest.raises(GridError, match=r"may name \{cell\}, \{workflow\}, \{policy\}, \{task\}, \{scale\} and \{seed\}, "
                                        r"not 'sed'"):
        make_plan(bad, composer)
