"""Planning: cell counts, ids, resolved configs, fingerprints and refusing config drift."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

from gridrun.grid import PACKAGE_DIR, REPO_ROOT
from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.plan import fingerprint, freeze, make_plan
from gridrun.grid.spec import load_spec
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam import registry
from gridrun.seam.runconfig import RunConfig, config_from_dict, dump_config, load_config
from tests.grid.conftest import Gridrun, tree

GOLDEN = Path(__file__).parent / "golden"


def freeze_full_matrix(results: Path, *overrides: str) -> None:
    """`gridrun plan conf=full_matrix OVERRIDES` without its check that the files are fetched:
    for tests of the default data root (<repo>/data), which holds no prepared data here."""
    composer = Composer()
    plan = make_plan(load_spec("full_matrix", list(overrides), composer), composer)
    sweep = SweepDir(results, "full_matrix")
    with sweep.lock():
        freeze(plan, sweep, False)


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer()


def kinds(plan_cells: list) -> dict[str, int]:
    found: dict[str, int] = {}
    for pc in plan_cells:
        found[pc.cell.kind] = found.get(pc.cell.kind, 0) + 1
    return found


def test_full_matrix_has_36_train_6_sa_rl_24_base_6_transfer(composer: Composer) -> None:
    # 3 workflows x 2 tasks x 3 scales x 2 policies = 36; 2 tasks x 3 scales = 6 sa_rl;
    # (single + 3 workflows) x 2 tasks x 3 scales = 24 base; 3 workflows x 2 tasks at 1.7B
    # only (the sweep's restrict, as the paper's Table 3) = 6 transfer.
    plan = make_plan(load_spec("full_matrix", [], composer), composer)
    assert kinds(plan.cells) == {"train": 36, "sa_rl": 6, "base": 24, "transfer": 6}
    assert len({pc.id for pc in plan.cells}) == 72
    assert {pc.cell.scale for pc in plan.cells if pc.cell.kind == "transfer"} == {"1.7b"}


def test_seeds_multiply_every_kind_but_base(composer: Composer) -> None:
    plan = make_plan(load_spec("full_matrix", ["seed=0,1,2"], composer), composer)
    assert kinds(plan.cells) == {"train": 108, "sa_rl": 18, "base": 24, "transfer": 18}
    plan = make_plan(load_spec("full_matrix", ["seed=range(0,16)", "scale=1.7b", "kind=train,base"], composer), composer)
    assert kinds(plan.cells) == {"train": 3 * 2 * 2 * 16, "base": 4 * 2}


def test_smoke_is_eleven_toy_cells(composer: Composer) -> None:
    plan = make_plan(load_spec("smoke", [], composer), composer)
    assert kinds(plan.cells) == {"train": 6, "sa_rl": 1, "base": 4}
    assert {pc.config.model.name_or_path for pc in plan.cells} == {"toy"}
    assert {pc.config.task.name for pc in plan.cells} == {"arith"}


def test_shuffled_controls_twin_every_train_and_sa_rl_cell(composer: Composer) -> None:
    plan = make_plan(load_spec("smoke", ["kind=train,sa_rl,shuffled", "seed=0,1"], composer), composer)
    # 3 workflows x 2 policies + SA-RL = 7 twins per seed.
    assert kinds(plan.cells) == {"train": 12, "sa_rl": 2, "shuffled": 14}
    by_id = {pc.id: pc for pc in plan.cells}
    twins = {pc.id: "shuffled-" + pc.id for pc in plan.cells if pc.cell.kind in ("train", "sa_rl")}
    assert set(twins.values()) == {pc.id for pc in plan.cells if pc.cell.kind == "shuffled"}
    for twin_id, control_id in twins.items():
        twin, control = by_id[twin_id].config.to_dict(), by_id[control_id].config.to_dict()
        # Trained alike: only the cell node differs (its id and kind).
        assert {k: v for k, v in twin.items() if k != "cell"} == {k: v for k, v in control.items() if k != "cell"}
        assert control["cell"] == {"id": control_id, "kind": "shuffled", "seed": twin["cell"]["seed"]}
        assert by_id[control_id].config.shuffles_rewards and not by_id[twin_id].config.shuffles_rewards
    sa_rl_only = make_plan(load_spec("smoke", ["kind=shuffled", "restrict.shuffled.workflow=single"], composer), composer)
    assert [pc.id for pc in sa_rl_only.cells] == ["shuffled-sa_rl-toy-arith-s0"]


def test_ids_follow_the_papers_naming(composer: Composer) -> None:
    plan = make_plan(load_spec("full_matrix", ["seed=0,1"], composer), composer)
    ids = {pc.id for pc in plan.cells}
    for expected in (
        "voting-ip-1.7b-math-s0",
        "eval_opt-sp-0.6b-code-s1",
        "orch_workers-ip-4b-code-s1",
        "sa_rl-1.7b-math-s0",
        "base-voting-1.7b-math",
        "base-single-4b-code",
    ):
        assert expected in ids
    smoke = make_plan(load_spec("smoke", [], composer), composer)
    assert "base-single-toy-arith" in {pc.id for pc in smoke.cells}


def test_ids_and_fingerprints_are_stable_across_runs(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=full_matrix", "scale=0.6b").code == 0
    first = json.loads((results / "full_matrix" / "sweep.json").read_text())["cells"]
    # A fresh process would compose from scratch: so does a fresh Composer here.
    other = results.parent / "again"
    assert gridrun("plan", "conf=full_matrix", "scale=0.6b", "--results-dir", str(other)).code == 0
    second = json.loads((other / "full_matrix" / "sweep.json").read_text())["cells"]
    assert [(c["id"], c["fingerprint"]) for c in first] == [(c["id"], c["fingerprint"]) for c in second]
    # Planning again in place changes nothing.
    again = gridrun("plan", "conf=full_matrix", "scale=0.6b")
    assert again.code == 0 and "0 new, 22 unchanged" in again.out


def test_a_cells_resolved_config_matches_the_golden_file(
    gridrun: Gridrun, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole config.yaml of one paper cell, every value the trainer reads: a change to conf/
    # or to the composer that moves any of them shows here as a diff.
    monkeypatch.delenv("GRIDRUN_DATA", raising=False)
    freeze_full_matrix(results, "scale=1.7b", "task=math", "workflow=voting", "policy=isolated", "seed=0", "kind=train")
    text = (results / "full_matrix" / "cells" / "voting-ip-1.7b-math-s0" / "config.yaml").read_text()
    text = text.replace(str(REPO_ROOT), "<REPO>")  # this checkout's path
    golden = GOLDEN / "config_voting-ip-1.7b-math-s0.yaml"
    if os.environ.get("GRIDRUN_REGEN_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"resolved config changed; if on purpose: GRIDRUN_REGEN_GOLDEN=1 pytest {__file__}"


def test_config_yaml_is_the_trainers_schema_fully_resolved(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRIDRUN_DATA", raising=False)
    freeze_full_matrix(results, "scale=1.7b", "task=math", "kind=train")
    cell = results / "full_matrix" / "cells" / "voting-ip-1.7b-math-s0"
    config = load_config(cell / "config.yaml")
    written = yaml.safe_load((cell / "config.yaml").read_text())
    # Every node but `reward`, written only where it differs from the paper's broadcast
    # (runconfig.OMITTED_AT_DEFAULT: keys added after the paper's cells were fingerprinted).
    assert list(written) == [f.name for f in dataclasses.fields(RunConfig) if f.name != "reward"]
    assert "${" not in (cell / "config.yaml").read_text()
    # The paper's settings, by hand from DESIGN.md.
    assert config.model.name_or_path == "Qwen/Qwen3-1.7B" and config.model.dtype == "bfloat16"
    assert (config.lengths.max_prompt_tokens, config.lengths.max_response_tokens) == (20480, 5120)
    assert config.train.micro_token_budget == 40960  # 1.7B on H100
    assert config.policy.name == "isolated" and config.lora.rank == 64 and config.lora.alpha == 32
    assert (config.grpo.n, config.grpo.clip_low, config.grpo.clip_high) == (8, 0.2, 0.28)
    assert (config.optim.lr, config.optim.warmup_steps, config.train.total_steps) == (2e-5, 15, 500)
    assert config.task.data_path == str(REPO_ROOT / "data" / "math")
    record = json.loads((cell / "cell.json").read_text())
    assert record["coords"] == {"workflow": "voting", "task": "math", "scale": "1.7b", "policy": "isolated", "seed": 0}
    assert record["resources"]["gpus"] == 2 and record["resources"]["gpu_class"] == "h100"
    assert {"commit", "dirty"} <= set(record["git"]) and "torch" in record["versions"]
    assert json.loads((cell / "state.json").read_text())["state"] == "planned"


@pytest.mark.parametrize(
    ("workflow", "task", "prompt", "response", "revisions"),
    [
        ("single", "math", 15360, 5120, None),
        ("single", "code", 4096, 2048, None),
        ("eval_opt", "math", 30720, 5120, 3),
        ("eval_opt", "code", 10240, 2048, 2),
        ("voting", "code", 10240, 2048, None),
        ("orch_workers", "math", 20480, 5120, None),
    ],
)
def test_lengths_and_rounds_per_workflow_and_task(
    composer: Composer, workflow: str, task: str, prompt: int, response: int, revisions: int | None
) -> None:
    tree_ = composer.compose([f"workflow={workflow}", f"task={task}", "scale=0.6b"])
    assert (tree_["lengths"]["max_prompt_tokens"], tree_["lengths"]["max_response_tokens"]) == (prompt, response)
    if revisions is not None:
        assert tree_["workflow"]["rounds"] == revisions


@pytest.mark.parametrize(
    ("scale", "gpu", "budget"),
    [("0.6b", None, 28672), ("0.6b", "h100", 51712), ("1.7b", "l40s", 23554), ("1.7b", None, 40960),
     ("4b", "l40s", 10240), ("4b", None, 40960), ("0.6b", "cpu", 40960), ("1.7b", "cpu", 40960), ("4b", "cpu", 40960)],
)
def test_micro_batch_budget_per_scale_and_gpu_class(composer: Composer, scale: str, gpu: str | None, budget: int) -> None:
    # Defaults: 0.6B on L40s, 1.7B and 4B on H100 (no gpu= given).
    overrides = ["task=math", f"scale={scale}"] + ([f"gpu={gpu}"] if gpu else [])
    assert composer.compose(overrides)["train"]["micro_token_budget"] == budget


def test_the_run_nodes_of_config_yaml_and_the_default_preset_repeat_the_schemas_defaults() -> None:
    # The schema's defaults open the composition (`run_schema`): a run value conf/config.yaml
    # writes, or the default preset (released), must be that default, so the two never
    # disagree (an interpolated value, e.g. a table row, is conf's own).
    defaults = config_from_dict({"cell": {"id": "x", "kind": "base"}}).to_dict()
    differ = []

    def walk(node: dict, schema: dict, path: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, schema[key], f"{path}{key}.")
            elif not (isinstance(value, str) and "${" in value) and value != schema[key]:
                differ.append(f"{path}{key}: {value!r} != {schema[key]!r}")

    config = yaml.safe_load((PACKAGE_DIR / "conf" / "config.yaml").read_text())
    walk({k: v for k, v in config.items() if k not in ("defaults", "grid", "cell")}, defaults, "")
    released = yaml.safe_load((PACKAGE_DIR / "conf" / "preset" / "released.yaml").read_text())
    assert released == {"preset": "released"}  # every released value is the schema's
    walk(released, defaults, "")
    assert differ == []


@pytest.mark.parametrize("group", ["workflow", "task", "engine"])
def test_each_option_file_holds_only_what_differs_from_its_params_defaults(group: str) -> None:
    # Each option's params dataclass is its node's schema (conf/config.yaml's schema/<group>
    # entries): an option file that wrote a key at its default would be a second copy of it,
    # free to drift. What they do write is conf's own: an interpolated table row or data path.
    for path in sorted((PACKAGE_DIR / "conf" / group).glob("*.yaml")):
        node = yaml.safe_load(path.read_text()) or {}
        fields = {f.name: f for f in dataclasses.fields(registry.params_class(group, {"name": path.stem}))}
        for key, value in node.items():
            assert key in fields, f"{path.name}: {key} is not a setting of {group} {path.stem}"
            assert isinstance(value, str) and "${" in value, f"{path.name}: {key}={value!r} repeats its default"


@pytest.mark.parametrize(
    ("choice", "node"),
    [
        # Every key of the option's params at the dataclass's default; none of another option's.
        ("workflow=voting", {"name": "voting", "plugin": None, "n_voters": 3}),
        ("workflow=single", {"name": "single", "plugin": None}),
        # gpu_memory_utilization null: the plan sizes it per GPU class (the memory model).
        ("engine=vllm", {"name": "vllm", "plugin": None, "enable_prefix_caching": True,
                         "gpu_memory_utilization": None, "enable_sleep_mode": True}),
        ("task=arith", {"name": "arith", "plugin": None, "n_train": 5000, "n_val": 300, "grader": "released",
                        "format_penalty": 0.0}),
    ],
)
def test_an_option_node_is_its_params_dataclass_at_its_defaults(composer: Composer, choice: str, node: dict) -> None:
    group = choice.split("=")[0]
    assert composer.compose([choice, "scale=toy"])[group] == node
    # Its keys are set without Hydra's `+`, and only its own exist.
    key = next(k for k in node if k not in ("name", "plugin")) if len(node) > 2 else None
    if key:
        value = node[key] if isinstance(node[key], bool) else 2 * node[key]
        assert composer.compose([choice, "scale=toy", f"{group}.{key}={value}"])[group][key] == value
    with pytest.raises(GridError, match=f"unknown config key '{group}.n_voter'"):
        composer.compose([choice, "scale=toy", f"{group}.n_voter=5"])


def test_the_fingerprint_hashes_every_setting_with_its_default_filled_in(composer: Composer) -> None:
    # A cell whose conf leaves n_voters out fingerprints like one that writes the default (3)
    # and unlike one that writes 5: the hash is of the fully resolved config, so a changed
    # dataclass default changes every fingerprint that relies on it.
    composed = run_part(composer.compose(["workflow=voting", "task=arith", "scale=toy"]))
    cell = {"id": "voting-sp-toy-arith-s0", "kind": "train", "seed": 0}
    with_default, without, other = (
        config_from_dict({**composed, "cell": cell, "workflow": workflow})
        for workflow in ({"name": "voting", "n_voters": 3}, {"name": "voting"}, {"name": "voting", "n_voters": 5})
    )
    assert "n_voters" in yaml.safe_load(dump_config(without))["workflow"]
    assert fingerprint(without) == fingerprint(with_default) != fingerprint(other)


def test_a_setting_of_one_workflows_own_key_reaches_that_workflows_cells_only(composer: Composer) -> None:
    # smoke plans all three workflows and single: n_voters exists on voting only, rounds on
    # eval_opt only (4 instead of workflow_task/'s 2); every other cell is as without them.
    plain = {pc.id: pc for pc in make_plan(load_spec("smoke", [], composer), composer).cells}
    plan = make_plan(load_spec("smoke", ["workflow.n_voters=5", "workflow.rounds=4"], composer), composer)
    changed = {pc.id for pc in plan.cells if pc.fingerprint != plain[pc.id].fingerprint}
    assert changed == {"voting-ip-toy-arith-s0", "voting-sp-toy-arith-s0", "base-voting-toy-arith",
                       "eval_opt-ip-toy-arith-s0", "eval_opt-sp-toy-arith-s0", "base-eval_opt-toy-arith"}
    by_id = {pc.id: pc.config for pc in plan.cells}
    assert (by_id["voting-ip-toy-arith-s0"].workflow.n_voters, by_id["eval_opt-sp-toy-arith-s0"].workflow.rounds) == (5, 4)


def run_part(tree_: dict) -> dict:
    return {key: value for key, value in tree_.items() if key != "grid"}


def test_settings_reach_every_cell_and_change_the_fingerprint(composer: Composer) -> None:
    base = make_plan(load_spec("smoke", [], composer), composer)
    short = make_plan(load_spec("smoke", ["train.total_steps=2"], composer), composer)
    assert {pc.config.train.total_steps for pc in short.cells} == {2}
    assert all(a.fingerprint != b.fingerprint for a, b in zip(base.cells, short.cells))
    assert [a.id for a in base.cells] == [b.id for b in short.cells]


def test_config_drift_is_refused_naming_the_keys(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    before = tree(results)
    sweep_json = (results / "smoke" / "sweep.json").read_text()
    refused = gridrun("plan", "conf=smoke", "train.total_steps=7", "optim.lr=2e-3")
    assert refused.code == 2
    assert "train.total_steps: 20 -> 7" in refused.err and "optim.lr: 0.001 -> 0.002" in refused.err
    assert "--replace" in refused.err and "Traceback" not in refused.err
    assert tree(results) == before and (results / "smoke" / "sweep.json").read_text() == sweep_json
    # --replace moves the old runs aside and plans the new config.
    replaced = gridrun("plan", "conf=smoke", "train.total_steps=7", "optim.lr=2e-3", "--replace")
    assert replaced.code == 0 and "11 replaced" in replaced.out
    assert len(list((results / "smoke" / "replaced").iterdir())) == 11
    assert load_config(results / "smoke" / "cells" / "sa_rl-toy-arith-s0" / "config.yaml").train.total_steps == 7


def test_dry_run_prints_the_plan_and_writes_nothing(gridrun: Gridrun, results: Path) -> None:
    result = gridrun("sweep", "conf=full_matrix", "--dry-run")
    assert result.code == 0
    assert "72 cells (36 train, 6 sa_rl, 24 base, 6 transfer)" in result.out and "GPU-hours" in result.out
    assert "voting-ip-1.7b-math-s0" in result.out and "2x h100" in result.out
    assert not results.exists()
    # Each trained cell's predicted s/step (and disk) beside its memory; the sweep's node-days
    # against the paper's, and which rates are measured.
    composer = Composer()
    cells = {pc.id: pc for pc in make_plan(load_spec("full_matrix", [], composer), composer).cells}
    voting = cells["voting-ip-1.7b-math-s0"]
    row = next(line.split("│") for line in result.out.splitlines() if "voting-ip-1.7b-math-s0" in line)
    assert [c.strip() for c in row[9:12]] == [f"{voting.disk.results / 1e9:.1f}", f"{voting.est_step_s:,.0f}", "m"]
    days = sum(pc.est_hours for pc in cells.values()) / 24
    out = " ".join(result.out.split())
    assert f"~{days:,.1f} node-days" in out and "the paper: ~235 node-days, ~967 s/step" in out
    assert "[m] 1.7b/h100, 4b/h100: measured: bench/measured/gpu-h100-2026-11-22.jsonl" in out
    assert "[~] 0.6b/l40s: modelled: " in out and "rollouts everywhere: modelled" in out
    # The paper's one seed per cell can test nothing over seeds; with the assumed SD of 1.1
    # points, (1.96 + 0.84) x 1.1 x sqrt(2) = 4.4 points, and a 3-point residual needs 4 seeds
    # (Student t with 6 degrees of freedom: (2.447 + 0.906) x 1.1 x sqrt(2/4) = 2.6).
    assert "detectable: nothing over seeds with 1 seed per cell" in out and "differences of 4.4+ points" in out
    assert "a 3-point difference: 1 seed(s) per cell cannot show it; 4 seeds per cell can" in out
    three = " ".join(gridrun("sweep", "conf=full_matrix", "seed=range(0,3)", "--dry-run").out.split())
    assert "differences of 3.3+ points with 3 seeds per cell" in three and "4 seeds per cell can" in three


@pytest.mark.parametrize("analysis, why", [
    ({"target_pp": 3.0}, "'analysis' must hold seed_sd_pp"),
    ({"seed_sd_pp": 0}, "analysis.seed_sd_pp must be a number of accuracy points > 0"),
    ({"seed_sd_pp": 2.0, "target_pp": "three"}, "analysis.target_pp must be a number"),
    ({"seed_sd_pp": 2.0, "power": 0.9}, "'analysis' must hold seed_sd_pp (and may hold target_pp)"),
])
def test_a_bad_analysis_section_is_named(analysis: dict, why: str) -> None:
    from gridrun.grid.spec import AnalysisPlan

    with pytest.raises(GridError, match=re.escape(why)):
        AnalysisPlan.parse(analysis, "sweeps/x.yaml")
    assert AnalysisPlan.parse({"seed_sd_pp": 2, "target_pp": 3}, "x").to_dict() == {"seed_sd_pp": 2.0, "target_pp": 3.0}


def test_the_dry_run_takes_the_last_canarys_step_for_its_shape(gridrun: Gridrun, results: Path) -> None:
    from gridrun.grid.cost import write_measured_step

    composer = Composer()
    (cell,) = make_plan(load_spec("canary", [], composer), composer).cells
    write_measured_step(results / "canary" / "measured-step.json", cell.config, "h100", 40.0, cell.id)
    result = gridrun("plan", "conf=canary", "--dry-run")
    assert result.code == 0
    row = next(line.split("│") for line in result.out.splitlines() if cell.id in line)
    # The canary's own shape: its measured 40 s, marked c, instead of the model's prediction.
    assert [c.strip() for c in row[10:12]] == ["40", "c"] and round(cell.est_step_s) != 40
    assert f"[c] 1.7b/h100: canary: {results / 'canary' / 'measured-step.json'} ({cell.id})" in " ".join(
        result.out.split())


def test_the_hint_after_a_plan_repeats_its_overrides_and_following_it_plans_the_same_cells(
    gridrun: Gridrun, tmp_path: Path, recording_launcher: None
) -> None:
    results = tmp_path / "my results"
    planned = gridrun("plan", "conf=smoke", "kind=train", "workflow=voting", "seed=range(0,2)", "train.total_steps=3",
                      "grid.launcher.name=record", "--results-dir", str(results))
    assert planned.code == 0, planned.err
    hint = next(line for line in planned.out.splitlines() if line.startswith("run them with: "))
    assert hint == ("run them with: gridrun sweep conf=smoke kind=train workflow=voting 'seed=range(0,2)' "
                    f"train.total_steps=3 grid.launcher.name=record --results-dir '{results}'")
    # Pasted into a shell: the same 4 cells (2 policies x 2 seeds), none changed, all queued.
    followed = gridrun(*shlex.split(hint.removeprefix("run them with: "))[1:])
    assert followed.code == 0, followed.err
    assert "planned 4 cells of 'smoke'" in followed.out and "0 new, 4 unchanged, 0 replaced" in followed.out
    assert "dispatching 4 cells with launcher=record" in followed.out


def test_replanning_adds_new_seeds_to_the_sweep(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    more = gridrun("plan", "conf=smoke", "seed=0,1", "kind=train")
    assert more.code == 0 and "6 new, 6 unchanged" in more.out
    cells = json.loads((results / "smoke" / "sweep.json").read_text())["cells"]
    assert len(cells) == 11 + 6 and cells[-1]["id"] == "orch_workers-sp-toy-arith-s1"


def test_show_prints_a_cells_config_and_state(gridrun: Gridrun, results: Path, tmp_path: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    shown = gridrun("show", "voting-ip-toy-arith-s0")
    assert shown.code == 0
    assert "name_or_path: toy" in shown.out and "fingerprint" in shown.out and "planned" in shown.out
    by_dir = gridrun("show", str(results / "smoke" / "cells" / "base-single-toy-arith"))
    assert by_dir.code == 0 and "kind: base" in by_dir.out
    # The same id in two sweeps: say which.
    copy = tmp_path / "smoke_copy.yaml"
    copy.write_text((PACKAGE_DIR / "sweeps" / "smoke.yaml").read_text())
    assert gridrun("plan", f"conf={copy}").code == 0
    ambiguous = gridrun("show", "voting-ip-toy-arith-s0")
    assert ambiguous.code == 2 and "add conf=smoke or conf=smoke_copy" in ambiguous.err
    assert gridrun("show", "voting-ip-toy-arith-s0", "conf=smoke_copy").code == 0


def test_every_conf_key_and_defaults_entry_has_a_comment_above_it() -> None:
    # STYLE: each YAML key is documented where it is set, on the line above. A table's rows
    # (conf/tables.yaml, below its top-level keys) are documented by the table's comment.
    key = re.compile(r"^\s*(- )?[\w./@ -]+:")
    missing = []
    for path in sorted((PACKAGE_DIR / "conf").rglob("*.yaml")) + sorted((PACKAGE_DIR / "sweeps").glob("*.yaml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            documented = i > 0 and lines[i - 1].lstrip().startswith("#")
            documented |= path.name == "tables.yaml" and line.startswith(" ")
            if key.match(line) and not line.lstrip().startswith("#") and not documented:
                missing.append(f"{path.relative_to(REPO_ROOT)}:{i + 1}: {line.strip()}")
    assert missing == []


def test_the_dry_run_offers_the_detector_at_the_studys_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gridrun.grid import cost
    from gridrun.grid.plan import detector_lines

    composer = Composer()
    plan = make_plan(load_spec("full_matrix", [], composer), composer)
    measured = tmp_path / "detector_savings.json"
    measured.write_text(json.dumps({"steps_saved": 120, "steps": 1000, "cells": 40, "stopped": 9, "peaks_kept": 8,
                                    "source": "bench/measured/x.md"}))
    monkeypatch.setattr(cost, "SHIPPED_DETECTOR_SAVINGS", measured)
    (line,) = detector_lines(plan)
    # 12% of the trained cells' node-days (base cells train nothing and save nothing).
    days = cost.node_days(pc.est_hours for pc in plan.cells if pc.total_steps())
    assert line.startswith("option train.fall_alert=true train.on_alert=stop: the collapse study's stops saved 12.0%")
    assert "9 of 40 toy cells stopped, peak kept in 8; bench/measured/x.md" in line
    assert f"~{0.12 * days:,.1f} of the trained cells' ~{days:,.1f} node-days" in line
    monkeypatch.setattr(cost, "SHIPPED_DETECTOR_SAVINGS", tmp_path / "absent.json")
    assert detector_lines(plan) == []
