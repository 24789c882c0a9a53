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

Packed rows (`PackedLayout`, passed as the `gridrun_packed` keyword of the backbone's forward,
which transformers hands to the attention function): one row of several sequences with no
padding, each distinct prompt once and each of its completions after it. A prompt attends
causally to itself, a completion to its prompt and causally to itself, never across
sequences: each piece is its own sdpa call on its own slice, so attention costs the sum of
the sequences' squares (a varlen kernel in plain torch), no mask of the whole row is built,
and a prompt's keys and values serve every completion of it (the shared prompt, with or
without gradient checkpointing: nothing is cached).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

GROUPED_SDPA = "gridrun_grouped_sdpa"
# The keyword the backbone's forward passes a `PackedLayout` under.
PACKED_KWARG = "gridrun_packed"


@dataclass(frozen=True)
class PackedLayout:
    """Where each piece of a packed row lies: per distinct prompt, (start, length) of the
    prompt and of each of its completions' pieces, in row order."""

    groups: tuple[tuple[tuple[int, int], tuple[tuple[int, int], ...]], ...]

    def __post_init__(self) -> None:
        at = 0
        for (start, length), completions in self.groups:
            for piece_start, piece_length in ((start, length), *completions):
                if piece_start != at or piece_length < 0:
                    raise ValueError(f"packed pieces must tile the row in order: a piece starts at {piece_start}, "
                                     f"expected {at}")
                at += piece_length
            if length < 1:
                raise ValueError("a packed prompt needs at least one token")

    def masks(self, device: torch.device) -> list[list[torch.Tensor]]:
        """`_piece_masks` on `device`, built once per layout (every layer reuses them)."""
        cache: dict[torch.device, list[list[torch.Tensor]]] = self.__dict__.setdefault("_masks", {})
        if device not in cache:
            cache[device] = [[m.to(device) for m in group] for group in _piece_masks(self)]
        return cache[device]

    def batched(self, device: torch.device) -> _BatchedPieces | None:
        """`_batched_pieces` on `device`, built once per layout; None where padding the pieces
        into batches would cost more than `BATCH_PADDING_LIMIT` times their own attention."""
        cache: dict[torch.device, _BatchedPieces | None] = self.__dict__.setdefault("_batched", {})
        if device not in cache:
            plan = _batched_pieces(self)
            cache[device] = plan.to(device) if plan is not None else None
        return cache[device]

    @property
    def tokens(self) -> int:
        """Length of the packed row."""
        return sum(length + sum(n for _, n in completions) for (_, length), completions in self.groups)


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
          causal: bool, scaling: float | None) -> torch.Tensor:
    if query.device.type != "cpu" and key.shape[1] != query.shape[1]:
        # CUDA's fused kernels do not all take the grouping (with a mask, none does), and
        # without one torch falls back to its quadratic-memory kernel: copy the keys, as transformers.
        key, value = (t.repeat_interleave(query.shape[1] // key.shape[1], dim=1) for t in (key, value))
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, is_causal=causal, enable_gqa=key.shape[1] != query.shape[1]
    )


# A prompt's completions go through one sdpa call (their queries together, a block mask over
# prompt + completions) while that mask has at most this many entries; longer ones go one by
# one (a call per piece costs ~tens of microseconds, a mask quadratic memory and compute).
GROUP_MASK_ENTRIES = 1 << 20


def _piece_masks(layout: PackedLayout) -> list[list[torch.Tensor]]:
    """Per group, the masks of its completion calls: one block mask of all its completions
    (small groups) or one per completion (each: its prompt, then itself causally)."""
    masks = []
    for (_, length), completions in layout.groups:
        lengths = [n for _, n in completions if n]
        total = sum(lengths)
        if total * (length + total) <= GROUP_MASK_ENTRIES:
            owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.long))
            index = torch.arange(total)
            own = (owner[:, None] == owner[None, :]) & (index[None, :] <= index[:, None])
            masks.append([torch.cat([torch.ones(total, length, dtype=torch.bool), own], dim=1)] if total else [])
        else:
            masks.append([torch.ones(n, length + n, dtype=torch.bool).tril(diagonal=length) for n in lengths])
    return masks


# Pieces are batched (`_batched_pieces`) while the padded batches' attention entries are at
# most this many times the pieces' own: on the toy world's update (8 prompts of ~20 tokens, 8
# completions of ~20 each) batching cut attention's time by two thirds; a long-tailed mix
# of responses (a few hundred to 5,120 tokens) pads far past it and goes group by group.
BATCH_PADDING_LIMIT = 2.0


@dataclass(frozen=True)
class _BatchedPieces:
    """A packed row's pieces laid out as two padded batches, one sdpa call each: the prompts
    (G, P) and the completions (C, Q) with their keys (C, K) = its prompt's, then its own.
    Index tensors hold positions in the row (padding repeats a real one); masks are
    (batch, 1, queries, keys), a padded query row attending one key (its output is dropped,
    so no gradient flows from it); `order` maps each row position to its output in the prompt
    outputs (G * P) followed by the completion outputs (C * Q)."""

    prompt_index: torch.Tensor  # (G, P)
    prompt_mask: torch.Tensor  # (G, 1, P, P)
    query_index: torch.Tensor  # (C, Q)
    key_index: torch.Tensor  # (C, K)
    completion_mask: torch.Tensor  # (C, 1, Q, K)
    order: torch.Tensor  # (tokens,)

    def to(self, device: torch.device) -> _BatchedPieces:
        return _BatchedPieces(*(t.to(device) for t in dataclasses.astuple(self)))


