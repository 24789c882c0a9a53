"""`orch_workers`: an orchestrator plans n strategies, n workers follow one each, a
synthesizer compares their solutions and commits to a final answer.

Strategies are the orchestrator's numbered lines. When it gives fewer than n, the workers
left over get "any method" so the episode still runs; the shortfall is recorded.
"""

from __future__ import annotations

from gridrun.runconfig import PARALLEL_ROLES, WORKFLOW_ROLES, WorkflowSpec
from gridrun.tasks.answers import parse_strategies
from gridrun.tasks.base import Task
from gridrun.train.episode import Episode
from gridrun.train.rollout import EpisodeLLM
from gridrun.train.workflows import Workflow

FALLBACK_STRATEGY = "any method"


async def run(llm: EpisodeLLM, episode: Episode, task: Task, spec: WorkflowSpec) -> None:
    question, prompts, n = episode.problem.question, task.prompts, spec.n_workers
    plan = await llm.chat("orchestrator", prompts.orchestrator(question, n))
    plan.parsed = parse_strategies(plan.text, n)
    strategies = plan.parsed + [FALLBACK_STRATEGY] * (n - len(plan.parsed))
    solutions = await llm.parallel(
        *(llm.chat("worker", prompts.worker(question, strategies[k]), slot=k) for k in range(n))
    )
    for turn in solutions:
        turn.parsed = task.extract_answer(turn.text)
    final = await llm.chat("synthesizer", prompts.synthesizer(question, [s.text for s in solutions]))
    final.parsed = task.extract_answer(final.text)
    episode.final_response = final.text
    episode.info.update(
        strategies=plan.parsed, missing_strategies=n - len(plan.parsed), worker_answers=[s.parsed for s in solutions]
    )


WORKFLOW = Workflow(
    name="orch_workers", roles=WORKFLOW_ROLES["orch_workers"], parallel_role=PARALLEL_ROLES["orch_workers"], run=run
)
