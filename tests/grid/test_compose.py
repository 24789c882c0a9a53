"""Composition: Hydra's own result, what is cached between cells, and errors that name the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

import gridrun.grid.compose as compose_module
from gridrun.grid import REPO_ROOT
from gridrun.grid.cells import expand
from gridrun.grid.compose import CONF_DIR, Composer
from gridrun.grid.errors import GridError
from gridrun.grid.spec import load_spec


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer()


@pytest.mark.parametrize(
    "overrides",
    [
        ["workflow=voting", "task=math", "scale=1.7b", "policy=isolated"],
        ["workflow=eval_opt", "task=code", "scale=0.6b", "gpu=h100", "train.total_steps=3", "optim.lr=0.001"],
        ["scale=toy", "workflow=orch_workers", "+grpo.kl_beta.generator=0.1", "engine=hf"],
        ["workflow=single", "task=math", "scale=4b", "gpu=l40s", "cluster=paper"],
        ["task=math", "scale=1.7b", "task.data_path=${grid.data_root}/elsewhere", "train.val_every=${train.save_every}"],
        ["task=code", "scale=4b", "grid.data_root=/shared/data", "logging.wandb_mode=disabled"],
        # The launcher's settings from its dataclass (placed by its file's defaults list), one set.
        ["launcher=slurm", "cluster=testcluster", "grid.launcher.max_attempts=2"],
        # A mapping merged into a node, a forced add, a deletion, an added key then set.
        ["+grpo.kl_beta={generator:0.1}", "++train.val_every=4", "~logging.wandb_project", "+train.new=1", "train.new=2"],
    ],
)
@pytest.mark.parametrize("env_data", [None, "relative/data"])
def test_composition_equals_hydra_compose(
    composer: Composer, monkeypatch: pytest.MonkeyPatch, overrides: list[str], env_data: str | None
) -> None:
    # The composer runs Hydra's steps with caches in between: it must give exactly
    # hydra.compose's tree (grid.data_root aside, made absolute).
    if env_data:
        monkeypatch.setenv("GRIDRUN_DATA", env_data)
    else:
        monkeypatch.delenv("GRIDRUN_DATA", raising=False)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        reference = compose("config", overrides=overrides)
    with open_dict(reference):
        root = Path(str(reference.grid.data_root))
        reference.grid.data_root = str(root if root.is_absolute() else REPO_ROOT / root)
    expected = OmegaConf.to_container(reference, resolve=True)
    assert composer.compose(overrides) == expected
    # ... and composing others in between leaves no trace in the caches.
    composer.compose(["scale=toy", "+grpo.kl_beta.evaluator=0.5", "lora.rank=2", "~train.val_samples"])
    assert composer.compose(overrides) == expected


@pytest.mark.slow  # 23 s on two busy cores (load 8): 48 calls of hydra.compose
def test_every_group_combination_of_full_matrix_composes_as_hydra_compose(composer: Composer) -> None:
    # The composer calls hydra._internal (hence hydra-core<1.4 in pyproject.toml): on every
    # choice of groups the full matrix plans (48: train, sa_rl, base and transfer cells, each
    # scale with its own default GPU class and engine), its tree is hydra.compose's, so a
    # Hydra release that changes those internals fails here (CI runs the slow tests), not in
    # a user's plan. The fast suite compares the mixed cases above.
    spec = load_spec("full_matrix", [], composer)
    combinations = list(dict.fromkeys(tuple(cell.group_choices()) for cell in expand(spec.axes, spec.restrict)))
    assert len(combinations) == 48
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for choices in combinations:
            ours, reference = composer.compose(list(choices)), compose("config", overrides=list(choices))
            with open_dict(reference):
                reference.grid.data_root = ours["grid"]["data_root"]  # made absolute (checked above)
            assert ours == OmegaConf.to_container(reference, resolve=True), choices


def test_the_toy_recipe_is_the_schemas_and_only_on_the_toy_scale(composer: Composer) -> None:
    # conf/scale/toy.yaml places the run schema's ToySpec at model.toy: its defaults, typed
    # like the schema, overridable like any key; a real scale has no model.toy.
    assert composer.compose(["scale=toy"])["model"]["toy"] == {"seed": 0, "target_accuracy": 0.3, "max_warm_steps": 600}
    assert composer.compose(["scale=toy", "model.toy.seed=1"])["model"]["toy"]["seed"] == 1
    with pytest.raises(GridError, match="model.toy.seed=x.*could not be converted to Integer"):
        composer.compose(["scale=toy", "model.toy.seed=x"])
    for scale in ("0.6b", "1.7b", "4b"):
        assert "toy" not in composer.compose([f"scale={scale}", "task=math"])["model"]


def test_cells_share_each_parsed_file_and_defaults_list(monkeypatch: pytest.MonkeyPatch) -> None:
    composer = Composer()
    parsed: list[str] = []
    parse_file = composer._repo.delegate.load_config
    monkeypatch.setattr(composer._repo.delegate, "load_config", lambda config_path: parsed.append(config_path)
                        or parse_file(config_path))
    listed: list[Any] = []
    make_list = compose_module.create_defaults_list
    monkeypatch.setattr(compose_module, "create_defaults_list", lambda **kw: listed.append(kw) or make_list(**kw))

    cell = ["workflow=voting", "task=math", "scale=1.7b"]
    first = composer.compose([*cell, "train.total_steps=3"])
    assert len(listed) == 1 and "scale/1.7b" in parsed and "tables" in parsed
    # The same group choices with another setting: no file parsed again, no new defaults list.
    before = len(parsed)
    second = composer.compose([*cell, "train.total_steps=4"])
    assert (len(listed), len(parsed)) == (1, before)
    assert (first["train"]["total_steps"], second["train"]["total_steps"]) == (3, 4)
    # Another policy: one new defaults list, and the one file it adds (policy/isolated).
    composer.compose([*cell, "policy=isolated"])
    assert len(listed) == 2 and parsed[before:] == ["policy/isolated"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # A pair without a row in conf/tables.yaml: named by the choices, gpu=h100 given...
        (["scale=toy", "gpu=h100"], ("scale=toy does not run on gpu=h100 (no row in conf/tables.yaml's scale_gpu): "
         "pick another gpu=...; valid scale-gpu pairs: toy-cpu, 0.6b-cpu, 0.6b-l40s, 0.6b-h100, 1.7b-cpu, "
         "1.7b-l40s, 1.7b-h100, 4b-cpu, 4b-l40s, 4b-h100")),
        # ... or gpu=l40s, given on the command line, over scale=toy's own default (cpu).
        (["scale=toy", "gpu=l40s"], "scale=toy does not run on gpu=l40s (no row in conf/tables.yaml's scale_gpu)"),
        (["+train.total_steps=3"], "'train.total_steps' exists already: drop the '+' and write train.total_steps=..."),
        (["train.totl_steps=3"], ("unknown config key 'train.totl_steps' (did you mean 'train.total_steps'?); "
         "to add a new entry under 'train' write +train.totl_steps=...")),
        # No parent to add under, and no '+' hint for a deletion.
        (["trian.total_steps=3"], "unknown config key 'trian.total_steps' (did you mean 'train.total_steps'?)"),
        (["~train.val_evry"], "unknown config key 'train.val_evry' (did you mean 'train.val_every'?)"),
        # A setting checked against the keys an earlier one added.
        (["+train.extra=1", "+train.extra=2"], "'train.extra' exists already"),
        (["train.val_every=${train.nope}"], "cannot resolve 'train.val_every': Interpolation key 'train.nope' not found"),
        (["trian@x=1"], "unknown config group 'trian'"),
        (["workflow=votng"], "unknown workflow 'votng' (did you mean 'voting'?); options live in conf/workflow/"),
        (["train.total_steps=[1"], "cannot parse override 'train.total_steps=[1'"),
    ],
)
def test_bad_overrides_name_the_fix(composer: Composer, overrides: list[str], message: str) -> None:
    with pytest.raises(GridError) as raised:
        composer.compose(overrides)
    text = str(raised.value)
    assert message in text and "\n" not in text, text
    if message.startswith("unknown config key"):
        assert text == message
