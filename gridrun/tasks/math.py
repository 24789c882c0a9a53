"""`task=math`: DAPO-Math-17k (processed, English), scored by the last `\\boxed{}`.

Data comes from `gridrun data prepare math` (see gridrun/tasks/prepared.py); the reward is
the same math-verify check as `task=arith`. Prompts are written for Qwen3 with thinking
disabled: each role is told its output shape, because the drift signatures measure
departures from exactly these shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gridrun import registry
from gridrun.registry import TaskParams, register_task
from gridrun.tasks.answers import last_boxed
from gridrun.tasks.base import Messages, Problem, RolePrompts, Score, Task, user_message
from gridrun.tasks.prepared import read_split, require_data


class MathPrompts(RolePrompts):
    def generator(self, question: str) -> Messages:
        return user_message(
            f"{question}\n\nWork through the problem step by step, then give the final answer "
            "on its own as \\boxed{answer}."
        )

    def revision(self, question: str, previous: str, critique: str) -> Messages:
        return self.generator(question) + [
            {"role": "assistant", "content": previous},
            {
                "role": "user",
                "content": f"A reviewer checked your solution:\n\n{critique}\n\n"
                "Fix what is wrong (or confirm what is right) and give the final answer as \\boxed{answer}.",
            },
        ]

    def evaluator(self, question: str, solution: str) -> Messages:
        return user_message(
            f"Problem:\n{question}\n\nProposed solution:\n{solution}\n\n"
            "Check this solution. Point out the first error if there is one, in a few sentences. "
            "End with exactly \\boxed{Correct} or \\boxed{Incorrect}."
        )

    # Eval-Opt with the whole conversation above (protocol.eval_opt_context=full): the
    # solution and critique are already there, so these only say what to do with them.
    def evaluator_followup(self, question: str, solution: str) -> Messages:
        return user_message(
            "Check the latest solution above. Point out its first error if there is one, in a few sentences. "
            "End with exactly \\boxed{Correct} or \\boxed{Incorrect}."
        )

    def revision_followup(self, question: str, previous: str, critique: str) -> Messages:
        return user_message(
            "The last message above is a reviewer's check of your latest solution. Fix what is wrong "
            "(or confirm what is right) and give the final answer as \\boxed{answer}."
        )

    def aggregator(self, question: str, candidates: list[str]) -> Messages:
        listed = "\n\n".join(f"### Candidate {i + 1}\n{c}" for i, c in enumerate(candidates))
        return user_message(
            f"Problem:\n{question}\n\n{listed}\n\n"
            f"Which candidate's final answer is correct? Reply only with its number as \\boxed{{k}} "
            f"(k from 1 to {len(candidates)})."
        )

    def orchestrator(self, question: str, n_strategies: int) -> Messages:
        return user_message(
            f"Problem:\n{question}\n\nDo not solve it. Propose {n_strategies} different strategies "
            f"for solving it, one per line, numbered 1. to {n_strategies}., each a single sentence."
        )

    def worker(self, question: str, strategy: str) -> Messages:
        return user_message(
            f"{question}\n\nSolve the problem using this strategy: {strategy}\n"
            "Give the final answer as \\boxed{answer}."
        )

    def synthesizer(self, question: str, solutions: list[str]) -> Messages:
        listed = "\n\n".join(f"### Solution {i + 1}\n{s}" for i, s in enumerate(solutions))
        return user_message(
            f"Problem:\n{question}\n\n{listed}\n\n"
            "Compare these solutions, decide which final answer is right, and give it as \\boxed{answer}."
        )


class BoxedAnswerTask(Task):
    """Tasks whose answer is the last `\\boxed{}`, verified with math-verify (math, arith)."""

    format_penalty: float

    def extract_answer(self, response: str) -> str | None:
        return last_boxed(response)

    def score(self, response: str | None, problem: Problem) -> Score:
        if response is None:
            return Score(self.format_penalty, None, "no_answer")
        # Here, not at import: the grid imports this module to check task nodes at plan time,
        # and math-verify with sympy costs a quarter second to load.
        from gridrun.tasks.math_reward import score_math

        result = score_math(response, problem.answer, format_penalty=self.format_penalty)
        return Score(result.reward, result.parsed, result.flag)


class MathTask(BoxedAnswerTask):
    name = "math"

    def __init__(self, data_path: str | Path, format_penalty: float = -0.1) -> None:
        self.train = read_split(data_path, "train", "math")
        self.val = read_split(data_path, "val", "math")
        self.format_penalty = format_penalty
        self.prompts = MathPrompts()


@dataclass
class MathParams(TaskParams):
    name: str = "math"
    # Local prepared data (`gridrun data prepare math` writes data/math).
    data_path: str | None = None
    # Reward for a response whose final \\boxed{} does not parse (1 correct, 0 wrong otherwise).
    format_penalty: float = -0.1

    def __post_init__(self) -> None:
        require_data(self)


TASK = register_task(registry.Task(
    name="math", params=MathParams, prompts=MathPrompts,
    build=lambda p: MathTask(p.data_path, format_penalty=p.format_penalty),
))
