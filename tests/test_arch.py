"""The real Qwen3 architectures with random weights (`model.init=random`), no hub needed."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gridrun import arch
from gridrun.train.random_init import remap_tokenizer_json, tokenizer_dir


@pytest.mark.parametrize(
    ("hub_id", "billions"),
    # The model cards' sizes: 0.6B, 1.7B, 4.0B parameters (tied embeddings counted once).
    [("Qwen/Qwen3-0.6B", 0.596), ("Qwen/Qwen3-1.7B", 1.721), ("Qwen/Qwen3-4B", 4.022)],
)
def test_parameter_count_matches_the_built_model(hub_id: str, billions: float) -> None:
    published = arch.published(hub_id)
    assert published["vocab_size"] == 151936 and published["tie_word_embeddings"]
    config = Qwen3Config(**{k: v for k, v in published.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    built = sum(p.numel() for p in model.parameters())
    assert arch.parameter_count(published) == built
    assert round(built / 1e9, 3) == billions


def test_lora_count_is_rank_times_fan_in_plus_fan_out() -> None:
    # 0.6B, rank 1: per layer q (1024+2048) + k, v (1024+1024 each) + o (2048+1024)
    # + gate, up (1024+3072 each) + down (3072+1024) = 3072+2048+2048+3072+4096*3 = 22528; x 28 layers.
    assert arch.lora_parameter_count(arch.published("Qwen/Qwen3-0.6B"), 1) == 22528 * 28


def test_unknown_model_is_refused_with_the_known_ones() -> None:
    with pytest.raises(arch.UnknownArchitecture, match="qwen3-0.6b, qwen3-1.7b, qwen3-4b"):
        arch.published("meta-llama/Llama-3-8B")


def test_tokenizer_uses_qwen3_special_ids_and_chat_shape(toy_world) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(toy_world), padding_side="left")
    # Qwen3's tokenizer_config: <|endoftext|> 151643 (pad), <|im_start|> 151644, <|im_end|> 151645 (eos),
    # <think> 151667, </think> 151668.
    assert tokenizer.eos_token_id == 151645 and tokenizer.pad_token_id == 151643
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<think>", "</think>"]) == [151644, 151667, 151668]
    messages = [{"role": "user", "content": "Compute 2+3."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    # Qwen3's template with thinking disabled opens the assistant turn with an empty think block.
    assert text == "<|im_start|>user\nCompute 2+3.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 151644 and 151667 in ids and max(i for i in ids if i < 151643) < 400
    # Any text round-trips (byte-level BPE), and ids outside the mapped vocabulary decode to nothing.
    assert tokenizer.decode(tokenizer("∑ é 日本 \\boxed{7}")["input_ids"]) == "∑ é 日本 \\boxed{7}"
    assert tokenizer.decode([100_000, 151_900]) == ""


def test_remap_moves_only_special_tokens(toy_world) -> None:
    toy = json.loads((toy_world / "tokenizer.json").read_text())
    remapped = remap_tokenizer_json(toy)
    ordinary = {t: i for t, i in toy["model"]["vocab"].items() if i >= len(toy["added_tokens"])}
    assert all(remapped["model"]["vocab"][t] == i for t, i in ordinary.items())
    assert {t["content"]: t["id"] for t in remapped["added_tokens"]} == arch.QWEN3_SPECIAL_IDS


def test_arch_overrides_build_qwen3_at_the_size_asked(toy_world) -> None:
    from gridrun.train.random_init import load_random

    sizes = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4,
             "num_key_value_heads": 2}
    model, _ = load_random("Qwen/Qwen3-1.7B", torch.float32, torch.device("cpu"), toy_world, sizes)
    assert type(model) is Qwen3ForCausalLM and model.config.vocab_size == 151936
    assert len(model.model.layers) == 2 and model.config.hidden_size == 256 and model.config.head_dim == 128
    # The memory model counts the same model.
    assert arch.parameter_count(arch.shaped("Qwen/Qwen3-1.7B", sizes)) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("overrides", "init", "message"),
    [
        ({"num_hidden_layers": 2}, "pretrained", "model.arch_overrides reshapes a randomly initialised model"),
        ({"vocab_size": 512}, "random", "model.arch_overrides.vocab_size is not a size of the architecture"),
        ({"num_hidden_layers": 0}, "random", "must be a whole number >= 1"),
        ({"num_attention_heads": 3}, "random", "do not split into 8 key/value groups"),
    ],
)
def test_arch_overrides_are_refused_in_one_line(overrides: dict, init: str, message: str) -> None:
    from gridrun.seam.runconfig import ConfigError, ModelSpec

    with pytest.raises(ConfigError, match=message):
        ModelSpec(name_or_path="Qwen/Qwen3-1.7B", init=init, arch_overrides=overrides)  # type: ignore[arg-type]


def test_a_cell_without_arch_overrides_keeps_its_config_yaml() -> None:
    from gridrun.grid.compose import Composer
    from gridrun.grid.plan import run_config
    from gridrun.seam.runconfig import dump_config

    config = run_config(Composer().compose(["scale=1.7b", "task=math", "workflow=voting"]), {"id": "c", "kind": "train", "seed": 0})
    assert "arch_overrides" not in dump_config(config)
