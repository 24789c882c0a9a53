"""Grouped-query attention on the CPU without copying keys and values.

Qwen3 shares each key/value head among several query heads (the toy world: 4 query heads, 2
key/value heads). transformers' `sdpa` attention passes that to torch only on accelerators
without a mask; on the CPU, and whenever a padding mask is given (every batched rollout and
update here), it first copies each key and value head once per query head that reads it
(`repeat_kv`). torch's CPU kernel takes the grouping itself (`enable_gqa`) and returns the
same values to the bit (tests/test_attention.py): in the toy Orch-Workers cell the copies
were about 7% of the cell's time and decoding attention ran about 3x slower than it does
grouped.

`use_grouped_attention(model)` switches a loaded model to this implementation, registered
under its own name through transformers' public attention and mask registries. Left out:
accelerators (transformers' choice there is deliberate: CUDA's fused kernels take no mask
with grouping, and the trainer keeps `sdpa` on them), dropout in training (the models here
have none), and attention variants with a position bias.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

GROUPED_SDPA = "gridrun_grouped_sdpa"


def grouped_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query (batch, heads, q_len, dim), key and value (batch, kv_heads, kv_len, dim), mask
    broadcastable to (batch, heads, q_len, kv_len) -> (batch, q_len, heads, dim), as sdpa's."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # The causal flag stands in for a mask only on a prefill without one (as transformers').
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_attention(model: Any) -> None:
    """Run `model`'s attention through `grouped_sdpa_forward` (a model on the CPU only)."""
    model.set_attn_implementation(GROUPED_SDPA)
