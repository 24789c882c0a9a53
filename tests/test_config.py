from __future__ import annotations

from pathlib import Path

import pytest

from gridrun.seam.runconfig import ConfigError, config_from_dict, dump_config, load_config


def minimal(**overrides: dict) -> dict:
    data = {"cell": {"id": "voting-ip-toy-arith-s0", "kind": "train", "seed": 0}, "workflow": {"name": "voting"}}
    data.update(overrides)
    return data


def test_round_trip_through_yaml(tmp_path: Path) -> None:
    config = config_from_dict(minimal(train={"total_steps": 3}))
    (tmp_path / "config.yaml").write_text(dump_config(config))
    again = load_config(tmp_path / "config.yaml")
    assert again == config
    assert again.train.total_steps == 3 and again.grpo.clip_high == 0.28


def test_unknown_key_names_the_closest_valid_one() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'train.totl_steps' .*'train.total_steps'"):
        config_from_dict(minimal(train={"totl_steps": 3}))


def test_wrong_types_and_values_are_rejected() -> None:
    with pytest.raises(ConfigError, match="train.total_steps: expected an integer"):
        config_from_dict(minimal(train={"total_steps": "ten"}))
    with pytest.raises(ConfigError, match=r"unknown workflow 'votng' \(did you mean 'voting'\?\)"):
        config_from_dict(minimal(workflow={"name": "votng"}))
    with pytest.raises(ConfigError, match="grpo.kl_beta.generator: expected a number"):
        config_from_dict(minimal(grpo={"kl_beta": {"generator": "high"}}))


def test_cross_field_checks_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="set workflow.name=single"):
        config_from_dict(minimal(cell={"id": "x", "kind": "sa_rl"}))
    with pytest.raises(ConfigError, match="gridrun data prepare math"):
        config_from_dict(minimal(task={"name": "math"}))


