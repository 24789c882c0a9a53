"""Registries end to end: a fourth workflow (`debate`) and a second toy task (`sub`), from a
module outside gridrun named in their option files' `plugin:`, composed and planned through
the grid like any cell and run for one step each by the local launcher, in subprocesses that
find the plugin from the frozen config.yaml alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gridrun.grid import PACKAGE_DIR
from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.launchers.base import make_launcher
from gridrun.grid.launchers.dispatch import queue, runnable
from gridrun.grid.plan import freeze, make_plan
from gridrun.grid.spec import load_spec
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.registry import ConfigError
from gridrun.seam.runconfig import config_from_dict, load_config

EXAMPLE = Path(__file__).parent / "plugin_example" / "debate_and_subtraction.py"
ROW = {"max_prompt_tokens": 256, "max_response_tokens": 24, "relative_cost": 1.0}


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    path = tmp_path / "my_options.py"
    shutil.copy(EXAMPLE, path)
    return path


def conf_with_options(root: Path, plugin: Path) -> Path:
    """This repository's conf/ plus the new options' YAMLs: all a user adds besides the module."""
    conf = root / "conf"
    shutil.copytree(PACKAGE_DIR / "conf", conf)
    # The module that registers each, and what differs from its params' defaults (sub's n_val).
    (conf / "workflow" / "debate.yaml").write_text(f"plugin: {plugin}\n")
    (conf / "task" / "sub.yaml").write_text(f"plugin: {plugin}\nn_val: 4\n")
    # Their rows in the (workflow, task) table: debate on arith, single on sub.
    tables = yaml.safe_load((conf / "tables.yaml").read_text())
    tables["workflow_task"]["debate"] = {"arith": ROW}
    tables["workflow_task"]["single"]["sub"] = ROW
    (conf / "tables.yaml").write_text("# @package grid\n" + yaml.safe_dump(tables))
    return conf


def test_a_plugin_workflow_and_task_plan_and_run_one_step_each(plugin: Path, tmp_path: Path) -> None:
    composer = Composer(conf_with_options(tmp_path, plugin))
    sweep_file = tmp_path / "plugged.yaml"
    sweep_file.write_text(textwrap.dedent("""\
        axes: {workflow: [debate], task: [arith, sub], scale: [toy], policy: [shared], seed: [0], kind: [train, sa_rl]}
        restrict: {train: {task: [arith]}, sa_rl: {task: [sub]}}
        overrides: [train.total_steps=1, train.batch_problems=2, train.ppo_mini_batch=2, grpo.n=2,
                    train.val_every=1, train.save_every=1, train.val_problems=4, train.val_samples=1]
    """))
    plan = make_plan(load_spec(str(sweep_file), [], composer), composer)
    assert [pc.id for pc in plan.cells] == ["debate-sp-toy-arith-s0", "sa_rl-toy-sub-s0"]
    sweep = SweepDir(tmp_path / "results", "plugged")
    freeze(plan, sweep)
    frozen = yaml.safe_load(sweep.cell("debate-sp-toy-arith-s0").config_yaml.read_text())
    # The cell's config names the module, so `gridrun run` finds the workflow in any process.
    assert frozen["workflow"] == {"name": "debate", "plugin": str(plugin), "exchanges": 1}

    launcher = make_launcher({**plan.launcher, "max_parallel": 2})
    ids = queue(sweep, runnable(sweep, [pc.id for pc in plan.cells]), launcher)
    code = launcher.wait(sweep, ids)
    logs = {i: sweep.cell(i).stderr_log.read_text()[-2000:] for i in ids}
    assert code == 0, logs
    for cell_id in ids:
        assert sweep.cell(cell_id).read_state().to_json()["state"] == "done", logs[cell_id]
    rows = [json.loads(line) for line in sweep.cell("debate-sp-toy-arith-s0").metrics_jsonl.read_text().splitlines()]
    # One training step over both new roles, and the workflow's own validation metric.
    assert any("role/skeptic/tokens" in row for row in rows)
    assert any("val/role/proposer/final_acc" in row for row in rows)
    sub_rows = sweep.cell("sa_rl-toy-sub-s0").metrics_jsonl.read_text().splitlines()
    assert any(json.loads(line).get("step") == 1 for line in sub_rows)
    assert load_config(sweep.cell("sa_rl-toy-sub-s0").config_yaml).task.n_val == 4
    # `gridrun collect`, a fresh process, replays the mechanism alerts for the debate cell: it
    # finds the workflow from the cell's config. SP role capture was checked at its one step;
    # gradient amplification does not apply (SP, and debate has no parallel role).
    collected = subprocess.run([sys.executable, "-P", "-m", "gridrun.cli", "collect", "--results-dir",
                                str(tmp_path / "results")], check=False, capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    debate = pd.read_parquet(sweep.cells_parquet).set_index("cell").loc["debate-sp-toy-arith-s0"]
    assert debate["alert/sp_role_capture/steps"] == 1 and pd.isna(debate["alert/gradient_amplification/steps"])


def test_a_task_without_a_prompt_for_a_workflows_role_is_refused_naming_it(plugin: Path) -> None:
    # sub's prompts know `generator` only; debate's roles were added to arith, not to sub.
    with pytest.raises(ConfigError, match="task 'sub' has no prompt for role 'proposer' of workflow 'debate'"):
        config_from_dict({"cell": {"id": "x", "kind": "train"}, "workflow": {"name": "debate", "plugin": str(plugin)},
                          "task": {"name": "sub", "plugin": str(plugin)}})


def test_a_plugin_options_keys_are_checked_like_a_built_in_ones(plugin: Path) -> None:
    with pytest.raises(ConfigError, match=r"workflow debate has no key 'rounds' \(its keys: exchanges\)"):
        config_from_dict({"cell": {"id": "x", "kind": "train"},
                          "workflow": {"name": "debate", "plugin": str(plugin), "rounds": 2}})
    with pytest.raises(ConfigError, match="give the module file as an absolute path"):
        config_from_dict({"cell": {"id": "x", "kind": "train"}, "workflow": {"name": "debate", "plugin": "x.py"}})


def test_an_option_file_naming_no_registered_option_is_one_line_naming_the_file(tmp_path: Path) -> None:
    # The option's schema comes from the module its file names; without one, or with a module
    # that is not there, composing it fails naming the file and the fix. (`mine`: a name no
    # other test registers; the registries and Hydra's store live as long as the process.)
    conf = tmp_path / "conf"
    shutil.copytree(PACKAGE_DIR / "conf", conf)
    option = conf / "workflow" / "mine.yaml"
    option.write_text("plugin: /nowhere/my_options.py\n")
    with pytest.raises(GridError, match=r"^conf/workflow/mine.yaml: plugin '/nowhere/my_options.py' does not exist"):
        Composer(conf).compose(["workflow=mine"])
    option.write_text("# a workflow of my own\n")
    with pytest.raises(GridError, match=r"^conf/workflow/mine.yaml: unknown workflow 'mine' .*in workflow.plugin$"):
        Composer(conf).compose(["workflow=mine"])
