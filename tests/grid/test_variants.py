"""Variants: named bundles of overrides crossed with a sweep's train cells like an axis."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.plan import make_plan
from gridrun.grid.spec import load_spec
from gridrun.seam import routing


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer()


SWEEP = """
axes: {workflow: [voting], task: [arith], scale: [toy], policy: [isolated, shared], seed: [0, 1],
       kind: [train, sa_rl, base, shuffled]}
variants:
  natural: []
  injected: {isolated: [+optim.role_lr_scale.parallel=3.0], shared: [+grpo.role_weight.parallel=3.0]}
overrides: [train.total_steps=4]
"""


def sweep_file(tmp_path: Path, text: str = SWEEP) -> str:
    path = tmp_path / "variants.yaml"
    path.write_text(text)
    return str(path)


def test_variants_cross_train_and_shuffled_cells_and_controls_follow(tmp_path: Path, composer: Composer) -> None:
    # 1 workflow x 2 policies x 2 seeds = 4 train cells and 4 shuffled twins, each in 2
    # variants = 16; sa_rl 2 seeds, its shuffled twin 2, base (single + voting) 2: planned once.
    plan = make_plan(load_spec(sweep_file(tmp_path), [], composer), composer)
    ids = [pc.id for pc in plan.cells]
    assert len(ids) == len(set(ids)) == 16 + 2 + 2 + 2
    assert "voting-ip-toy-arith-s0-natural" in ids and "voting-sp-toy-arith-s1-injected" in ids
    assert "shuffled-voting-ip-toy-arith-s0-injected" in ids
    assert {"sa_rl-toy-arith-s0", "shuffled-sa_rl-toy-arith-s1", "base-voting-toy-arith"} <= set(ids)
    by_id = {pc.id: pc for pc in plan.cells}
    natural, injected = by_id["voting-ip-toy-arith-s0-natural"], by_id["voting-ip-toy-arith-s0-injected"]
    # The variant is in config.yaml's cell node, the coordinates and (so) the fingerprint.
    assert injected.config.cell.variant == "injected" and injected.entry()["coords"]["variant"] == "injected"
    assert natural.fingerprint != injected.fingerprint
    assert injected.config.optim.role_lr_scale == {"parallel": 3.0} and natural.config.optim.role_lr_scale == {}
    # The shared cell takes the policy's own form of the injection.
    shared = by_id["voting-sp-toy-arith-s0-injected"].config
    assert shared.grpo.role_weight == {"parallel": 3.0} and shared.optim.role_lr_scale == {}
    # Controls carry no variant, and a sweep without variants keeps its ids and configs.
    assert "variant" not in by_id["sa_rl-toy-arith-s0"].entry()["coords"]
    assert "variant" not in by_id["sa_rl-toy-arith-s0"].config.to_dict()["cell"]


def test_variant_on_the_command_line_picks_some(tmp_path: Path, composer: Composer) -> None:
    spec = load_spec(sweep_file(tmp_path), ["variant=injected", "kind=train", "seed=0"], composer)
    assert [pc.id for pc in make_plan(spec, composer).cells] == [
        "voting-ip-toy-arith-s0-injected", "voting-sp-toy-arith-s0-injected"]


def test_a_typod_variant_is_one_line_with_did_you_mean(tmp_path: Path, composer: Composer) -> None:
    with pytest.raises(GridError, match=r"unknown variant 'injcted' in variant=injcted \(did you mean 'injected'\?\)"):
        load_spec(sweep_file(tmp_path), ["variant=injcted"], composer)


@pytest.mark.parametrize(("bundle", "message"), [
    ("bad: {isolated: []}", "variants.bad has no settings for policy shared: add 'shared: \\[\\]'"),
    ("bad: {isolatd: [], shared: []}", "did you mean 'isolated'"),
    ("bad-name: []", "letters, digits and '_'"),
    ("bad: [seed=3]", "is not a cell setting"),
    ("bad: ['grpo.n=2,4']", "takes one value"),
])
def test_bad_variants_are_refused_naming_the_fix(tmp_path: Path, composer: Composer, bundle: str, message: str) -> None:
    text = SWEEP.replace("  natural: []", f"  natural: []\n  {bundle}")
    with pytest.raises(GridError, match=message):
        load_spec(sweep_file(tmp_path, text), [], composer)


def test_the_mechanisms_study_plans_48_train_cells_and_6_controls(composer: Composer) -> None:
    # 2 workflows x 2 policies x 4 variants x 3 seeds = 48; 3 sa_rl; base single/voting/orch = 3.
    plan = make_plan(load_spec("mechanisms", [], composer), composer)
    kinds = [pc.cell.kind for pc in plan.cells]
    assert (kinds.count("train"), kinds.count("sa_rl"), kinds.count("base")) == (48, 3, 3)
    configs = {pc.id: pc.config for pc in plan.cells}
    assert routing.role_steps(configs["orch_workers-ip-toy-arith-s2-normalized"]) == {"worker": 1}
    assert routing.role_weights(configs["orch_workers-sp-toy-arith-s2-normalized"]) == {"worker": pytest.approx(1 / 3)}
    assert configs["voting-ip-toy-arith-s0-coherence"].grpo.coherence == 1.0
    assert {c.optim.schedule for c in configs.values()} == {"constant"}


def test_the_other_policy_twin_keeps_the_variant() -> None:
    # Fig. 6 and `gridrun plot` draw a cell beside its other-policy twin: of the same variant.
    import pandas as pd

    from gridrun.analysis.paper_figures import twin

    cells = pd.DataFrame([
        {"cell": f"voting-{tag}-s0-{variant}", "kind": "train", "workflow": "voting", "task": "arith", "scale": "toy",
         "seed": 0, "policy": policy, "variant": variant}
        for variant in ("natural", "injected") for tag, policy in (("ip", "isolated"), ("sp", "shared"))])
    assert twin(cells, "voting-ip-s0-injected") == "voting-sp-s0-injected"
    assert twin(cells, "voting-sp-s0-natural") == "voting-ip-s0-natural"
