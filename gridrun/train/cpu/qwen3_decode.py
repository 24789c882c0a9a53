"""`engine=hf`'s sampling loop for Qwen3 on the CPU: transformers' `generate`, op for op,
without its per-step overhead.

A decoding step of the toy world's model does ~2 ms of matrix products for 64 rows; through
`generate` it took ~6.5 ms, the rest Python: generate's per-step bookkeeping (input
preparation, logits processors, stopping criteria, its mask construction) and each of the
model's ~30 modules per layer dispatching its own forward. Here one function runs the same
tensor operations in the same order on the same weights (the norms' forwards and rotate_half
are transformers' own), so it draws the same tokens and records the same log-probs, to the
bit (tests/test_qwen3_decode.py), about a fifth faster per rollout. Its key/value cache is allocated ahead and doubled when full, attention reading
the filled part (generate's cache grows by concatenation, copying all of it every step).

What it computes, per step, for rows (batch, 1) after a prefill of every prompt column but
the last (`HFEngine._prefill`):
  embed -> per layer: RMSNorm, q/k/v projections, q/k head norms, rotary embedding, cache
  write, grouped attention (gridrun/train/cpu/attention.py's call), o projection, residual,
  RMSNorm, SwiGLU MLP, residual -> RMSNorm -> the output layer on the last position ->
  log softmax(logits / T) recorded, softmax(logits / T) sampled with torch.multinomial
  (argmax when greedy), finished rows fed the pad token, as generate does.

`unsupported(...)` says why a model cannot take this path (then generate runs): anything but
a `Qwen3ForCausalLM` whose layers are all full attention without biases and default rotary
embedding, running gridrun's grouped attention on the CPU in float32. The engine takes it
only where every LoRA-wrapped layer computes its base weight alone (the adapter merged into
it, or off), since those are the weights read here, and not for top-p sampling (generate's
warper).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer
from transformers import Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import rotate_half

from gridrun.train.cpu import applies
from gridrun.train.padding import generate_positions


def _weight(module: Any) -> torch.Tensor:
    """A projection's serving weight: a LoRA-wrapped layer's base weight (the merged copy
    while the engine serves an adapter merged)."""
    return module.get_base_layer().weight if isinstance(module, LoraLayer) else module.weight


# Decoding steps the key/value cache holds at first; it doubles when full (up to the prompt
# plus the response limit), so a batch that stops early never holds a 5,120-token cache.
FIRST_CACHE_STEPS = 64


def _grown(cached: torch.Tensor, capacity: int) -> torch.Tensor:
    """cached (batch, heads, filled, dim) copied into a new (batch, heads, capacity, dim)."""
    buffer = cached.new_empty(*cached.shape[:2], capacity, cached.shape[3])
    buffer[:, :, : cached.shape[2]] = cached
    return buffer


def unsupported(causal_lm: Any) -> str | None:
    """Why this model cannot be decoded here (None: it can). Sampling with top-p cannot either
    (generate's warper); the engine checks that per call."""
    if not isinstance(causal_lm, Qwen3ForCausalLM):
        return f"{type(causal_lm).__name__} is not Qwen3ForCausalLM"
    config = causal_lm.config
    if not applies(causal_lm):  # the CPU fast paths' one door
        return f"attention is {config._attn_implementation}, not gridrun's grouped sdpa"
    if any(kind != "full_attention" for kind in config.layer_types) or config.attention_bias:
        return "sliding-window layers or attention biases"
    if config.rope_parameters.get("rope_type", "default") != "default":
        return f"rotary embedding {config.rope_parameters.get('rope_type')}"
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in causal_lm.parameters()):
        return "weights off the CPU or not float32"
    return None


