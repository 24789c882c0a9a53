"""The grpo/ presets seen from the grid: part of each cell's config (so of its fingerprint),
switched with `grpo=...`, shown by `gridrun show`."""

from __future__ import annotations

from pathlib import Path

from gridrun.runconfig import load_config
from tests.grid.conftest import Gridrun

CELL = "voting-ip-toy-arith-s0"


def test_released_is_the_default_and_as_written_is_one_override(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    grpo = load_config(results / "smoke" / "cells" / CELL / "config.yaml").grpo
    assert (grpo.preset, grpo.group_key, grpo.clip_ratio_c, grpo.log_ratio_clamp, grpo.kl_clamp) == (
        "released", "problem_trajectory", 3.0, 20.0, 10.0
    )
    assert (grpo.minibatch_order, grpo.partial_minibatch) == ("balanced", "scaled")
    # Switching the preset is config drift: refused, naming the keys, until --replace.
    refused = gridrun("plan", "conf=smoke", "grpo=as_written")
    assert refused.code == 2 and "grpo.preset: 'released' -> 'as_written'" in refused.err
    assert gridrun("plan", "conf=smoke", "grpo=as_written", "--replace").code == 0
    grpo = load_config(results / "smoke" / "cells" / CELL / "config.yaml").grpo
    assert (grpo.preset, grpo.group_key, grpo.clip_ratio_c, grpo.log_ratio_clamp, grpo.kl_clamp) == (
        "as_written", "problem", None, None, None
    )
    assert (grpo.minibatch_order, grpo.partial_minibatch) == ("shuffled", "full")
    shown = gridrun("show", CELL, "conf=smoke")
    assert shown.code == 0 and "preset: as_written" in shown.out


def test_an_unknown_preset_names_the_valid_ones(gridrun: Gridrun, results: Path) -> None:
    refused = gridrun("plan", "conf=smoke", "grpo=releesed")
    assert refused.code == 2 and "released" in refused.err and "Traceback" not in refused.err
