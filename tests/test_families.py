"""Model families beside Qwen3: their published architectures counted to the parameter, and
each family difference (stop ids, template arguments, system prompt, consecutive turns,
context window, LoRA scope) handled where gridrun/arch/families.py says, refused at plan time
where a job would die on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from gridrun import arch
from gridrun.arch import families
from gridrun.grid import templates
from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError
from gridrun.grid.plan import make_plan
from gridrun.grid.spec import load_spec
from gridrun.seam.runconfig import ConfigError, ModelSpec

STRICT = Path(__file__).parent / "fixtures" / "strict_template"
FAMILY_MODELS = {
    "qwen3": "Qwen/Qwen3-1.7B", "qwen2.5": "Qwen/Qwen2.5-1.5B-Instruct", "llama3.2": "meta-llama/Llama-3.2-1B-Instruct",
    "gemma3": "google/gemma-3-1b-it", "phi4mini": "microsoft/Phi-4-mini-instruct",
    "smollm2": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
}
# A size a CPU builds in a blink; every family keeps its class, vocabulary and head width.
TINY = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2}
# Eval-Opt's revision call under the released full context: answer and critique in a row.
REVISION = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
            {"role": "assistant", "content": "C"}, {"role": "user", "content": "Revise."}]


@pytest.mark.parametrize(
    ("name", "billions"),
    # The model cards' sizes (Gemma 3 4B: its language model, the vision tower not counted).
    [("qwen2.5-0.5b-instruct", 0.494), ("qwen2.5-1.5b-instruct", 1.544), ("qwen2.5-3b-instruct", 3.086),
     ("llama-3.2-1b-instruct", 1.236), ("llama-3.2-3b-instruct", 3.213), ("gemma-3-1b-it", 1.000),
     ("gemma-3-4b-it", 3.880), ("phi-4-mini-instruct", 3.836), ("smollm2-1.7b-instruct", 1.711)],
)
def test_parameter_count_matches_the_built_model(name: str, billions: float) -> None:
    published = arch.published(name)
    assert all(url.startswith("https://huggingface.co/") for url in published["source"])
    config = AutoConfig.for_model(published["model_type"], **arch.config_kwargs(published))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert arch.parameter_count(published) == sum(p.numel() for p in model.parameters())
    assert round(arch.parameter_count(published) / 1e9, 3) == billions
    # head_dim: the config's where it has one, else derived as transformers derives it.
    assert arch.head_dim(published) == model.model.layers[0].self_attn.head_dim


@pytest.mark.parametrize("family", sorted(FAMILY_MODELS))
def test_lora_count_matches_peft_on_the_built_model(family: str, toy_world: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from gridrun.train.random_init import load_random

    hub = FAMILY_MODELS[family]
    model, _ = load_random(hub, torch.float32, torch.device("cpu"), toy_world, TINY)
    shaped = arch.shaped(hub, TINY)
    assert arch.parameter_count(shaped) == sum(p.numel() for p in model.parameters())
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert arch.lora_parameter_count(shaped, 8) == trainable


def test_phi_fused_projections_give_another_lora_size_at_the_same_rank() -> None:
    phi = arch.published("microsoft/Phi-4-mini-instruct")
    unfused = {**phi, "model_type": "llama"}
    assert arch.parameter_count(phi) == arch.parameter_count(unfused)
    # One A matrix for q, k and v (and for gate and up) instead of three (two): fewer LoRA weights.
    h, layers = phi["hidden_size"], phi["num_hidden_layers"]
    assert arch.lora_parameter_count(unfused, 1) - arch.lora_parameter_count(phi, 1) == layers * (2 * h + h)


def test_sliding_window_layers_hold_at_most_their_window() -> None:
    gemma = arch.published("google/gemma-3-1b-it")
    # 26 layers, every sixth global: 4 full, 22 sliding within 512 positions.
    assert sum(arch.sliding_layers(gemma)) == 22
    per_position = 2 * gemma["num_key_value_heads"] * 256 * 2
    assert arch.kv_bytes(gemma, 8192, 2) == (4 * 8192 + 22 * 512) * per_position
    assert arch.kv_bytes(gemma, 300, 2) == 26 * 300 * per_position
    qwen = arch.published("Qwen/Qwen3-1.7B")
    assert arch.kv_bytes(qwen, 1000, 2) == 28 * 1000 * 2 * 8 * 128 * 2


def test_stop_ids_are_the_tokenizers_and_the_generation_configs(toy_world: Path) -> None:
    from gridrun.train.engines.hf import stop_token_ids
    from gridrun.train.random_init import load_random

    model, tokenizer = load_random("google/gemma-3-1b-it", torch.float32, torch.device("cpu"), toy_world, TINY)
    # <eos> 1 (the tokenizer's and generation_config's) and <end_of_turn> 106 (generation_config's).
    assert tokenizer.eos_token_id == 1 and {1, 106} <= set(stop_token_ids(tokenizer, model))
    model, tokenizer = load_random("microsoft/Phi-4-mini-instruct", torch.float32, torch.device("cpu"), toy_world, TINY)
    assert set(stop_token_ids(tokenizer, model)) == {199999, 200020}
    assert families.stop_ids(None, [7, 3]) == [3, 7] and families.stop_ids(5, 5) == [5]


def test_enable_thinking_reaches_qwen3_only_and_llama_pins_its_date() -> None:
    assert families.template_kwargs("Qwen/Qwen3-1.7B", False, {}) == {"enable_thinking": False}
    assert families.template_kwargs("google/gemma-3-1b-it", False, {}) == {}
    assert families.template_kwargs("meta-llama/Llama-3.2-1B-Instruct", False, {"date_string": "26 Jul 2024"}) == {
        "date_string": "26 Jul 2024"}
    with pytest.raises(ConfigError, match="model.template_kwargs.date_string='26 Jul 2024'"):
        ModelSpec(name_or_path="meta-llama/Llama-3.2-1B-Instruct")
    with pytest.raises(ConfigError, match="set model.enable_thinking=false"):
        ModelSpec(name_or_path="google/gemma-3-1b-it", enable_thinking=True)


def test_message_policies() -> None:
    assert families.prepare_messages(REVISION, None, "keep") == REVISION
    merged = families.prepare_messages(REVISION, "S", "merge")
    assert [m["role"] for m in merged] == ["system", "user", "assistant", "user"]
    assert merged[2]["content"] == "A\n\nC"
    critic = families.prepare_messages(REVISION, None, "critic_as_user")
    assert [m["role"] for m in critic] == ["user", "assistant", "user"] and critic[2]["content"] == "C\n\nRevise."
    # A later answer after the critique stays the model's.
    later = families.prepare_messages([*REVISION[:3], {"role": "assistant", "content": "A2"}], None, "critic_as_user")
    assert [m["role"] for m in later] == ["user", "assistant", "user", "assistant"]
    assert families.alternation_problem(REVISION) and not families.alternation_problem(critic)


def test_strict_template_refuses_consecutive_turns_and_the_policy_fixes_it() -> None:
    from jinja2.exceptions import TemplateError

    template, special = templates.template_source(STRICT)
    with pytest.raises(TemplateError, match="two assistant turns in a row"):
        templates.render(template, REVISION, special, {})
    rendered = templates.render(template, families.prepare_messages(REVISION, None, "critic_as_user"), special, {})
    assert rendered == "<user>Q</user><assistant>A</assistant><user>C\n\nRevise.</user><assistant>"


def _plan(*overrides: str):
    composer = Composer()
    return make_plan(load_spec("full_matrix", ["task=math", "kind=train", "policy=shared", *overrides], composer),
                     composer)


def test_plan_refuses_a_fetched_template_that_cannot_render_the_workflow_in_one_line() -> None:
    plan = _plan("scale=0.6b", "workflow=eval_opt")
    with pytest.raises(GridError) as refused:
        templates.check_fetched_templates(plan.cells, {}, lambda name, dirs: STRICT)
    message = str(refused.value)
    assert "\n" not in message and "cannot render eval_opt's generator call (user -> assistant -> assistant -> user)" in message
    assert "two assistant turns in a row" in message and "set model.message_policy=merge or critic_as_user" in message
    fixed = _plan("scale=0.6b", "workflow=eval_opt", "model.message_policy=critic_as_user")
    templates.check_fetched_templates(fixed.cells, {}, lambda name, dirs: STRICT)
    # Voting never puts two turns of one role in a row.
    templates.check_fetched_templates(_plan("scale=0.6b", "workflow=voting").cells, {}, lambda name, dirs: STRICT)


def test_plan_refuses_a_template_that_writes_todays_date(tmp_path: Path) -> None:
    import json

    folder = tmp_path / "dated"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": families.FAMILIES["llama3.2"].turn_format}))
    plan = _plan("scale=0.6b", "workflow=voting")
    with pytest.raises(GridError, match="pin it with model.template_kwargs.date_string"):
        templates.check_fetched_templates(plan.cells, {}, lambda name, dirs: folder)
    llama = _plan("scale=llama3.2-1b", "workflow=voting")
    templates.check_fetched_templates(llama.cells, {}, lambda name, dirs: folder)


def test_plan_refuses_lengths_over_the_context_window_naming_both_numbers_and_the_knob() -> None:
    with pytest.raises(GridError) as refused:
        _plan("scale=gemma3-1b", "workflow=eval_opt")
    message = str(refused.value)
    assert "\n" not in message and "30720 + 5120 = 35840" in message and "context window of 32768" in message
    assert "lower lengths.max_prompt_tokens to at most 27648" in message
    with pytest.raises(GridError, match="context window of 8192"):
        _plan("scale=smollm2-1.7b", "workflow=voting")
    # Qwen3's 40,960 positions hold every paper row.
    _plan("scale=1.7b", "workflow=eval_opt")


def test_plan_refuses_gemmas_consecutive_turns_without_a_message_policy() -> None:
    cut = "grid.workflow_task.eval_opt.math.max_prompt_tokens=27648"
    with pytest.raises(GridError, match="requires alternating user/assistant turns.*set model.message_policy=merge or critic_as_user"):
        _plan("scale=gemma3-1b", "workflow=eval_opt", cut, "model.message_policy=keep")
    plan = _plan("scale=gemma3-1b", "workflow=eval_opt", cut)
    assert plan.cells[0].config.model.message_policy == "critic_as_user"


def test_gemma_4b_adapters_stay_off_the_vision_tower() -> None:
    with pytest.raises(GridError, match="vision-language checkpoint"):
        _plan("scale=gemma3-4b", "workflow=voting", "lora.target_modules=all-linear")
    import re

    pattern = _plan("scale=gemma3-4b", "workflow=voting").cells[0].config.lora.target_modules
    assert re.fullmatch(pattern, "model.language_model.layers.0.self_attn.q_proj")
    assert re.fullmatch(pattern, "model.layers.0.mlp.down_proj")
    assert not re.fullmatch(pattern, "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj")


def test_family_choices_are_in_the_config_and_qwen3_has_none_of_them() -> None:
    from gridrun.seam.runconfig import dump_config

    qwen3 = dump_config(_plan("scale=1.7b", "workflow=voting").cells[0].config)
    assert "system_prompt" not in qwen3 and "message_policy" not in qwen3 and "template_kwargs" not in qwen3
    qwen25 = dump_config(_plan("scale=qwen2.5-1.5b", "workflow=voting").cells[0].config)
    assert "system_prompt: You are Qwen, created by Alibaba Cloud. You are a helpful assistant." in qwen25
    llama = dump_config(_plan("scale=llama3.2-1b", "workflow=voting").cells[0].config)
    assert "date_string: 26 Jul 2024" in llama
