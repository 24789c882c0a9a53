"""A fourth workflow and a second toy task, registered from outside gridrun's package: the
example of docs/extending.md ("A workflow", "A task"), which tests/test_plugins.py copies to
a temporary folder and names in `plugin:` (it is never imported from here).

`debate`: a proposer answers, a skeptic challenges it, the proposer answers again (its roles
are new names, so it adds their prompts to the arith task). `sub`: seeded two-digit
subtraction on the toy world (digits, spaces, '-' and the prompt words: byte-level BPE
covers them all).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gridrun.seam import registry
from gridrun.seam.registry import TaskParams, Workflow, WorkflowParams
from gridrun.tasks.base import Messages, Problem, RolePrompts, user_message
from gridrun.tasks.math import BoxedAnswerTask


@dataclass
class DebateParams(WorkflowParams):
    name: str = "debate"
    # Skeptic challenges before the proposer's final answer.
    exchanges: int = 1


async def run(llm: Any, episode: Any, task: Any, params: DebateParams, protocol: Any) -> None:
    # protocol: the cell's ProtocolSpec (what built-in roles see and how they are read); unused here.
    question, prompts = episode.problem.question, task.prompts
    claim = await llm.chat("proposer", prompts["proposer"](question))
    for round_ in range(params.exchanges):
        challenge = await llm.chat("skeptic", prompts["skeptic"](question, claim.text), round=round_)
        claim = await llm.chat("proposer", prompts["proposer"](f"{question}\n{challenge.text}"), round=round_ + 1)
    claim.parsed = task.extract_answer(claim.text)
    episode.final_response = claim.text


def metrics(episodes: list[Any], correct: Callable[[Any], bool], params: DebateParams) -> dict[str, float]:
    # The proposer's answer after the skeptic's last challenge, right or not.
    final = [e.role_turns("proposer")[-1] for e in episodes]
    return {"role/proposer/final_acc": sum(correct(t) for t in final) / len(final)}


registry.register_workflow(Workflow(
    name="debate", roles=("proposer", "skeptic"), params=DebateParams, run=run,
    answer_roles=("proposer",), metrics=metrics,
))
registry.add_prompts(
    "arith",
    proposer=lambda question: user_message(f"Solve: {question}"),
    skeptic=lambda question, claim: user_message(f"Check: {question}\nSolution: {claim}"),
)


class SubPrompts(RolePrompts):
    def generator(self, question: str) -> Messages:
        return user_message(f"Solve: {question}")


class SubTask(BoxedAnswerTask):
    name = "sub"

    def __init__(self, n_train: int, n_val: int, format_penalty: float = -0.1) -> None:
        pairs = [(a, b) for a in range(10, 100) for b in range(10, a + 1)]
        random.Random(0).shuffle(pairs)

        def problem(split: str, i: int, a: int, b: int) -> Problem:
            return Problem(id=f"sub-{split}-{i}", question=f"{a} - {b}", answer=str(a - b))

        self.val = [problem("val", i, a, b) for i, (a, b) in enumerate(pairs[:n_val])]
        self.train = [problem("train", i, a, b) for i, (a, b) in enumerate(pairs[n_val:n_val + n_train])]
        self.format_penalty = format_penalty
        self.prompts = SubPrompts()


@dataclass
class SubParams(TaskParams):
    name: str = "sub"
    n_train: int = 1000
    n_val: int = 100


registry.register_task(registry.Task(
    name="sub", params=SubParams, prompts=SubPrompts, build=lambda p: SubTask(p.n_train, p.n_val), toy=True,
))
