"""`eval_opt`: a generator answers, an evaluator judges; revise until accepted or out of rounds.

`workflow.rounds` means what the released code's `max_iterations` means: at most that many
generator turns, each judged by the evaluator (3 on math, 2 on code). An always-rejecting
evaluator therefore gives rounds + rounds turns, and every answer the workflow could commit to
has been judged. The evaluator's verdict is its last `\\boxed{Correct}` /
`\\boxed{Incorrect}`; a malformed verdict is not an acceptance. The workflow commits to the
latest generator answer.
"""

from __future__ import annotations

from gridrun.runconfig import WORKFLOW_ROLES, WorkflowSpec
from gridrun.tasks.answers import parse_verdict
from gridrun.tasks.base import Task
from gridrun.train.episode import Episode
from gridrun.train.rollout import EpisodeLLM
from gridrun.train.workflows import Workflow


async def run(llm: EpisodeLLM, episode: Episode, task: Task, spec: WorkflowSpec) -> None:
    question, prompts = episode.problem.question, task.prompts
    answer = await llm.chat("generator", prompts.generator(question))
    answer.parsed = task.extract_answer(answer.text)
    verdicts: list[bool | None] = []
    for round_ in range(spec.rounds):
        review = await llm.chat("evaluator", prompts.evaluator(question, answer.text), round=round_)
        review.parsed = parse_verdict(review.text)
        verdicts.append(review.parsed)
        if review.parsed is True or round_ + 1 == spec.rounds:
            break
        answer = await llm.chat(
            "generator", prompts.revision(question, answer.text, review.text), round=round_ + 1
        )
        answer.parsed = task.extract_answer(answer.text)
    episode.final_response = answer.text
    episode.info.update(verdicts=verdicts, revisions=answer.round)


WORKFLOW = Workflow(name="eval_opt", roles=WORKFLOW_ROLES["eval_opt"], parallel_role=None, run=run)
