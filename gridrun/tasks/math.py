"""`task=math`: DAPO-Math-17k (processed, English), scored by the last `\\boxed{}`.

Data comes from `gridrun data prepare math` (see gridrun/tasks/prepared.py); the model sees
each problem as DAPO-Math distributes it, its "Answer:" instruction included, as the released
code trained (`question: dapo_prompt`), or the problem alone (`bare`). The reward, shared with
`task=arith`, checks the last box with the released code's grader (gridrun/tasks/math_grader.py)
or math-verify (gridrun/tasks/math_reward.py), per `grader`. Prompts are written for Qwen3 with thinking
disabled: each role is told its output shape, because the drift signatures measure
departures from exactly these shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gridrun.seam import registry
from gridrun.seam.registry import TaskParams, register_task
from gridrun.tasks.answers import last_boxed, released_box
from gridrun.tasks.base import Messages, Problem, RolePrompts, Score, Task, user_message
from gridrun.tasks.prepared import read_split, read_test, require_data

if TYPE_CHECKING:
    from gridrun.tasks.math_reward import MathScore


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


# How a boxed answer is checked against the reference: "released", the released code's grader
# (gridrun/tasks/math_grader.py), or "math_verify" (gridrun/tasks/math_reward.py).
Grader = Literal["released", "math_verify"]


class BoxedAnswerTask(Task):
    """Tasks whose answer is the last `\\boxed{}` (math, arith), checked by the chosen grader."""

    format_penalty: float
    grader: Grader = "released"

    def extract_answer(self, response: str) -> str | None:
        # The box the grader scores, so a turn's parsed answer is what its reward read.
        return released_box(response) if self.grader == "released" else last_boxed(response)

    def score(self, response: str | None, problem: Problem) -> Score:
        if response is None:
            return Score(self.format_penalty, None, "no_answer")
        result = score_boxed(response, problem.answer, self.grader, self.format_penalty)
        return Score(result.reward, result.parsed, result.flag)


def score_boxed(response: str, answer: str, grader: Grader, format_penalty: float) -> MathScore:
    """The last box of `response` against `answer` under `grader`; no box scores format_penalty."""
    # Imported here, not at module import: the grid imports this module to check task nodes at
    # plan time, and math-verify with sympy costs a quarter second to load.
    if grader == "released":
        from gridrun.tasks.math_grader import score_released

        return score_released(response, answer, format_penalty=format_penalty)
    from gridrun.tasks.math_reward import score_math

    return score_math(response, answer, format_penalty=format_penalty)


class MathTask(BoxedAnswerTask):
    name = "math"

    def __init__(self, data_path: str | Path, format_penalty: float = 0.0, grader: Grader = "released",
                 question: str = "dapo_prompt") -> None:
        field = "prompt" if question == "dapo_prompt" else "question"
        self.train = read_split(data_path, "train", "math", field)
        self.val = read_split(data_path, "val", "math", field)
        self.test, self.test_missing = read_test(data_path, "math", field)
        self.format_penalty = format_penalty
        self.grader = grader
        self.prompts = MathPrompts()


@dataclass
class MathParams(TaskParams):
    name: str = "math"
    # Local prepared data (`gridrun data prepare math` writes data/math).
    data_path: str | None = None
    # released: the released code's grader (normalised string match, then sympy);
    # math_verify: math-verify (the paper's text). Both read the last \\boxed{}.
    grader: Literal["released", "math_verify"] = "released"
    # Reward without a \\boxed{} (math_verify: also for a box it cannot parse); 1 correct,
    # 0 wrong otherwise. The released code gives 0.0.
    format_penalty: float = 0.0
    # What the model sees of a problem: "dapo_prompt", DAPO-Math's prompt as distributed (its
    # "Answer:" format instruction included, as the released code trained), or "bare", the
    # problem alone.
    question: Literal["dapo_prompt", "bare"] = "dapo_prompt"

    def __post_init__(self) -> None:
        require_data(self)


TASK = register_task(registry.Task(
    name="math", params=MathParams, prompts=MathPrompts,
    build=lambda p: MathTask(p.data_path, format_penalty=p.format_penalty, grader=p.grader, question=p.question),
))
