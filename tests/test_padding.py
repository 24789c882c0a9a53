"""The one padding helper: left padding ends every row at the right edge, right padding starts it at 0."""

from __future__ import annotations

import pytest
import torch

from gridrun.train.padding import generate_positions, pad_rows


def test_left_and_right_padding_with_their_masks() -> None:
    # Rows of 3, 1 and 0 entries, width 3 = the longest: 2 and 3 pad entries where the rows are short.
    left, left_mask = pad_rows([[5, 6, 7], [8], []], 0, "left")
    assert left.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert left_mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    right, right_mask = pad_rows([[5, 6, 7], [8], []], -100, "right")
    assert right.tolist() == [[5, 6, 7], [8, -100, -100], [-100, -100, -100]]
    assert right_mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert left.dtype == torch.long and left_mask.dtype == torch.long


def test_float_rows_to_a_given_width() -> None:
    # Per-token log-probs right-aligned under completions of width 4: one pad of 0.0 on the left of row 0.
    values, _ = pad_rows([[-0.5, -1.5, -2.5], [-1.0, -2.0, -3.0, -4.0]], 0.0, "left", width=4, dtype=torch.float32)
    assert values.tolist() == [[0.0, -0.5, -1.5, -2.5], [-1.0, -2.0, -3.0, -4.0]]


def test_a_row_wider_than_the_width_is_refused() -> None:
    with pytest.raises(ValueError, match="row 0 has 3 entries, more than the width 2: pass a larger width"):
        pad_rows([[1, 2, 3]], 0, "left", width=2)


def test_generate_positions_count_real_tokens_from_zero_and_give_pads_one() -> None:
    _, mask = pad_rows([[5, 6, 7], [8]], 0, "left")
    assert generate_positions(mask).tolist() == [[0, 1, 2], [1, 1, 0]]