@torch.inference_mode()
def sample(
    causal_lm: Any,
    last_column: torch.Tensor,
    attention: torch.Tensor,
    cache: Any,
    temperature: float,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode from the prompts' last column -> (tokens (batch, steps), their log-probs
    (batch, steps)); steps stop at `max_new_tokens` or when every row has stopped.

    last_column (batch, 1): each row's last prompt token; attention (batch, width): the
    left-padded prompts' mask; cache: transformers' cache of the first width - 1 columns
    of every row. temperature <= 0 is greedy (log-probs then of softmax(logits))."""
    backbone = causal_lm.model
    config = causal_lm.config
    head_dim = config.head_dim
    batch, prefilled = last_column.shape[0], attention.shape[1] - 1
    layers = []
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for index, layer in enumerate(backbone.layers):
        attn, mlp = layer.self_attn, layer.mlp
        # The norms are the model's own forwards (past the module call's hooks).
        layers.append((layer.input_layernorm.forward, _weight(attn.q_proj), _weight(attn.k_proj),
                       _weight(attn.v_proj), attn.q_norm.forward, attn.k_norm.forward, _weight(attn.o_proj),
                       attn.scaling, layer.post_attention_layernorm.forward, _weight(mlp.gate_proj),
                       _weight(mlp.up_proj), _weight(mlp.down_proj)))
        for store, cached in ((keys, cache.layers[index].keys), (values, cache.layers[index].values)):
            store.append(_grown(cached, prefilled + min(max_new_tokens, FIRST_CACHE_STEPS)))
    embedding, final_norm, head = backbone.embed_tokens.weight, backbone.norm.forward, _weight(causal_lm.lm_head)
    inv_freq, rope_scale = backbone.rotary_emb.inv_freq.float(), backbone.rotary_emb.attention_scaling
    greedy = temperature <= 0
    scale = 1.0 if greedy else temperature
    position = generate_positions(attention)[:, -1:]
    # transformers passes no mask where no row is padded (then no later step is either).
    padded = not bool(attention.all())
    mask = attention.new_ones(batch, prefilled + max_new_tokens, dtype=torch.bool)
    mask[:, : prefilled + 1] = attention.bool()
    stops = torch.tensor(stop_ids)
    unfinished = torch.ones(batch, dtype=torch.long)
    tokens_in = last_column
    drawn, logprobs = [], []
    for step in range(max_new_tokens):
        filled = prefilled + step + 1
        if filled > keys[0].shape[2]:
            capacity = min(prefilled + max_new_tokens, 2 * keys[0].shape[2])
            keys, values = [_grown(t, capacity) for t in keys], [_grown(t, capacity) for t in values]
        step_mask = mask[:, None, None, :filled] if padded else None
        hidden = F.embedding(tokens_in, embedding)  # (batch, 1, hidden)
        freqs = position[..., None].float() * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = (angles.cos() * rope_scale)[:, None], (angles.sin() * rope_scale)[:, None]
        for (norm1, wq, wk, wv, q_norm, k_norm, wo, scaling, norm2, w_gate, w_up, w_down), layer_keys, layer_values \
                in zip(layers, keys, values):
            normed = norm1(hidden)
            query = q_norm(F.linear(normed, wq).view(batch, 1, -1, head_dim)).transpose(1, 2)
            key = k_norm(F.linear(normed, wk).view(batch, 1, -1, head_dim)).transpose(1, 2)
            value = F.linear(normed, wv).view(batch, 1, -1, head_dim).transpose(1, 2)
            query = query * cos + rotate_half(query) * sin
            key = key * cos + rotate_half(key) * sin
            layer_keys[:, :, filled - 1] = key[:, :, 0]
            layer_values[:, :, filled - 1] = value[:, :, 0]
            attended = F.scaled_dot_product_attention(
                query, layer_keys[:, :, :filled], layer_values[:, :, :filled], attn_mask=step_mask, scale=scaling,
                enable_gqa=layer_keys.shape[1] != query.shape[1],
            )
            attended = attended.transpose(1, 2).contiguous().reshape(batch, 1, -1).contiguous()
            hidden = hidden + F.linear(attended, wo)
            normed = norm2(hidden)
            hidden = hidden + F.linear(F.silu(F.linear(normed, w_gate)) * F.linear(normed, w_up), w_down)
        logits = F.linear(final_norm(hidden)[:, -1:], head)[:, -1].float()  # (batch, vocab)
        # generate divides twice (its recorder, then its temperature warper): the same values.
        scaled = logits / scale
        step_logprobs = torch.log_softmax(scaled, dim=-1)
        if greedy:
            token = torch.argmax(logits, dim=-1)
        else:
            token = torch.multinomial(torch.softmax(scaled, dim=-1), num_samples=1).squeeze(1)
        token = token * unfinished + pad_id * (1 - unfinished)
        drawn.append(token)
        logprobs.append(step_logprobs.gather(-1, token[:, None]).squeeze(-1))
        unfinished = unfinished & ~torch.isin(token, stops)
        if not bool(unfinished.any()):
            break
        tokens_in, position = token[:, None], position + 1
    return torch.stack(drawn, dim=1), torch.stack(logprobs, dim=1)
