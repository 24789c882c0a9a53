"""The order train problems are drawn in: an epoch-wise shuffled pass, seeded per cell.

Its position (epoch, index) is part of every checkpoint, so a resumed run draws exactly the
problems an uninterrupted one would (its seed: gridrun/train/seeds.py's SAMPLER stream). Leaves out sharding across ranks (the trainer's Dist
splits each step's draw) and any curriculum or weighting.
"""

from __future__ import annotations

import random

from gridrun.tasks.base import Problem
from gridrun.train.seeds import Stream, derive


class ProblemSampler:
    """Epoch-wise shuffled pass over the train problems; its position is checkpointed."""

    def __init__(self, problems: list[Problem], seed: int) -> None:
        self.problems, self.seed = problems, seed
        self.epoch, self.index = 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(derive(self.seed, Stream.SAMPLER, self.epoch)).shuffle(order)
        return order

    def take(self, count: int) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < count:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.problems[self._order[self.index]])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, position: dict[str, int]) -> None:
        self.epoch, self.index = position["epoch"], position["index"]
        self._order = self._shuffle()


