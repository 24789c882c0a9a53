"""Simulated validation curves with per-problem records, for testing gridrun's statistics.

A run validates the same `problems` every time. Problem i has its own chance of being
answered right, p_i ~ Beta with mean `acc` and intra-problem correlation `rho` (the
correlation of one problem's outcomes at two validations: 1 / (a + b + 1)); each validation
draws one answer per problem. A curve's `shift` per validation moves every problem's chance
on the log-odds scale, so a planted fall is a fall of the mean accuracy by about that much.
rho = 0 makes every answer an independent draw at `acc`: the validations' noise the issue
quotes (a 200-problem validation at 31% has an SE of 3.3 points).
"""

from __future__ import annotations

import math

import numpy as np

from gridrun.seam.records import ValidationRecord


def problem_chances(rng: np.random.Generator, problems: int, acc: float, rho: float) -> np.ndarray:
    if rho <= 0:
        return np.full(problems, acc)
    total = 1 / rho - 1  # a + b
    return rng.beta(acc * total, (1 - acc) * total, problems)


def shifted(chances: np.ndarray, points: float) -> np.ndarray:
    """Every chance moved on the log-odds scale so that their mean moves by `points` (bisection)."""
    if points == 0:
        return chances
    logit = np.log(np.clip(chances, 1e-6, 1 - 1e-6) / np.clip(1 - chances, 1e-6, 1))
    target = chances.mean() + points / 100
    low, high = -20.0, 20.0
    for _ in range(60):
        mid = (low + high) / 2
        if (1 / (1 + np.exp(-(logit + mid)))).mean() < target:
            low = mid
        else:
            high = mid
    return 1 / (1 + np.exp(-(logit + (low + high) / 2)))


def run(rng: np.random.Generator, steps: list[int], problems: int, acc: float, rho: float,
        fall_at: int | None = None, fall_pp: float = 0.0) -> tuple[dict[int, float], dict[int, float], dict[int, ValidationRecord]]:
    """One run's (step -> accuracy, step -> its SE, step -> record): flat, or falling by
    `fall_pp` points from validation index `fall_at` on."""
    chances = problem_chances(rng, problems, acc, rho)
    fallen = shifted(chances, -fall_pp) if fall_at is not None else chances
    accs, ses, records = {}, {}, {}
    ids = [f"p{i}" for i in range(problems)]
    for index, step in enumerate(steps):
        now = fallen if fall_at is not None and index >= fall_at else chances
        right = rng.random(problems) < now
        record = ValidationRecord("val", step, tuple(ids), (1,) * problems, tuple(int(r) for r in right))
        mean = record.acc
        accs[step], records[step] = mean, record
        ses[step] = math.sqrt(mean * (1 - mean) / (problems - 1))
    return accs, ses, records
