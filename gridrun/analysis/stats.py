"""Seed statistics shared by every table and figure: the mean over finished seeds, its
count and its 95% Student-t half-width, and the states of the cells that gave no number.

Standard library only. Leaves out paired tests and bootstrap intervals: seeds of different
cells are not paired, and with 1 to 30 seeds a t-interval is what a reader expects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gridrun.seam.cellstate import CellState

# Two-sided 95% Student t quantiles by degrees of freedom (a df between entries takes the
# lower entry's, slightly wider, value).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}


def t95(df: int) -> float:
    """The two-sided 95% t quantile for `df` degrees of freedom (nan below 1)."""
    if df < 1:
        return math.nan
    return T95[max(k for k in T95 if k <= df)] if df <= 120 else 1.960


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 95% t half-width of a sample (nan half-width for fewer than 2 values)."""
    entry = Entry(list(values), [])
    return (entry.mean if entry.mean is not None else math.nan), entry.ci95


class Entry:
    """One table value: the finished cells' numbers and every cell's state."""

    def __init__(self, values: list[float], states: list[str]) -> None:
        self.values, self.states = values, states

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / self.n if self.values else None

    @property
    def se(self) -> float:
        if self.n < 2:
            return math.nan
        mean = sum(self.values) / self.n
        return math.sqrt(sum((v - mean) ** 2 for v in self.values) / (self.n - 1) / self.n)

    @property
    def ci95(self) -> float:
        return t95(self.n - 1) * self.se

    def word(self) -> str:
        """What a table says instead of a number."""
        if not self.states:
            return "missing"
        unfinished = sorted(set(self.states) - {CellState.DONE})
        return "/".join(unfinished) if unfinished else "no val"

    def minus(self, other: Entry) -> tuple[float, int, float] | None:
        """This mean minus the other's, the smaller count, and the half-width of the
        difference (the two standard errors combined, the smaller sample's t quantile)."""
        if self.mean is None or other.mean is None:
            return None
        n = min(self.n, other.n)
        return self.mean - other.mean, n, math.sqrt(self.se**2 + other.se**2) * t95(n - 1)


