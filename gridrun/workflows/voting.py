"""`voting`: n generators answer independently, an aggregator selects one by number.

The aggregator's `\\boxed{k}` (1-based) picks candidate k; the workflow commits to that
candidate's response. How its text is read is `protocol.aggregator_parse`: as the released
code (the first box, else a lone digit, else candidate 1: it always commits to a candidate),
or by its last box alone, where a selection naming no candidate commits to nothing (format
penalty).

Its validation metrics: the aggregator's selection rate (its last box names a candidate: the
shape it is asked for, whatever the protocol's fallbacks then pick), its selection accuracy
on problems some candidate solved (the pick the workflow committed to), and its terse rate
(a drift signature: that shape in at most TERSE_TOKENS tokens, the shape it starts in). Rate
and terse rate read the shape alike under both protocols, so they stay comparable.

Its per-role rewards (reward.credit=per_role): each generator its own answer's reward; the
aggregator 1 when the candidate it committed to scores as well as the best one available (a
correct one when one existed; any, when none did), else 0, and the episode's reward when it
committed to none (the task's penalty for no answer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gridrun.seam.metric_keys import role_key
from gridrun.seam.registry import Workflow, WorkflowParams, register_workflow
from gridrun.seam.runconfig import ProtocolSpec
from gridrun.tasks.answers import parse_selection

TERSE_TOKENS = 30


@dataclass
class VotingParams(WorkflowParams):
    name: str = "voting"
    # Parallel generator slots (they share one adapter under IP).
    n_voters: int = 3


async def run(llm: Any, episode: Any, task: Any, params: VotingParams, protocol: ProtocolSpec) -> None:
    question, prompts = episode.problem.question, task.prompts
    candidates = await llm.parallel(
        *(llm.chat("generator", prompts["generator"](question), slot=k) for k in range(params.n_voters))
    )
    for turn in candidates:
        turn.parsed = task.extract_answer(turn.text)
    pick = await llm.chat("aggregator", prompts["aggregator"](question, [c.text for c in candidates]))
    pick.parsed = parse_selection(pick.text, len(candidates), protocol.aggregator_parse)
    episode.final_response = None if pick.parsed is None else candidates[pick.parsed].text
    episode.info.update(selected=pick.parsed, candidate_answers=[c.parsed for c in candidates])


def metrics(episodes: list[Any], correct: Callable[[Any], bool], params: VotingParams) -> dict[str, float]:
    n = len(episodes)
    picks = [e.role_turns("aggregator")[0] for e in episodes]
    boxed = [parse_selection(p.text, len(e.role_turns("generator")), "last_box") is not None
             for e, p in zip(episodes, picks)]
    out = {
        role_key("aggregator", "select_rate"): sum(boxed) / n,
        role_key("aggregator", "terse_rate"): sum(len(p.completion_ids) <= TERSE_TOKENS and ok for p, ok in zip(picks, boxed)) / n,
    }
    solvable = [(e, p.parsed) for e, p in zip(episodes, picks) if any(correct(t) for t in e.role_turns("generator"))]
    if solvable:
        out[role_key("aggregator", "select_acc")] = sum(
            p is not None and correct(e.role_turns("generator")[p]) for e, p in solvable
        ) / len(solvable)
    return out


def credit(episode: Any, score: Callable[[Any], Any]) -> list[float]:
    candidates = [score(t).reward for t in episode.role_turns("generator")]
    best = max(candidates)
    return [
        score(t).reward if t.role == "generator"
        else episode.reward if t.parsed is None
        else float(candidates[t.parsed] >= best)
        for t in episode.turns
    ]


WORKFLOW = register_workflow(Workflow(
    name="voting", roles=("generator", "aggregator"), params=VotingParams, run=run, parallel_role="generator",
    slots_field="n_voters", distinct_slots=True, answer_roles=("generator",), metrics=metrics,
    credit=credit,
))
