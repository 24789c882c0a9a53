"""The whole-run presets seen from the grid: `preset=released` (the default) and
`preset=as_written` set GRPO, the LR schedule and its stepping, the workflow protocol, and
each task's reward and question settings; the preset's name is in each cell's config (so in
its fingerprint); any item stays overridable, and `gridrun show` names the ones that differ."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridrun.grid.compose import Composer
from gridrun.grid.presets import departures, dotted, preset_names, preset_settings
from gridrun.seam.runconfig import load_config
from tests.grid.conftest import Gridrun

CELL = "voting-ip-toy-arith-s0"


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer()


def test_released_is_the_default_and_as_written_is_one_override(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    config = load_config(results / "smoke" / "cells" / CELL / "config.yaml")
    grpo, optim, protocol = config.grpo, config.optim, config.protocol
    assert config.preset == "released"
    assert (grpo.group_key, grpo.clip_ratio_c, grpo.log_ratio_clamp, grpo.kl_clamp) == ("problem_trajectory", 3.0, 20.0, 10.0)
    assert (grpo.minibatch_order, grpo.partial_minibatch, grpo.chi2_reduction, grpo.singleton_advantage) == (
        "balanced", "scaled", "micro_batch", "raw")
    assert (optim.schedule, optim.lr_advance) == ("constant", "per_update")
    assert (protocol.eval_opt_context, protocol.aggregator_parse, protocol.verdict_box, protocol.orch_workers) == (
        "full", "released", "first", "parsed")
    assert (config.task.grader, config.task.format_penalty) == ("released", 0.0)
    # Switching the preset is config drift: refused, naming the keys, until --replace.
    refused = gridrun("plan", "conf=smoke", "preset=as_written")
    assert refused.code == 2 and "preset: 'released' -> 'as_written'" in refused.err
    assert gridrun("plan", "conf=smoke", "preset=as_written", "--replace").code == 0
    config = load_config(results / "smoke" / "cells" / CELL / "config.yaml")
    grpo, optim, protocol = config.grpo, config.optim, config.protocol
    assert config.preset == "as_written"
    assert (grpo.group_key, grpo.clip_ratio_c, grpo.log_ratio_clamp, grpo.kl_clamp) == ("problem", None, None, None)
    # Where the text is silent (chi2's reduction, singletons, what the evaluator sees, how
    # choices and verdicts are parsed) as_written keeps the released behaviour.
    assert (grpo.minibatch_order, grpo.partial_minibatch, grpo.chi2_reduction, grpo.singleton_advantage) == (
        "shuffled", "full", "micro_batch", "raw")
    assert (optim.schedule, optim.lr_advance) == ("cosine", "per_step")
    assert (protocol.eval_opt_context, protocol.aggregator_parse, protocol.verdict_box, protocol.orch_workers) == (
        "full", "released", "first", "fixed")
    assert (config.task.grader, config.task.format_penalty) == ("math_verify", -0.1)
    shown = gridrun("show", CELL, "conf=smoke")
    assert shown.code == 0 and "preset: as_written (no item set otherwise)" in shown.out


def test_an_item_set_otherwise_stays_and_show_names_it(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke", "preset=as_written", "optim.lr_advance=per_update",
                   "task.format_penalty=0.0").code == 0
    config = load_config(results / "smoke" / "cells" / CELL / "config.yaml")
    assert (config.preset, config.optim.lr_advance, config.optim.schedule) == ("as_written", "per_update", "cosine")
    assert (config.task.grader, config.task.format_penalty) == ("math_verify", 0.0)
    shown = gridrun("show", CELL, "conf=smoke")
    assert shown.code == 0 and "preset: as_written, except:" in shown.out
    assert "optim.lr_advance: 'per_update' (the preset's: 'per_step')" in shown.out
    assert "task.format_penalty: 0.0 (the preset's: -0.1)" in shown.out
    assert "task.grader" not in shown.out


@pytest.mark.parametrize("task", ["arith", "math", "code"])
def test_each_preset_composes_for_every_task_and_departs_from_nothing(composer: Composer, task: str) -> None:
    # Composed with no other override, a cell is exactly its preset: no departures; and the
    # two presets differ on every item one of them sets (else the item would be no item).
    scale = "toy" if task == "arith" else "1.7b"
    trees = {p: composer.compose([f"preset={p}", f"task={task}", f"scale={scale}", "workflow=voting"])
             for p in preset_names()}
    assert set(trees) == {"released", "as_written"}
    for tree in trees.values():
        assert departures(tree) == []
    # The two presets' cells differ exactly in the preset's name and the items as_written
    # sets: a preset switch changes nothing else of a cell (so of its fingerprint).
    flat = {p: dotted({k: v for k, v in tree.items() if k != "grid"}) for p, tree in trees.items()}
    changed = {k for k in flat["released"] if flat["released"][k] != flat["as_written"].get(k)}
    assert changed == {"preset"} | set(preset_settings("as_written", task))
    as_written_seen_as_released = departures({**trees["as_written"], "preset": "released"})
    keys = {key for key, _, _ in as_written_seen_as_released}
    assert {"grpo.group_key", "optim.schedule", "optim.lr_advance", "protocol.orch_workers"} <= keys
    task_keys = {"arith": {"task.grader", "task.format_penalty"},
                 "math": {"task.grader", "task.format_penalty", "task.question"},
                 "code": {"task.code_reward_mode", "task.code_test_timeout_s", "task.code_budget_per_test_s",
                          "task.code_budget_cap_s", "task.question"}}[task]
    assert {k for k in keys if k.startswith("task.")} == task_keys


def test_an_unknown_preset_names_the_valid_ones(gridrun: Gridrun, results: Path) -> None:
    refused = gridrun("plan", "conf=smoke", "preset=releesed")
    assert refused.code == 2 and "released" in refused.err and "Traceback" not in refused.err
