"""Per-problem validation records: which problems a validation got right, not only how many.

One record per evaluation (`records/<split>_step_XXXXXX.json` in the run directory, written
by the trainer beside its metrics row): the problem ids in the order evaluated, the samples
drawn for each and how many of them were right. The aggregate accuracy is their total, so a
record and its metrics row must agree (`matches`); a record that does not (left behind by an
attempt whose rows a resume replayed) is not used.

Two evaluations of one cell see the same problems (the cell's split is fixed), and matched
cells see the same problems too: the per-problem outcomes make their comparison a *paired*
one (gridrun/seam/significance.py), whose standard error leaves out the problems' own spread
in difficulty. A run without records keeps the unpaired statistics of its metrics rows.

    {"split": "val", "step": 10, "problems": ["arith-v-0", ...], "samples": [1, ...],
     "correct": [0, ...]}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SPLITS = ("val", "test")


@dataclass(frozen=True)
class ValidationRecord:
    split: str
    step: int
    problems: tuple[str, ...]
    samples: tuple[int, ...]  # answers drawn per problem
    correct: tuple[int, ...]  # of them right

    @classmethod
    def from_outcomes(cls, split: str, step: int, outcomes: Iterable[tuple[str, bool]]) -> ValidationRecord:
        """A record from (problem id, correct) per sampled answer, problems in first-seen order."""
        tally: dict[str, list[int]] = {}
        for problem, right in outcomes:
            counts = tally.setdefault(problem, [0, 0])
            counts[0] += 1
            counts[1] += bool(right)
        return cls(split, step, tuple(tally), tuple(c[0] for c in tally.values()), tuple(c[1] for c in tally.values()))

    @property
    def acc(self) -> float:
        return sum(self.correct) / sum(self.samples)

    def rates(self) -> dict[str, float]:
        """problem id -> the share of its samples that were right."""
        return {p: c / n for p, c, n in zip(self.problems, self.correct, self.samples)}

    def matches(self, acc: float) -> bool:
        """Whether this record is the evaluation a metrics row reports (`<split>/acc`)."""
        return math.isclose(self.acc, acc, rel_tol=0, abs_tol=1e-9)

    def to_json(self) -> dict[str, Any]:
        return {"split": self.split, "step": self.step, "problems": list(self.problems),
                "samples": list(self.samples), "correct": list(self.correct)}

    @classmethod
    def from_json(cls, data: Any) -> ValidationRecord:
        """The record a file holds; ValueError or TypeError naming what is wrong."""
        if not isinstance(data, Mapping):
            raise TypeError("not a JSON object")
        split, step = data.get("split"), data.get("step")
        if split not in SPLITS or type(step) is not int or step < 0:
            raise ValueError(f"split must be one of {', '.join(SPLITS)} and step an int >= 0")
        problems, samples, correct = data.get("problems"), data.get("samples"), data.get("correct")
        if not (isinstance(problems, list) and isinstance(samples, list) and isinstance(correct, list)):
            raise TypeError("problems, samples and correct must be lists")
        if not problems or not len(problems) == len(samples) == len(correct):
            raise ValueError("problems, samples and correct must be non-empty lists of one length")
        if not all(isinstance(p, str) for p in problems) or len(set(problems)) != len(problems):
            raise ValueError("problems must be distinct strings")
        for n, k in zip(samples, correct):
            if type(n) is not int or type(k) is not int or not 0 <= k <= n or n < 1:
                raise ValueError("each problem needs samples >= 1 and 0 <= correct <= samples")
        return cls(split, step, tuple(problems), tuple(samples), tuple(correct))
