"""`task=arith`: seeded synthetic two-digit addition, the toy world's task.

Problems are `a + b` with a, b in 10..99; the train, validation and test splits are disjoint
and fixed by the seed, so every cell of a sweep sees the same validation and test sets. The
test split (as many problems as validation) is the end of the shuffled pairs, which neither
other split nor the toy world's warm start (pairs 400..5400, gridrun/toy/build.py) reaches. Scoring is the
task=math's reward (the last `\\boxed{}`, under the cell's grader).

The prompts are terse on purpose: the toy model has a few hundred tokens of context and was
warm-started on transcripts built from these very prompts (gridrun/toy/transcripts.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from gridrun.seam import registry
from gridrun.seam.registry import TaskParams, register_task
from gridrun.tasks.base import Messages, Problem, RolePrompts, user_message
from gridrun.tasks.math import BoxedAnswerTask, Grader

LOW, HIGH = 10, 99


class ArithPrompts(RolePrompts):
    def generator(self, question: str) -> Messages:
        return user_message(f"Solve: {question}")

    def revision(self, question: str, previous: str, critique: str) -> Messages:
        return [
            {"role": "user", "content": f"Solve: {question}"},
            {"role": "assistant", "content": previous},
            {"role": "user", "content": f"Feedback: {critique}\nSolve again."},
        ]

    def evaluator(self, question: str, solution: str) -> Messages:
        return user_message(f"Check: {question}\nSolution: {solution}")

    # Eval-Opt with the whole conversation above (protocol.eval_opt_context=full). The toy model
    # was warm-started on the single-turn shapes only, so the last turn keeps their wording.
    def evaluator_followup(self, question: str, solution: str) -> Messages:
        return self.evaluator(question, solution)

    def revision_followup(self, question: str, previous: str, critique: str) -> Messages:
        return user_message(f"Feedback: {critique}\nSolve again.")

    def aggregator(self, question: str, candidates: list[str]) -> Messages:
        lines = "\n".join(f"Candidate {i + 1}: {c}" for i, c in enumerate(candidates))
        return user_message(f"Pick: {question}\n{lines}")

    def orchestrator(self, question: str, n_strategies: int) -> Messages:
        return user_message(f"Plan {n_strategies} ways: {question}")

    def worker(self, question: str, strategy: str) -> Messages:
        return user_message(f"Solve: {question}\nMethod: {strategy}")

    def synthesizer(self, question: str, solutions: list[str]) -> Messages:
        lines = "\n".join(f"Worker {i + 1}: {s}" for i, s in enumerate(solutions))
        return user_message(f"Combine: {question}\n{lines}")


def _pairs(seed: int) -> list[tuple[int, int]]:
    pairs = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]
    random.Random(seed).shuffle(pairs)
    return pairs


def _problem(split: str, i: int, a: int, b: int) -> Problem:
    return Problem(id=f"arith-{split}-{i}", question=f"{a} + {b}", answer=str(a + b))


def make_problems(seed: int, n_train: int, n_val: int) -> tuple[list[Problem], list[Problem]]:
    pairs = _pairs(seed)
    if n_train + n_val > len(pairs):
        raise ValueError(f"arith has {len(pairs)} distinct problems; n_train + n_val must not exceed it")
    val = [_problem("val", i, a, b) for i, (a, b) in enumerate(pairs[:n_val])]
    train = [_problem("train", i, a, b) for i, (a, b) in enumerate(pairs[n_val : n_val + n_train])]
    return train, val


def make_test(seed: int, n_train: int, n_val: int) -> list[Problem]:
    """The test split: the last n_val shuffled pairs; empty when they would reach the
    training split (n_train + 2 n_val above the 8,100 distinct problems)."""
    pairs = _pairs(seed)
    if n_train + 2 * n_val > len(pairs):
        return []
    return [_problem("test", i, a, b) for i, (a, b) in enumerate(pairs[len(pairs) - n_val :])]


@dataclass
class ArithParams(TaskParams):
    name: str = "arith"
    # Sizes of the seeded synthetic splits (every cell sees the same validation split, and a
    # test split of n_val more problems). 300 validation problems: at one answer each (T 0.7)
    # the cliff rule finds a true 10-point fall between two validations of an 11-validation run
    # with ~96% power, paired by problem (bench/measured/val-sizing-2026-11-28.md: at 200 it
    # was 80%, unpaired 668 would be needed).
    n_train: int = 5000
    n_val: int = 300
    # The boxed-answer grader, as task=math's: released | math_verify.
    grader: Literal["released", "math_verify"] = "released"
    # Reward without a \\boxed{} (math_verify: also for a box it cannot parse).
    format_penalty: float = 0.0


class ArithTask(BoxedAnswerTask):
    name = "arith"

    # The defaults are ArithParams': one source, whether a cell or a script builds the task.
    def __init__(self, seed: int = 0, n_train: int = ArithParams.n_train, n_val: int = ArithParams.n_val,
                 format_penalty: float = ArithParams.format_penalty, grader: Grader = ArithParams.grader):
        # The split seed is fixed per task, not per cell, so all cells share one val set.
        self.train, self.val = make_problems(seed, n_train, n_val)
        self.test = make_test(seed, n_train, n_val)
        self.test_missing = (f"task.n_train + 2 x task.n_val exceeds arith's {(HIGH - LOW + 1) ** 2} problems, "
                             "so no test split fits beside them: lower task.n_train")
        self.format_penalty = format_penalty
        self.grader = grader
        self.prompts = ArithPrompts()


TASK = register_task(registry.Task(
    name="arith", params=ArithParams, prompts=ArithPrompts,
    build=lambda p: ArithTask(n_train=p.n_train, n_val=p.n_val, format_penalty=p.format_penalty,
                              grader=p.grader), toy=True,
))
