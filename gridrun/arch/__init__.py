"""Published architectures of the models gridrun trains, shipped as small config files, and
what differs between their families.

    families.py   each family's chat conventions (stop tokens, template keyword arguments,
                  system prompt, consecutive-turn policy, LoRA scope) and the random-init
                  tokenizer's special tokens: the one place a family difference is handled

`<hub name>.json` (lower case) holds one model's hub `config.json` values (layers, widths,
heads, KV heads, head_dim where the hub writes one, vocabulary, tied embeddings, rope,
sliding-window layout, special token ids), its `generation_config.json` end-of-turn ids and
its tokenizer's special tokens, each file naming its sources: Qwen3 0.6B / 1.7B / 4B (the
paper's), Qwen2.5-Instruct 0.5B / 1.5B / 3B, Llama-3.2-Instruct 1B / 3B, Gemma-3-it 1B and 4B
(its language model, the checkpoint's `text_config`), Phi-4-mini-instruct and
SmolLM2-1.7B-Instruct. Facts, so that a cell can build the real architecture with random
weights (`model.init=random`) where no hub is reachable, and the dry run's memory and cost
models can count parameters, LoRA weights and KV cache without torch. Torch-free: both
halves import it.

Not here: weights, the real tokenizers (gridrun/train/random_init.py maps the toy tokenizer
into a family's vocabulary), MoE models, Gemma 3 4B's vision tower.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
# Ids of Qwen3's special tokens in its 151,936-row vocabulary (its tokenizer_config.json).
QWEN3_SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<think>": 151667,
    "</think>": 151668,
}
# Keys of a shipped file that are gridrun's record, not the model config's: where the numbers
# come from, the family, generation_config.json's and the tokenizer's ids, notes.
RECORD_KEYS = ("source", "family", "generation_config", "tokenizer", "not_shipped", "language_model_of",
               "architectures", "model_type")


class UnknownArchitecture(ValueError):
    pass


def known() -> list[str]:
    return sorted(p.stem for p in _HERE.glob("*.json"))


def arch_name(name_or_path: str) -> str:
    """`Qwen/Qwen3-1.7B` (or a local dir of that name) -> `qwen3-1.7b`."""
    return Path(name_or_path.rstrip("/")).name.lower()


@cache
def published(name_or_path: str) -> dict[str, Any]:
    """The shipped config of a hub id, e.g. `Qwen/Qwen3-1.7B`."""
    path = _HERE / f"{arch_name(name_or_path)}.json"
    if not path.is_file():
        raise UnknownArchitecture(
            f"no published architecture for '{name_or_path}' (model.init=random knows "
            f"{', '.join(known())}): use one of those hub ids or model.init=pretrained"
        )
    return json.loads(path.read_text())


# Published values `model.arch_overrides` may replace: sizes only, so the model stays its
# family's class (attention, norms, rope, vocabulary, sliding-window layout untouched).
RESHAPEABLE = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")


def shaped(name_or_path: str, overrides: dict[str, int]) -> dict[str, Any]:
    """The published config of `name_or_path` with `overrides` (model.arch_overrides) applied."""
    arch = dict(published(name_or_path))
    for key, value in overrides.items():
        if key not in RESHAPEABLE:
            raise UnknownArchitecture(
                f"model.arch_overrides.{key} is not a size of the architecture: use {', '.join(RESHAPEABLE)}"
            )
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UnknownArchitecture(f"model.arch_overrides.{key} must be a whole number >= 1, not {value!r}")
        arch[key] = value
    if arch["num_attention_heads"] % arch["num_key_value_heads"]:
        raise UnknownArchitecture(
            f"model.arch_overrides: {arch['num_attention_heads']} attention heads do not split into "
            f"{arch['num_key_value_heads']} key/value groups: make num_attention_heads a multiple of num_key_value_heads"
        )
    if "head_dim" not in arch and arch["hidden_size"] % arch["num_attention_heads"]:
        raise UnknownArchitecture(
            f"model.arch_overrides: {name_or_path} derives its head width from hidden_size / num_attention_heads, and "
            f"{arch['hidden_size']} does not split into {arch['num_attention_heads']} heads: make hidden_size a multiple"
        )
    return arch


def config_kwargs(arch: dict[str, Any]) -> dict[str, Any]:
    """The values a transformers config class takes (the shipped file less gridrun's record)."""
    return {k: v for k, v in arch.items() if k not in RECORD_KEYS}


def family(arch: dict[str, Any]) -> str:
    """The model's family (gridrun/arch/families.py): named in the file, Qwen3's by its model type."""
    return str(arch.get("family") or arch["model_type"])


def head_dim(arch: dict[str, Any]) -> int:
    """Per-head width: the config's `head_dim` where it has one (Qwen3, Llama 3.2, Gemma 3),
    else hidden_size / heads, as transformers derives it (Qwen2.5, Phi-4-mini, SmolLM2)."""
    return int(arch.get("head_dim") or arch["hidden_size"] // arch["num_attention_heads"])


def fused_projections(arch: dict[str, Any]) -> bool:
    """Phi-3's layout (Phi-4-mini): one qkv_proj and one gate_up_proj per layer, so a LoRA
    adapter of the same rank has one A matrix where the others have three (and two)."""
    return bool(arch["model_type"] == "phi3")


def linear_shapes(arch: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each decoder layer's linear layers."""
    h, i = arch["hidden_size"], arch["intermediate_size"]
    q = arch["num_attention_heads"] * head_dim(arch)
    kv = arch["num_key_value_heads"] * head_dim(arch)
    if fused_projections(arch):
        return {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "gate_up_proj": (h, 2 * i), "down_proj": (i, h)}
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }


def hidden_norms(arch: dict[str, Any]) -> int:
    """RMSNorms of width hidden_size per decoder layer: Gemma 3 normalises before and after
    both attention and MLP, the others before each."""
    return 4 if arch["model_type"] == "gemma3_text" else 2


def _layer_extras(arch: dict[str, Any]) -> int:
    """Per-layer parameters besides the linear weights: norms and biases."""
    h, d = arch["hidden_size"], head_dim(arch)
    if arch["model_type"] in ("qwen3", "gemma3_text"):
        return hidden_norms(arch) * h + 2 * d  # and q/k norms of width head_dim
    if arch["model_type"] == "qwen2":
        shapes = linear_shapes(arch)
        return 2 * h + sum(shapes[name][1] for name in ("q_proj", "k_proj", "v_proj"))  # q/k/v biases
    return 2 * h  # Llama (Llama 3.2, SmolLM2) and Phi-3: no biases


def parameter_count(arch: dict[str, Any]) -> int:
    """Every parameter of the model (tied embeddings counted once)."""
    h, layers = arch["hidden_size"], arch["num_hidden_layers"]
    linear = sum(a * b for a, b in linear_shapes(arch).values())
    embed = arch["vocab_size"] * h
    head = 0 if arch.get("tie_word_embeddings", False) else embed
    return layers * (linear + _layer_extras(arch)) + embed + head + h


def lora_parameter_count(arch: dict[str, Any], rank: int) -> int:
    """Trainable parameters of one LoRA adapter of this rank on every linear layer of the
    language model (peft's all-linear; a fused projection is one layer)."""
    per_layer = sum(rank * (a + b) for a, b in linear_shapes(arch).values())
    return arch["num_hidden_layers"] * per_layer


def sliding_layers(arch: dict[str, Any]) -> list[bool]:
    """Which decoder layers attend within a sliding window: Gemma 3's five of every six
    (`sliding_window_pattern`); Qwen2.5's window is off (`use_sliding_window: false`) and
    Phi-4-mini's (262,144) is wider than its context, so theirs attend fully."""
    layers = arch["num_hidden_layers"]
    pattern = arch.get("sliding_window_pattern")
    if arch["model_type"] == "gemma3_text" and pattern:
        return [(layer + 1) % pattern != 0 for layer in range(layers)]
    return [False] * layers


def kv_bytes(arch: dict[str, Any], tokens: float, dtype_bytes: int) -> float:
    """KV cache bytes of one sequence of `tokens` (keys and values of every layer; a sliding
    layer keeps at most its window)."""
    per_position = 2 * arch["num_key_value_heads"] * head_dim(arch) * dtype_bytes
    sliding = sum(sliding_layers(arch))
    window = arch.get("sliding_window") or tokens
    return float((arch["num_hidden_layers"] - sliding) * per_position * tokens + sliding * per_position * min(tokens, window))


def context_window(arch: dict[str, Any]) -> int:
    """The most positions the model was built for (`max_position_embeddings`)."""
    return int(arch["max_position_embeddings"])
