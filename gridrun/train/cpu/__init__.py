"""The CPU fast paths, behind one door: `applies(model)`.

They serve only a model that `load_base` loaded on the CPU, where it installs gridrun's
grouped-query attention (`install`, Qwen3 and Qwen2.5 only); on a GPU the model keeps transformers' attention,
`applies` is False, and nothing here runs. Each computes what the general path computes, to
the bit or to float rounding (their tests say which), faster on a CPU:

    attention.py     grouped-query attention without copying keys and values, and the packed
                     rows' document mask (`PackedLayout`)
    packed.py        the update's rows packed end to end with no padding, micro-batches cut by
                     real tokens
    lora_kernels.py  float32 LoRA layers as one fused autograd function for the update, and
                     peft's merge without its bookkeeping for engine=hf's merged serving
    qwen3_decode.py  engine=hf's lean Qwen3 decoding loop (generate's tokens and log-probs)

They reach into transformers' and peft's internals (attention and mask registries, Qwen3's
layer structure, LoRA layer fields): tests/test_attention.py, test_packed.py,
test_lora_kernels.py and test_qwen3_decode.py compare each against the library's own path,
so an upgrade that changes those internals fails there first.
"""

from __future__ import annotations

from typing import Any

from gridrun.train.cpu.attention import GROUPED_SDPA, use_grouped_attention

# The model types whose decoder these paths were written and are tested against: full
# attention in every layer, and a forward that takes a mask per layer type (the packed rows'
# mapping). Llama's forward takes no mapping, and Gemma 3's sliding layers would attend past
# their window in a packed row: those families run transformers' own attention on the CPU.
PACKABLE_MODEL_TYPES = ("qwen3", "qwen2")


def install(model: Any) -> None:
    """Switch a model loaded on the CPU to gridrun's attention, where its family is one the
    fast paths serve: from then on `applies(model)`."""
    if getattr(model.config, "model_type", None) in PACKABLE_MODEL_TYPES:
        use_grouped_attention(model)


def applies(model: Any) -> bool:
    """Whether the CPU fast paths serve `model` (a peft model or its base): it runs gridrun's
    attention, which `install` set when it was loaded on the CPU."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(causal_lm.config, "_attn_implementation", None) == GROUPED_SDPA
