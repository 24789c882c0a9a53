"""Trajectory-side diagnostics: the percentile they all rest on."""

from __future__ import annotations

from gridrun.train.diagnostics import percentile


def test_nearest_rank_percentile() -> None:
    # Nearest rank = the ceil(q/100 * n)-th smallest. p50 of [1, 2]: ceil(1) = 1st -> 1 (the
    # old rounding gave 2 wherever q * n / 100 was an odd integer).
    assert percentile([2.0, 1.0], 50) == 1.0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0  # ceil(1.5) = 2nd
    # p95 of 1..20: 0.95 * 20 = 19 exactly -> the 19th, not the 20th.
    assert percentile([float(v) for v in range(1, 21)], 95) == 19.0
    assert percentile([float(v) for v in range(1, 21)], 96) == 20.0  # ceil(19.2)
    assert percentile([5.0], 0) == 5.0 and percentile([], 50) == 0.0
