"""`orch_workers`: an orchestrator plans up to n strategies, one worker follows each, a
synthesizer compares their solutions and commits to a final answer.

Strategies are the orchestrator's numbered lines (at most n). How many workers run is
`protocol.orch_workers`: "parsed" (the released code) runs one per strategy given, 1 to n
(with no numbered line, its long lines or its whole text stand in, as the released parser's
fallbacks); "fixed" always runs n, the ones left over told "any method". The shortfall from n
is recorded either way, and the worker count in `workers`.

Its validation metrics: the orchestrator's plan rate (plans with n distinct strategies) and
its unique openers (a drift signature: distinct first three words over its plans).

Its per-role rewards (reward.credit=per_role): each worker its own answer's reward, the
synthesizer its own (the final answer's, as broadcast), the orchestrator the episode's
outcome (nothing checks a plan by itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gridrun.seam.metric_keys import role_key
from gridrun.seam.registry import Workflow, WorkflowParams, register_workflow
from gridrun.seam.runconfig import ProtocolSpec
from gridrun.tasks.answers import parse_strategies, unnumbered_strategies

FALLBACK_STRATEGY = "any method"


@dataclass
class OrchWorkersParams(WorkflowParams):
    name: str = "orch_workers"
    # Parallel worker slots, at most (they share one adapter under IP); how many run is
    # protocol.orch_workers.
    n_workers: int = 3


async def run(llm: Any, episode: Any, task: Any, params: OrchWorkersParams, protocol: ProtocolSpec) -> None:
    question, prompts, n = episode.problem.question, task.prompts, params.n_workers
    plan = await llm.chat("orchestrator", prompts["orchestrator"](question, n))
    plan.parsed = parse_strategies(plan.text, n)
    if protocol.orch_workers == "parsed":
        strategies = plan.parsed or unnumbered_strategies(plan.text, n)
    else:
        strategies = plan.parsed + [FALLBACK_STRATEGY] * (n - len(plan.parsed))
    solutions = await llm.parallel(
        *(llm.chat("worker", prompts["worker"](question, strategy), slot=k) for k, strategy in enumerate(strategies))
    )
    for turn in solutions:
        turn.parsed = task.extract_answer(turn.text)
    final = await llm.chat("synthesizer", prompts["synthesizer"](question, [s.text for s in solutions]))
    final.parsed = task.extract_answer(final.text)
    episode.final_response = final.text
    episode.info.update(
        strategies=plan.parsed, missing_strategies=n - len(plan.parsed), workers=len(solutions),
        worker_answers=[s.parsed for s in solutions],
    )


def metrics(episodes: list[Any], correct: Callable[[Any], bool], params: OrchWorkersParams) -> dict[str, float]:
    plans = [e.role_turns("orchestrator")[0] for e in episodes]
    openers = {" ".join(t.text.split()[:3]).lower() for t in plans}
    return {
        role_key("orchestrator", "plan_rate"): sum(len(set(p.parsed)) == params.n_workers for p in plans) / len(episodes),
        role_key("orchestrator", "unique_openers"): float(len(openers)),
    }


def credit(episode: Any, score: Callable[[Any], Any]) -> list[float]:
    return [episode.reward if t.role == "orchestrator" else score(t).reward for t in episode.turns]


WORKFLOW = register_workflow(Workflow(
    name="orch_workers", roles=("orchestrator", "worker", "synthesizer"), params=OrchWorkersParams, run=run,
    parallel_role="worker", slots_field="n_workers", answer_roles=("worker", "synthesizer"), metrics=metrics,
    credit=credit,
))
