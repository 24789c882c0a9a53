"""`eval_opt`: a generator answers, an evaluator judges; revise until accepted or out of rounds.

`workflow.rounds` means what the released code's `max_iterations` means: at most that many
generator turns, each judged by the evaluator (3 on math, 2 on code). An always-rejecting
evaluator therefore gives rounds + rounds turns, and every answer the workflow could commit to
has been judged. The evaluator's verdict is its first (released) or last `\\boxed{Correct}` /
`\\boxed{Incorrect}` (`protocol.verdict_box`); a malformed verdict is not an acceptance. The
workflow commits to the latest generator answer.

What the evaluator and each revision see is `protocol.eval_opt_context`. "full" (the released
code): the conversation so far, kept as that code kept it (the generator's first prompt, then
every answer and critique as an assistant turn, the instructions between them dropped),
followed by the task's `evaluator_followup` / `revision_followup` instruction. "latest": the
task's `evaluator` prompt on (question, latest answer), its `revision` prompt on the last
answer and critique.

Its validation metrics: the evaluator's verdict rate (its text holds a `\\boxed{Correct}` or
`\\boxed{Incorrect}`, the paper's verdict-tag retention, read alike under both protocols), its
verdict accuracy (the verdict the loop acted on), and its code-fence rate (a drift signature:
an evaluator that starts writing programs instead of judging).

Its per-role rewards (reward.credit=per_role): each generator turn its own answer's reward;
each evaluator turn 1 when its verdict was right about the answer it judged (Correct on a
correct one, Incorrect on a wrong one), else 0 (a malformed verdict too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gridrun.seam.metric_keys import role_key
from gridrun.seam.registry import ConfigError, Workflow, WorkflowParams, register_workflow
from gridrun.seam.runconfig import ProtocolSpec
from gridrun.tasks.answers import parse_verdict, python_blocks

# A python block this long is code, not a quoted expression.
CODE_BLOCK_LINES = 3


@dataclass
class EvalOptParams(WorkflowParams):
    name: str = "eval_opt"
    # At most this many generator turns, each judged by the evaluator (the released code's
    # max_iterations: 3 on math, 2 on code; conf/workflow_task/ sets it per task).
    rounds: int = 3

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ConfigError("workflow.rounds must be >= 1 for eval_opt (generator turns, each judged)")


async def run(llm: Any, episode: Any, task: Any, params: EvalOptParams, protocol: ProtocolSpec) -> None:
    question, prompts = episode.problem.question, task.prompts
    first = prompts["generator"](question)
    answer = await llm.chat("generator", first)
    answer.parsed = task.extract_answer(answer.text)
    full = protocol.eval_opt_context == "full"
    history = first + [_said(answer.text)]
    verdicts: list[bool | None] = []
    for round_ in range(params.rounds):
        if full:
            judge = history + prompts["evaluator_followup"](question, answer.text)
        else:
            judge = prompts["evaluator"](question, answer.text)
        review = await llm.chat("evaluator", judge, round=round_)
        review.parsed = parse_verdict(review.text, protocol.verdict_box)
        verdicts.append(review.parsed)
        history = history + [_said(review.text)]
        if review.parsed is True or round_ + 1 == params.rounds:
            break
        if full:
            revise = history + prompts["revision_followup"](question, answer.text, review.text)
        else:
            revise = prompts["revision"](question, answer.text, review.text)
        answer = await llm.chat("generator", revise, round=round_ + 1)
        answer.parsed = task.extract_answer(answer.text)
        history = history + [_said(answer.text)]
    episode.final_response = answer.text
    episode.info.update(verdicts=verdicts, revisions=answer.round)


def _said(text: str) -> dict[str, str]:
    """A model turn as the conversation keeps it: an assistant message, whichever role spoke."""
    return {"role": "assistant", "content": text}


def has_code_block(turn: Any) -> bool:
    return any(len(block.splitlines()) >= CODE_BLOCK_LINES for block in python_blocks(turn.text))


def metrics(episodes: list[Any], correct: Callable[[Any], bool], params: EvalOptParams) -> dict[str, float]:
    out: dict[str, float] = {}
    judged = []
    for e in episodes:
        answers = e.role_turns("generator")
        for review in e.role_turns("evaluator"):
            # The evaluator of round r judged the generator answer of round r.
            judged.append((review.parsed, correct(answers[review.round])))
    reviews = [t for e in episodes for t in e.role_turns("evaluator")]
    if reviews:
        out[role_key("evaluator", "verdict_rate")] = sum(parse_verdict(t.text, "first") is not None for t in reviews) / len(reviews)
        out[role_key("evaluator", "verdict_acc")] = sum(v is not None and v == ok for v, ok in judged) / len(judged)
        out[role_key("evaluator", "code_fence_rate")] = sum(has_code_block(t) for t in reviews) / len(reviews)
    return out


def credit(episode: Any, score: Callable[[Any], Any]) -> list[float]:
    answers = episode.role_turns("generator")
    return [
        score(t).reward if t.role == "generator"
        # The evaluator of round r judged the generator answer of round r.
        else float(t.parsed is not None and t.parsed == score(answers[t.round]).correct)
        for t in episode.turns
    ]


WORKFLOW = register_workflow(Workflow(
    name="eval_opt", roles=("generator", "evaluator"), params=EvalOptParams, run=run,
    prompts=("generator", "evaluator", "revision", "evaluator_followup", "revision_followup"),
    answer_roles=("generator",), metrics=metrics, credit=credit,
))
