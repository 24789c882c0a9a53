"""What every task provides: problems, role prompts and a scorer.

A task is one module in `gridrun/tasks/` plus one YAML in `conf/task/`. It imports neither
half of gridrun: the trainer and the CLI (`gridrun reward`) both use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
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


class RolePrompts(ABC):
    """Prompt builders for every role of every workflow, for one task.

    Each returns the chat messages for one call; the chat template is applied by the
    rollout side, so these stay plain text.
    """

    @abstractmethod
    def generator(self, question: str) -> Messages: ...

    @abstractmethod
    def revision(self, question: str, previous: str, critique: str) -> Messages: ...

    @abstractmethod
    def evaluator(self, question: str, solution: str) -> Messages: ...

    @abstractmethod
    def aggregator(self, question: str, candidates: list[str]) -> Messages: ...

    @abstractmethod
    def orchestrator(self, question: str, n_strategies: int) -> Messages: ...

    @abstractmethod
    def worker(self, question: str, strategy: str) -> Messages: ...

    @abstractmethod
    def synthesizer(self, question: str, solutions: list[str]) -> Messages: ...


class Task(ABC):
    name: str
    prompts: RolePrompts
    # The fixed splits, loaded by the constructor.
    train: list[Problem]
    val: list[Problem]

    def train_problems(self) -> list[Problem]:
        return self.train

    def val_problems(self) -> list[Problem]:
        return self.val

    @abstractmethod
    def extract_answer(self, response: str) -> str | None:
        """The final answer a response commits to (last box, last code block)."""

    @abstractmethod
    def score(self, response: str | None, problem: Problem) -> Score:
        """Outcome reward of a final response; None means the workflow committed to nothing."""

    def score_many(self, items: list[tuple[str | None, Problem]]) -> list[Score]:
        """Batch scoring; tasks with expensive scorers (code) override this."""
        return [self.score(response, problem) for response, problem in items]