def test_missing_or_corrupt_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "config.yaml")
    (tmp_path / "config.yaml").write_text("cell: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "config.yaml")


def test_kl_beta_keys_must_be_roles_of_the_workflow() -> None:
    # A misspelt role would silently train without its KL term.
    with pytest.raises(ConfigError, match=r"grpo.kl_beta: 'agregator' is not a role of voting \(did you mean 'aggregator'\?\)"):
        config_from_dict(minimal(grpo={"kl_beta": {"agregator": 0.01}}))
    with pytest.raises(ConfigError, match="roles of voting: generator, aggregator"):
        config_from_dict(minimal(grpo={"kl_beta": {"worker": 0.01}}))
    assert config_from_dict(minimal(grpo={"kl_beta": {"aggregator": 0.01}})).grpo.kl_beta == {"aggregator": 0.01}


def test_eval_opt_rounds_and_dual_clip_bounds() -> None:
    with pytest.raises(ConfigError, match="workflow.rounds must be >= 1"):
        config_from_dict(minimal(workflow={"name": "eval_opt", "rounds": 0}))
    with pytest.raises(ConfigError, match="grpo.clip_ratio_c must be > 1"):
        config_from_dict(minimal(grpo={"clip_ratio_c": 1.0}))


def test_only_training_cells_have_steps_to_train() -> None:
    # train.total_steps=20 in both: the base cell evaluates its step 0 and trains none.
    train = config_from_dict(minimal(train={"total_steps": 20}))
    base = config_from_dict(minimal(cell={"id": "base-voting-toy-arith", "kind": "base"}, train={"total_steps": 20}))
    assert (train.steps_to_train, base.steps_to_train) == (20, 0)


def test_the_toy_recipe_comes_with_the_toy_model_and_only_with_it(tmp_path: Path) -> None:
    # model.toy keys the toy world's build cache: a real model has no use for it, and a toy
    # model without it would build whatever the schema's defaults say at run time.
    with pytest.raises(ConfigError, match="model.name_or_path=toy needs the toy world's recipe under model.toy.*scale=toy"):
        config_from_dict(minimal(model={"name_or_path": "toy"}))
    with pytest.raises(ConfigError, match="model.toy is the toy world's recipe, but model.name_or_path is 'Qwen/Qwen3-1.7B'"):
        config_from_dict(minimal(model={"name_or_path": "Qwen/Qwen3-1.7B", "toy": {"seed": 0}}))
    # A model node names its model: no default that would quietly be the toy world.
    with pytest.raises(ConfigError, match="missing config key 'model.name_or_path'"):
        config_from_dict(minimal(model={"dtype": "float32"}))
    # The recipe's values are the schema's defaults (seed 0, 30% target, 600 steps at most).
    toy = config_from_dict(minimal(model={"name_or_path": "toy", "toy": {"seed": 2}}))
    assert toy.to_dict()["model"]["toy"] == {"seed": 2, "target_accuracy": 0.3, "max_warm_steps": 600}
    # A real model's config.yaml has no model.toy at all (not even `toy: null`), and reads back equal.
    real = config_from_dict(minimal(model={"name_or_path": "Qwen/Qwen3-1.7B"}))
    assert list(real.to_dict()["model"]) == ["name_or_path", "init", "dtype", "enable_thinking"]
    assert "toy:" not in dump_config(real)
    (tmp_path / "config.yaml").write_text(dump_config(real))
    assert load_config(tmp_path / "config.yaml") == real


def test_each_option_node_takes_only_its_options_keys() -> None:
    # The schema is no longer a union: a key of another workflow, task or engine is refused,
    # naming the chosen option's own keys (or the closest one).
    with pytest.raises(ConfigError, match=r"^workflow voting has no key 'rounds' \(its keys: n_voters\)$"):
        config_from_dict(minimal(workflow={"name": "voting", "rounds": 3}))
    with pytest.raises(ConfigError, match=r"^workflow voting has no key 'n_voter' \(did you mean 'n_voters'\?\)$"):
        config_from_dict(minimal(workflow={"name": "voting", "n_voter": 3}))
    with pytest.raises(ConfigError, match=r"^task arith has no key 'sandbox' \(its keys: n_train, n_val, grader, format_penalty\)$"):
        config_from_dict(minimal(task={"name": "arith", "sandbox": "none"}))
    with pytest.raises(ConfigError, match=r"^engine hf has no key 'gpu_memory_utilization' \(its keys: max_batch_size\)$"):
        config_from_dict(minimal(engine={"name": "hf", "gpu_memory_utilization": 0.9}))
    with pytest.raises(ConfigError, match=r"^unknown config key 'engine_temperature'"):
        config_from_dict(minimal(engine_temperature=0.5))


def test_options_keep_their_attribute_paths_and_defaults() -> None:
    config = config_from_dict(minimal(workflow={"name": "eval_opt", "rounds": 2}, task={"name": "code", "data_path": "/d"},
                                      engine={"name": "vllm"}))
    # The code reward's defaults are the released code's: all tests must pass, 3 s each, <= 120 s.
    assert (config.workflow.rounds, config.task.code_reward_mode, config.task.sandbox) == (2, "all_pass", "bwrap")
    assert (config.task.code_test_timeout_s, config.task.code_budget_cap_s) == (3.0, 120.0)
    # null: sized by the plan per GPU class (gridrun/memory.py engine_share), or at engine start.
    assert (config.engine.gpu_memory_utilization, config.parallel_slots) == (None, 1)
    # Sampling and LoRA are one block each, whichever engine and policy: the paper's values.
    assert (config.sampling.temperature, config.sampling.val_temperature) == (0.7, 0.7)
    assert (config.lora.rank, config.lora.alpha, config.lora.target_modules) == (64, 32, "all-linear")
    assert config_from_dict(minimal(workflow={"name": "voting", "n_voters": 5})).parallel_slots == 5


def test_alert_signals_name_alerts_and_are_left_out_of_config_yaml_at_their_default(tmp_path: Path) -> None:
    default = config_from_dict(minimal())
    assert default.train.alert_signals == ["gradient_amplification", "sp_role_capture", "signature_drift", "non_finite"]
    assert "alert_signals" not in default.to_dict()["train"]  # existing cells' fingerprints stay
    listed = config_from_dict(minimal(train={"alert_signals": ["non_finite", "entropy_collapse"]}))
    assert listed.to_dict()["train"]["alert_signals"] == ["non_finite", "entropy_collapse"]
    (tmp_path / "config.yaml").write_text(dump_config(listed))
    assert load_config(tmp_path / "config.yaml") == listed
    with pytest.raises(ConfigError, match=r"train.alert_signals: 'entropy' is not an alert; valid: gradient_amplification, "
                                          r".*, entropy_collapse, .*zero_variance$"):
        config_from_dict(minimal(train={"alert_signals": ["entropy"]}))
