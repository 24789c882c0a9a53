"""`single`: one generator answers; the single-agent RL control and the SA-RL baseline."""

from __future__ import annotations

from gridrun.runconfig import WORKFLOW_ROLES, WorkflowSpec
from gridrun.tasks.base import Task
from gridrun.train.episode import Episode
from gridrun.train.rollout import EpisodeLLM
from gridrun.train.workflows import Workflow


async def run(llm: EpisodeLLM, episode: Episode, task: Task, spec: WorkflowSpec) -> None:
    turn = await llm.chat("generator", task.prompts.generator(episode.problem.question))
    turn.parsed = task.extract_answer(turn.text)
    episode.final_response = turn.text


WORKFLOW = Workflow(name="single", roles=WORKFLOW_ROLES["single"], parallel_role=None, run=run)