def _batched_pieces(layout: PackedLayout) -> _BatchedPieces | None:
    prompts = [(start, length) for (start, length), _ in layout.groups]
    pieces = [(start, length, at, n) for (start, length), completions in layout.groups for at, n in completions if n]
    width = max(length for _, length in prompts)
    queries = max((n for *_, n in pieces), default=0)
    keys = max((length + n for _, length, _, n in pieces), default=0)
    own = sum(length * length for _, length in prompts) + sum(n * (length + n) for _, length, _, n in pieces)
    if len(prompts) * width * width + len(pieces) * queries * keys > BATCH_PADDING_LIMIT * own:
        return None
    prompt_index = torch.tensor([[start + min(i, length - 1) for i in range(width)] for start, length in prompts])
    prompt_mask = torch.zeros(len(prompts), 1, width, width, dtype=torch.bool)
    for g, (_, length) in enumerate(prompts):
        prompt_mask[g, 0, :length, :length] = torch.ones(length, length, dtype=torch.bool).tril()
        prompt_mask[g, 0, length:, 0] = True
    query_index = torch.tensor([[at + min(i, n - 1) for i in range(queries)] for _, _, at, n in pieces],
                               dtype=torch.long).view(len(pieces), queries)
    key_index = torch.tensor([[*range(start, start + length), *range(at, at + n), *[start] * (keys - length - n)]
                              for start, length, at, n in pieces], dtype=torch.long).view(len(pieces), keys)
    completion_mask = torch.zeros(len(pieces), 1, queries, keys, dtype=torch.bool)
    for c, (_, length, _, n) in enumerate(pieces):
        completion_mask[c, 0, :n, :length] = True
        completion_mask[c, 0, :n, length : length + n] = torch.ones(n, n, dtype=torch.bool).tril()
        completion_mask[c, 0, n:, 0] = True
    order = torch.empty(layout.tokens, dtype=torch.long)
    for g, (start, length) in enumerate(prompts):
        order[start : start + length] = g * width + torch.arange(length)
    for c, (_, _, at, n) in enumerate(pieces):
        order[at : at + n] = len(prompts) * width + c * queries + torch.arange(n)
    return _BatchedPieces(prompt_index, prompt_mask, query_index, key_index, completion_mask, order)


def _gather(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """states (heads, len, dim), index (batch, n) -> (batch, heads, n, dim)."""
    return states[:, index.reshape(-1)].view(states.shape[0], *index.shape, states.shape[-1]).transpose(0, 1)


def _batched_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: _BatchedPieces,
                  scaling: float | None) -> torch.Tensor:
    """Attention of a packed row (batch 1) in two padded batches -> (1, heads, len, dim)."""
    q, k, v = query[0], key[0], value[0]  # (heads, len, dim)
    heads, dim = q.shape[0], q.shape[-1]
    outputs = [_sdpa(_gather(q, plan.prompt_index), _gather(k, plan.prompt_index), _gather(v, plan.prompt_index),
                     plan.prompt_mask, False, scaling)]
    if plan.query_index.numel():
        outputs.append(_sdpa(_gather(q, plan.query_index), _gather(k, plan.key_index), _gather(v, plan.key_index),
                             plan.completion_mask, False, scaling))
    flat = torch.cat([out.transpose(0, 1).reshape(heads, -1, dim) for out in outputs], dim=1)
    return flat[:, plan.order].unsqueeze(0)


def packed_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                scaling: float | None) -> torch.Tensor:
    """Attention of a packed row (batch 1), in two padded batches or group by group ->
    (1, heads, len, dim)."""
    if query.shape[0] != 1 or query.shape[2] != layout.tokens:
        raise ValueError(f"a packed layout of {layout.tokens} tokens got queries of shape "
                         f"{tuple(query.shape)}: pack one row, without a cache")
    plan = layout.batched(query.device)
    if plan is not None:
        return _batched_sdpa(query, key, value, plan, scaling)
    parts = []
    for ((start, length), completions), masks in zip(layout.groups, layout.masks(query.device)):
        prompt = slice(start, start + length)
        parts.append(_sdpa(query[:, :, prompt], key[:, :, prompt], value[:, :, prompt], None, True, scaling))
        pieces = [(a, n) for a, n in completions if n]
        # One call for all of the group's completions (they lie end to end) or one each.
        spans = [(pieces[0][0], sum(n for _, n in pieces))] if len(masks) == 1 and pieces else pieces
        for (piece_start, piece_length), mask in zip(spans, masks):
            piece = slice(piece_start, piece_start + piece_length)
            keys = torch.cat([key[:, :, prompt], key[:, :, piece]], dim=2)
            values = torch.cat([value[:, :, prompt], value[:, :, piece]], dim=2)
            parts.append(_sdpa(query[:, :, piece], keys, values, mask, False, scaling))
    return torch.cat(parts, dim=2)


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
    broadcastable to (batch, heads, q_len, kv_len) -> (batch, q_len, heads, dim), as sdpa's.
    With a `PackedLayout` under `gridrun_packed`, the row is attended piece by piece."""
    layout = kwargs.get(PACKED_KWARG)
    if layout is not None:
        if attention_mask is not None:
            raise ValueError("a packed row takes no attention mask: its layout says what attends to what")
        return packed_sdpa(query, key, value, layout, scaling).transpose(1, 2).contiguous(), None
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
