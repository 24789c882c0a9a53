"""What every task provides: problems, role prompts and a scorer.

A task is one module (here, or a plugin module of your own) plus one YAML in `conf/task/`:
the module declares its params and registers itself (gridrun/seam/registry.py). It imports
neither half of gridrun: the trainer and the CLI (`gridrun reward`) both use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Messages = list[dict[str, str]]


def user_message(text: str) -> Messages:
    """A conversation of one user turn: what most role prompts are."""
    return [{"role": "user", "content": text}]


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    # Ground truth for answer-checked tasks (math, arith); empty for code.
    answer: str = ""
    # Unit tests for code tasks.
    tests: tuple[dict[str, Any], ...] = field(default=(), hash=False)


@dataclass(frozen=True)
class Score:
    reward: float
    # The extracted final answer (boxed text, or the program), None when nothing parsed.
    parsed: str | None
    # Counted outcome: correct, wrong, no_answer, ... (task specific, feeds metrics).
    flag: str

    @property
    def correct(self) -> bool:
        return self.flag == "correct"


class RolePrompts:
    """One task's prompt builders, keyed by role name: `prompts["evaluator"](question, solution)`.

    A subclass writes one method per role (or turn, as Eval-Opt's `revision`) it knows, named
    after it; builders for roles it does not know (a new workflow's) are added by name with
    `add` (the registry does it from `gridrun.seam.registry.add_prompts`). Each returns the chat
    messages of one call; the chat template is applied by the rollout side, so these stay
    plain text. A workflow asking for a role nobody wrote a prompt for is refused at plan
    time (gridrun/seam/runconfig.py), so a lookup here never misses in a planned cell.
    """

    def __init__(self) -> None:
        self._added: dict[str, Callable[..., Messages]] = {}

    def add(self, builders: Mapping[str, Callable[..., Messages]]) -> None:
        self._added.update(builders)

    def __getitem__(self, role: str) -> Callable[..., Messages]:
        if role in self._added:
            return self._added[role]
        builder = None if role.startswith("_") or role == "add" else getattr(self, role, None)
        if not callable(builder):
            raise KeyError(f"{type(self).__name__} has no prompt for role '{role}'")
        return builder


class Task(ABC):
    name: str
    prompts: RolePrompts
    # The fixed splits, loaded by the constructor. `test` is held out from both (the checkpoint
    # chosen on val is measured once on it); a task without one leaves it empty and says why in
    # `test_missing`.
    train: list[Problem]
    val: list[Problem]
    test: list[Problem]
    test_missing: str = "this task defines no test split"

    def train_problems(self) -> list[Problem]:
        return self.train

    def val_problems(self) -> list[Problem]:
        return self.val

    def test_problems(self) -> list[Problem]:
        return getattr(self, "test", [])  # a task of its own (a plugin) may set none

    @abstractmethod
    def extract_answer(self, response: str) -> str | None:
        """The final answer a response commits to (last box, last code block)."""

    @abstractmethod
    def score(self, response: str | None, problem: Problem) -> Score:
        """Outcome reward of a final response; None means the workflow committed to nothing."""

    def score_many(self, items: list[tuple[str | None, Problem]]) -> list[Score]:
        """Batch scoring; tasks with expensive scorers (code) override this."""
        return [self.score(response, problem) for response, problem in items]
