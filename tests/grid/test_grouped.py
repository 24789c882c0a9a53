"""policy=grouped: any role -> adapter grouping as a policy, planned like shared and isolated.

The fingerprints below were computed, not copied from anywhere: on main at 78a8fde (before
grouped, grpo.estimator and reward.credit existed) with

    from gridrun.grid.compose import Composer; from gridrun.grid.plan import make_plan
    from gridrun.grid.spec import load_spec
    c = Composer(); plan = make_plan(load_spec("smoke", [], c), c)
    print({pc.id: pc.fingerprint for pc in plan.cells})

Those keys are left out of config.yaml at their defaults (runconfig.OMITTED_AT_DEFAULT), so
every shared and isolated cell (and each control) must hash exactly as it did then.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.plan import make_plan
from gridrun.grid.spec import load_spec
from gridrun.seam import routing
from gridrun.seam.mechanisms import GRADIENT_AMPLIFICATION, SP_ROLE_CAPTURE, applies
from gridrun.seam.runconfig import ConfigError

MAIN_78A8FDE_SMOKE = {
    "eval_opt-ip-toy-arith-s0": "f920244d427d0b3b",
    "eval_opt-sp-toy-arith-s0": "953d7da1577ef36a",
    "voting-ip-toy-arith-s0": "e6ecad70825eafce",
    "voting-sp-toy-arith-s0": "292f4423051d91dd",
    "orch_workers-ip-toy-arith-s0": "e8bfa1ba87e51911",
    "orch_workers-sp-toy-arith-s0": "30314ec14fae9590",
    "sa_rl-toy-arith-s0": "df990d746718bb50",
    "base-single-toy-arith": "e93cee124d77e30a",
    "base-eval_opt-toy-arith": "24dd0001cb77784b",
    "base-voting-toy-arith": "c348f271f9318a82",
    "base-orch_workers-toy-arith": "8969a5c4e4658bd4",
}
ORCH_GROUPS = ["+policy.groups.planners=[orchestrator,synthesizer]", "+policy.groups.workers=[worker]"]


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer()


# The toy validation as it was at 78a8fde (200 problems; the default is 300 since the
# validation sizing): with it, every other key of those cells is as it was then.
TOY_VAL_AT_78A8FDE = "task.n_val=200"


def test_shared_and_isolated_cells_keep_their_fingerprints(composer: Composer) -> None:
    plan = make_plan(load_spec("smoke", [TOY_VAL_AT_78A8FDE], composer), composer)
    assert {pc.id: pc.fingerprint for pc in plan.cells} == MAIN_78A8FDE_SMOKE
    # ... because the new keys stay out of config.yaml at their defaults.
    tree = plan.cells[0].config.to_dict()
    assert "groups" not in tree["policy"] and "estimator" not in tree["grpo"] and "reward" not in tree


def test_shared_and_isolated_are_two_groupings(composer: Composer) -> None:
    plan = make_plan(load_spec("smoke", ["workflow=orch_workers", "kind=train"], composer), composer)
    by_id = {pc.id: pc.config for pc in plan.cells}
    assert routing.adapter_groups(by_id["orch_workers-sp-toy-arith-s0"]) == {
        "shared": ("orchestrator", "worker", "synthesizer")}
    assert routing.adapter_groups(by_id["orch_workers-ip-toy-arith-s0"]) == {
        "orchestrator": ("orchestrator",), "worker": ("worker",), "synthesizer": ("synthesizer",)}


def test_a_grouped_cell_plans_with_its_option_name_as_the_policy(composer: Composer) -> None:
    plan = make_plan(load_spec("smoke", ["workflow=orch_workers", "policy=planners", "kind=train"], composer), composer)
    (cell,) = plan.cells
    # The id writes the option's name where shared and isolated write sp and ip.
    assert cell.id == "orch_workers-planners-toy-arith-s0" and cell.entry()["coords"]["policy"] == "planners"
    config = cell.config
    assert config.policy.name == "grouped"
    # Two adapters: the planners (orchestrator and synthesizer, in the workflow's role order)
    # and the workers.
    assert routing.adapter_groups(config) == {"planners": ("orchestrator", "synthesizer"), "workers": ("worker",)}
    assert routing.adapter_of(config) == {"orchestrator": "planners", "synthesizer": "planners", "worker": "workers"}
    assert config.to_dict()["policy"]["groups"] == {"planners": ["orchestrator", "synthesizer"], "workers": ["worker"]}
    # The same grouping given on the command line plans the same config under another id token.
    inline = make_plan(load_spec("smoke", ["workflow=orch_workers", "policy=grouped", "kind=train", *ORCH_GROUPS],
                                 composer), composer).cells[0]
    assert inline.id == "orch_workers-grouped-toy-arith-s0"
    assert inline.config.policy == config.policy


@pytest.mark.parametrize(("groups", "message"), [
    ([], (r"policy=grouped needs policy.groups naming an adapter for every role of orch_workers "
           r"\(orchestrator, worker, synthesizer\)")),
    (["+policy.groups.planners=[orchestrator,synthesiser]", "+policy.groups.workers=[worker]"],
     (r"policy.groups.planners: 'synthesiser' is not a role of orch_workers \(did you mean 'synthesizer'\? "
     r"its roles: orchestrator, worker, synthesizer\)")),
    (["+policy.groups.planners=[orchestrator]", "+policy.groups.workers=[worker]"], r"role 'synthesizer' of orch_workers is in no group"),
    (["+policy.groups.a=[orchestrator,worker]", "+policy.groups.b=[worker,synthesizer]"], r"role 'worker' is in both a and b"),
    (["+policy.groups.a=[orchestrator,worker,synthesizer]", "+policy.groups.b=[]"], r"policy.groups.b is empty"),
    (["+policy.groups.my-group=[orchestrator,worker,synthesizer]"], r"group name 'my-group' must be a letter"),
    # Names that become folders: too long for a file system, or one the adapters' folders use.
    ([f"+policy.groups.{'g' * 300}=[orchestrator,worker,synthesizer]"], r"at most 64 characters"),
    (["+policy.groups.default=[orchestrator,worker,synthesizer]"], r"'default' is a name the adapters' folders use"),
    (["+policy.groups.Merged=[orchestrator,synthesizer]", "+policy.groups.w=[worker]"],
     r"'Merged' is a name the adapters' folders use"),
])
def test_a_bad_grouping_is_one_line_naming_the_fix(composer: Composer, groups: list[str], message: str) -> None:
    spec = load_spec("smoke", ["workflow=orch_workers", "policy=grouped", "kind=train", *groups], composer)
    with pytest.raises((ConfigError, GridError), match=message) as err:
        make_plan(spec, composer)
    assert "\n" not in str(err.value)


def test_groups_under_another_policy_and_per_adapter_knobs_on_a_shared_group_are_refused(composer: Composer) -> None:
    with pytest.raises((ConfigError, GridError), match="policy.groups is for policy=grouped, not isolated"):
        make_plan(load_spec("smoke", ["workflow=orch_workers", "policy=isolated", "kind=train", *ORCH_GROUPS],
                            composer), composer)
    # An LR scale acts on a role's own adapter: the synthesizer shares the planners'.
    with pytest.raises((ConfigError, GridError), match=r"optim.role_lr_scale.synthesizer acts on synthesizer's own "
                       r"adapter, and policy.groups.planners shares it with orchestrator"):
        make_plan(load_spec("smoke", ["workflow=orch_workers", "policy=planners", "kind=train",
                                      "+optim.role_lr_scale.synthesizer=2.0"], composer), composer)
    # The workers are alone on theirs: their scale and steps are keyed by that adapter.
    plan = make_plan(load_spec("smoke", ["workflow=orch_workers", "policy=planners", "kind=train",
                                         "+optim.role_lr_scale.parallel=2.0", "grpo.multiplicity_norm=steps"],
                               composer), composer)
    config = plan.cells[0].config
    assert routing.adapter_lr_scales(config) == {"workers": 2.0} and routing.adapter_steps(config) == {"workers": 1}


def test_a_variant_names_its_settings_per_grouping(tmp_path: Path, composer: Composer) -> None:
    sweep = tmp_path / "g.yaml"
    sweep.write_text("""
