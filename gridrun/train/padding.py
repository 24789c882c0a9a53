"""Ragged rows of token ids (or per-token floats) into one padded (batch, width) tensor.

The one padding helper of the package: the rollout engine left-pads prompts, the update
left-pads prompt + completion so every completion ends at the right edge, the toy world's
warm start right-pads transcripts. Leaves out truncation: a row longer than `width` is an
error, never cut. `generate_positions` gives left-padded rows the position ids generate
gives them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch


def pad_rows(
    rows: Sequence[Sequence[int] | Sequence[float]],
    value: float,
    side: Literal["left", "right"],
    width: int | None = None,
    dtype: torch.dtype = torch.long,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(padded, mask): (batch, width) tensors, `value` where a row has no entry and 1 in the
    long `mask` where it has one. `width` defaults to the longest row; `side` is where the
    padding goes ("left": every row ends at the right edge)."""
    width = max((len(row) for row in rows), default=0) if width is None else width
    padded = torch.full((len(rows), width), value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {index} has {len(row)} entries, more than the width {width}: pass a larger width")
        if not row:
            continue
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        padded[index, span] = torch.tensor(row, dtype=dtype)
        mask[index, span] = 1
    return padded, mask


def generate_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows as transformers' `generate` derives them from the
    (batch, width) mask: each real token its index among the row's tokens, pads 1 (they are
    masked out). The engine's prefill and its decoding loop must agree with generate to the bit."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
