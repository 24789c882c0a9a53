"""Packed rows for the update on the CPU: one row of several sequences with no padding.

A micro-batch's distinct prompts and completions are laid end to end in one row, each prompt
once and each completion after it with positions continuing its prompt's, and the attention
keeps every piece to its own prompt (gridrun/train/cpu/attention.py's `PackedLayout`: a
document mask applied piece by piece, never across rows). The same function of the weights
as the padded rows of gridrun/train/logprobs.py, so the same log-probs and gradients to
float rounding (tests/test_packed.py); a shared prompt needs no cache and holds under
gradient checkpointing too. Micro-batches are cut by the packed row's real tokens
(`packed_cuts`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

import torch

from gridrun.train.cpu.attention import PACKED_KWARG, PackedLayout
from gridrun.train.logprobs import CHUNK_TOKENS, head_logprobs, prompt_owners, right_aligned


class _Row(Protocol):
    """What a packed cut reads of an update row (gridrun/train/update.py's TrainSeq)."""

    prompt_ids: list[int]
    completion_ids: list[int]


RowT = TypeVar("RowT", bound=_Row)


def packed_rows(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
                ) -> tuple[list[int], list[int], PackedLayout, list[int]]:
    """(token ids, position ids, layout, predictors) of the packed row: each distinct prompt
    once, then each of its completions but its last token (nothing reads what follows it);
    predictors[k] is the position whose output predicts the k-th completion token, rows in
    order."""
    distinct, owners = prompt_owners(prompts)
    rows_of: list[list[int]] = [[] for _ in distinct]
    for row, owner in enumerate(owners):
        rows_of[owner].append(row)
    ids: list[int] = []
    positions: list[int] = []
    groups = []
    predicts: list[list[int]] = [[] for _ in completions]
    for prompt, rows in zip(distinct, rows_of):
        if not prompt:
            raise ValueError("a packed row needs a prompt of at least one token")
        start = len(ids)
        ids += prompt
        positions += range(len(prompt))
        pieces = []
        for row in rows:
            tail = list(completions[row][:-1])
            at = len(ids)
            pieces.append((at, len(tail)))
            ids += tail
            positions += range(len(prompt), len(prompt) + len(tail))
            if completions[row]:
                predicts[row] = [start + len(prompt) - 1, *range(at, at + len(tail))]
        groups.append(((start, len(prompt)), tuple(pieces)))
    return ids, positions, PackedLayout(tuple(groups)), [k for row in predicts for k in row]


def packed_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    with_entropy: bool = True,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`completion_logprobs` of the rows prompts[i] + completions[i] from one packed row with
    no padding: the same (batch, T) outputs, completions right-aligned (0 where a row has no
    token). The caller checks `gridrun.train.cpu.applies`."""
    device = next(model.parameters()).device
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    ids, positions, layout, predictors = packed_rows(prompts, completions)
    hidden = causal_lm.model(
        input_ids=torch.tensor([ids], device=device),
        position_ids=torch.tensor([positions], device=device),
        # A mapping skips transformers' mask of the whole row: the layout is the mask.
        attention_mask={"full_attention": None, "sliding_attention": None},
        use_cache=False,
        **{PACKED_KWARG: layout},
    ).last_hidden_state[0]
    targets = torch.tensor([t for c in completions for t in c], dtype=torch.long, device=device)
    logp, entropy = head_logprobs(causal_lm, hidden[torch.tensor(predictors, dtype=torch.long, device=device)], targets,
                          temperature, with_entropy, chunk_tokens)
    return right_aligned(completions, logp, entropy, device)


def packed_cuts(seqs: list[RowT], token_budget: int) -> Iterator[list[RowT]]:
    """Consecutive cuts of `seqs`, grouped by prompt (in order of first appearance), whose
    packed rows (each distinct prompt once, each completion but its last token) fit the budget."""
    first: dict[tuple[int, ...], int] = {}
    ordered = sorted(seqs, key=lambda s: first.setdefault(tuple(s.prompt_ids), len(first)))
    chunk: list[RowT] = []
    prompts: set[tuple[int, ...]] = set()
    used = 0
    for s in ordered:
        prompt = tuple(s.prompt_ids)
        cost = len(s.completion_ids) - 1 + (0 if prompt in prompts else len(prompt))
        if chunk and used + cost > token_budget:
            yield chunk
            chunk, prompts, used = [], set(), 0
            cost = len(s.completion_ids) - 1 + len(prompt)
        chunk.append(s)
        prompts.add(prompt)
        used += cost
    if chunk:
        yield chunk