axes: {workflow: [orch_workers], task: [arith], scale: [toy], policy: [isolated, shared, planners], seed: [0],
       kind: [train]}
variants:
  natural: []
  weighted: {isolated: [grpo.coherence=0.5], shared: [+grpo.role_weight.parallel=2.0],
             planners: [+grpo.role_weight.synthesizer=2.0]}
""")
    plan = make_plan(load_spec(str(sweep), [], composer), composer)
    by_id = {pc.id: pc.config for pc in plan.cells}
    assert by_id["orch_workers-planners-toy-arith-s0-weighted"].grpo.role_weight == {"synthesizer": 2.0}
    assert by_id["orch_workers-planners-toy-arith-s0-natural"].grpo.role_weight == {}
    sweep.write_text(sweep.read_text().replace("planners: [+grpo.role_weight.synthesizer=2.0]", ""))
    with pytest.raises(GridError, match="variants.weighted has no settings for policy planners: add 'planners: \\[\\]'"):
        make_plan(load_spec(str(sweep), [], composer), composer)


def test_the_mechanisms_are_read_per_adapter_of_a_grouping() -> None:
    planners = {"planners": ("orchestrator", "synthesizer"), "workers": ("worker",)}
    # The workers have an adapter of their own (amplification, as IP) and the planners share
    # one (capture, as SP).
    assert applies(GRADIENT_AMPLIFICATION, "orch_workers", "grouped", planners)
    assert applies(SP_ROLE_CAPTURE, "orch_workers", "grouped", planners)
    every_role_alone = {"orchestrator": ("orchestrator",), "worker": ("worker",), "synthesizer": ("synthesizer",)}
    assert not applies(SP_ROLE_CAPTURE, "orch_workers", "grouped", every_role_alone)
    workers_with_synth = {"o": ("orchestrator",), "ws": ("worker", "synthesizer")}
    assert not applies(GRADIENT_AMPLIFICATION, "orch_workers", "grouped", workers_with_synth)


def test_estimator_and_credit_are_set_by_key_and_change_the_fingerprint(composer: Composer) -> None:
    base = ["workflow=voting", "kind=train", "policy=isolated", TOY_VAL_AT_78A8FDE]
    plain = make_plan(load_spec("smoke", base, composer), composer).cells[0]
    chosen = make_plan(load_spec("smoke", [*base, "grpo.estimator=per_role", "reward.credit=per_role"], composer),
                       composer).cells[0]
    assert plain.fingerprint == MAIN_78A8FDE_SMOKE["voting-ip-toy-arith-s0"] != chosen.fingerprint
    tree = chosen.config.to_dict()
    assert tree["grpo"]["estimator"] == "per_role" and tree["reward"] == {"credit": "per_role"}


def test_per_role_credit_is_refused_where_no_per_role_rewards_are_defined(composer: Composer) -> None:
    # The sa_rl control runs `single`, which defines none; the shuffled control permutes one
    # reward per episode.
    with pytest.raises((ConfigError, GridError), match="reward.credit=per_role: workflow single defines no per-role "
                                                        "rewards"):
        make_plan(load_spec("smoke", ["kind=sa_rl", "reward.credit=per_role"], composer), composer)
    with pytest.raises((ConfigError, GridError), match="the shuffled control permutes"):
        make_plan(load_spec("smoke", ["kind=shuffled", "workflow=voting", "restrict.shuffled.workflow=voting",
                                      "reward.credit=per_role"], composer), composer)


def test_the_credit_study_plans_36_cells_whose_controls_are_the_earlier_studies(composer: Composer) -> None:
    plan = make_plan(load_spec("credit", [], composer), composer)
    by_id = {pc.id: pc for pc in plan.cells}
    assert len(by_id) == 36 and {pc.cell.kind for pc in plan.cells} == {"train"}
    mechanisms = {pc.id: pc for pc in make_plan(load_spec("mechanisms", ["workflow=voting", "kind=train",
                                                                          "variant=natural,injected"], composer),
                                                composer).cells}
    # `natural` and the IP `injected` are the mechanisms study's cells, config for config.
    same = [cell_id for cell_id in by_id if cell_id in mechanisms
            and by_id[cell_id].config.to_dict() == mechanisms[cell_id].config.to_dict()]
    assert sorted(same) == sorted(f"voting-{p}-toy-arith-s{s}-{v}" for p, v in
                                  [("ip", "natural"), ("sp", "natural"), ("ip", "injected")] for s in range(3))
    # The SP `injected` is the early-warning study's SP positive control (its LR ramp and stop).
    warning = next(pc.config for pc in make_plan(load_spec("early_warning", ["workflow=voting", "policy=shared",
                                                                            "variant=injected"], composer),
                                                 composer).cells)
    sp = by_id["voting-sp-toy-arith-s0-injected"].config
    assert (sp.optim, sp.train.total_steps) == (warning.optim, warning.train.total_steps) == (sp.optim, 18)
    ip = by_id["voting-ip-toy-arith-s0-injected_credit"].config
    assert ip.reward.credit == "per_role" and ip.optim.role_lr_scale == {"parallel": 4.0}
    sp_remedy = by_id["voting-sp-toy-arith-s2-injected_per_role_adv"].config
    assert sp_remedy.grpo.estimator == "per_role" and sp_remedy.optim == sp.optim


def test_table1_has_a_column_per_grouping(gridrun, results: Path) -> None:
    from gridrun.grid.sweepdir import SweepDir
    from tests.grid.test_collect import add_cell, coords, read_csv

    sweep = SweepDir(results, "groups")
    data: dict = {"name": "groups", "cells": [], "plans": []}
    add_cell(sweep, data, "orch_workers-ip-1.7b-math-s0", "train", coords("orch_workers", "isolated"), "done",
             {0: 0.40, 10: 0.55})
    add_cell(sweep, data, "orch_workers-planners-1.7b-math-s0", "train", coords("orch_workers", "planners"), "done",
             {0: 0.40, 10: 0.58, 20: 0.50})
    sweep.write(data)
    assert gridrun("collect", "conf=groups").code == 0
    row = read_csv(sweep.table1("csv"))["orch_workers"]
    # The grouping's peak (58) in its own column, beside IP's (55); no SP cell: missing.
    assert (row["ip"], row["sp"], row["policy_planners"]) == ("55.0", "missing", "58.0")
    header = next(line for line in sweep.table1("md").read_text().splitlines() if line.startswith("| Task"))
    assert header.rstrip(" |").endswith("planners")


def test_collect_and_the_calibration_read_a_grouped_cells_grouping_from_its_config(tmp_path: Path,
                                                                                    composer: Composer) -> None:
    from gridrun.analysis.calibration import CellCurve
    from gridrun.analysis.summary import cell_grouping
    from gridrun.seam.runconfig import dump_config
    from gridrun.seam.rundir import RunDir

    (cell,) = make_plan(load_spec("smoke", ["workflow=orch_workers", "policy=planners", "kind=train"], composer),
                        composer).cells
    run_dir = RunDir(tmp_path / cell.id)
    run_dir.root.mkdir()
    run_dir.config_yaml.write_text(dump_config(cell.config))
    groups = cell_grouping(run_dir, "planners")
    assert groups == {"planners": ("orchestrator", "synthesizer"), "workers": ("worker",)}
    # The paper's policies need no config read; an unreadable config leaves the alerts unknown.
    assert cell_grouping(run_dir, "isolated") is None
    run_dir.config_yaml.write_text("cell: [")
    assert cell_grouping(run_dir, "planners") is None
    curve = CellCurve(cell.id, 0, "orch_workers", "planners", None, [], {}, groups)
    assert curve.applies(GRADIENT_AMPLIFICATION) and curve.applies(SP_ROLE_CAPTURE)
    assert not CellCurve(cell.id, 0, "orch_workers", "planners", None, [], {}).applies(SP_ROLE_CAPTURE)


def test_an_isolated_role_named_as_a_reserved_folder_is_refused_at_plan_time(tmp_path: Path, composer: Composer) -> None:
    # Under isolated each role's adapter is named after the role: a plugin's role is held to
    # the adapters' folder rules as a group's name is.
    import dataclasses

    from gridrun.seam import registry
    from gridrun.seam.runconfig import config_from_dict
    from tests.conftest import TOY_CELL, merge

    voting = registry.workflow("voting")
    registry.register_workflow(dataclasses.replace(voting, name="reserved_roles", roles=(voting.roles[0], "default")))
    try:
        with pytest.raises(ConfigError, match=r"reserved_roles's role default: 'default' is a name") as err:
            config_from_dict(merge(TOY_CELL, {"workflow": {"name": "reserved_roles"}, "policy": {"name": "isolated"}}))
        assert "\n" not in str(err.value)
    finally:
        registry._WORKFLOWS.entries.pop("reserved_roles", None)
