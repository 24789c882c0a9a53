"""`voting`: n generators answer independently, an aggregator selects one by number.

The aggregator's `\\boxed{k}` (1-based) picks candidate k; the workflow commits to that
candidate's response. A selection naming no candidate commits to nothing (format penalty).
"""

from __future__ import annotations

from gridrun.runconfig import PARALLEL_ROLES, WORKFLOW_ROLES, WorkflowSpec
from gridrun.tasks.answers import parse_selection
from gridrun.tasks.base import Task
from gridrun.train.episode import Episode
from gridrun.train.rollout import EpisodeLLM
from gridrun.train.workflows import Workflow


async def run(llm: EpisodeLLM, episode: Episode, task: Task, spec: WorkflowSpec) -> None:
    question, prompts = episode.problem.question, task.prompts
    candidates = await llm.parallel(
        *(llm.chat("generator", prompts.generator(question), slot=k) for k in range(spec.n_voters))
    )
    for turn in candidates:
        turn.parsed = task.extract_answer(turn.text)
    pick = await llm.chat("aggregator", prompts.aggregator(question, [c.text for c in candidates]))
    pick.parsed = parse_selection(pick.text, len(candidates))
    episode.final_response = None if pick.parsed is None else candidates[pick.parsed].text
    episode.info.update(selected=pick.parsed, candidate_answers=[c.parsed for c in candidates])


WORKFLOW = Workflow(
    name="voting", roles=WORKFLOW_ROLES["voting"], parallel_role=PARALLEL_ROLES["voting"], run=run, distinct_slots=True
)
