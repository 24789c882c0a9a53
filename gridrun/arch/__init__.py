"""Published architecture numbers of the paper's models, shipped as small config files.

`qwen3-{0.6b,1.7b,4b}.json` hold Qwen3-0.6B / 1.7B / 4B's hub `config.json` values (layers,
widths, heads, KV heads, head_dim, vocab 151,936, tied embeddings, rope theta, special token
ids): facts, so that a cell can build the real architecture with random weights
(`model.init=random`) where no hub is reachable, and the dry run's memory model can count
parameters without torch. Torch-free: both halves import it.

Not here: weights, the real tokenizer (gridrun/train/random_init.py maps the toy tokenizer
into this vocabulary), Qwen3's MoE models.
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
# The linear layers LoRA wraps under target_modules=all-linear (lm_head is excluded by peft).
_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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


# Published values `model.arch_overrides` may replace: sizes only, so the model stays
# Qwen3's class (attention, norms, rope, tied 151,936-entry vocabulary untouched).
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
    return arch


def linear_shapes(arch: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each decoder layer's linear layers."""
    h, i = arch["hidden_size"], arch["intermediate_size"]
    q = arch["num_attention_heads"] * arch["head_dim"]
    kv = arch["num_key_value_heads"] * arch["head_dim"]
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }


def parameter_count(arch: dict[str, Any]) -> int:
    """Every parameter of the model (tied embeddings counted once)."""
    h, layers = arch["hidden_size"], arch["num_hidden_layers"]
    linear = sum(a * b for a, b in linear_shapes(arch).values())
    # Per layer: two RMSNorms of width h, and Qwen3's q/k norms of width head_dim.
    norms = 2 * h + 2 * arch["head_dim"]
    embed = arch["vocab_size"] * h
    head = 0 if arch.get("tie_word_embeddings", False) else embed
    return layers * (linear + norms) + embed + head + h


def lora_parameter_count(arch: dict[str, Any], rank: int) -> int:
    """Trainable parameters of one all-linear LoRA adapter of this rank."""
    per_layer = sum(rank * (a + b) for name, (a, b) in linear_shapes(arch).items() if name in _LINEAR)
    return arch["num_hidden_layers"] * per_layer
