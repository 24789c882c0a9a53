"""Validation: accuracy of the workflow's committed answer, of each role, and pass@k.

Metrics (all under `val/`; the test evaluation's, the same, under `test/`):
- acc, reward_mean, no_answer_rate: the final answer the workflow commits to.
- acc_se: the standard error of acc over problems and samples (`accuracy_se`), and
  n_problems, n_samples: what it was measured on.
- role/<role>/acc for the workflow's answering roles (generator, worker, synthesizer): every
  turn's own final answer scored against the ground truth.
- pass@k over parallel slots (Voting's generators, Orch-Workers' workers).
- the workflow's own metrics (its registry entry's `metrics`: the evaluator's verdicts, the
  aggregator's selections, the orchestrator's plans; gridrun/workflows/).
- the trajectory signatures of gridrun.train.diagnostics.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from gridrun.seam.metric_keys import role_key
from gridrun.seam.registry import Workflow, WorkflowParams
from gridrun.tasks.base import Task
from gridrun.train.diagnostics import role_signatures
from gridrun.train.episode import Episode, Turn


def accuracy_se(correct_by_problem: Sequence[Sequence[bool]]) -> float:
    """The standard error of the mean accuracy of n problems x m samples each (clustered).

    The m samples of one problem are correlated (an easy problem is right in all of them), so
    the n problems, not the n*m answers, are the independent draws: the SE is the sample
    standard deviation (n - 1 denominator) of the n per-problem mean accuracies, over sqrt(n).
    With one sample per problem it is sqrt(p(1-p)/(n-1)); more samples shrink only the
    within-problem part of it. NaN with fewer than two problems."""
    n = len(correct_by_problem)
    if n < 2:
        return math.nan
    means = [sum(marks) / len(marks) for marks in correct_by_problem]
    mean = sum(means) / n
    return math.sqrt(sum((m - mean) ** 2 for m in means) / (n - 1) / n)


def validation_metrics(episodes: list[Episode], task: Task, workflow: Workflow, params: WorkflowParams,
                       split: str = "val") -> dict[str, float]:
    n = len(episodes)
    out: dict[str, float] = {
        "acc": sum(e.scored.correct for e in episodes) / n,
        "reward_mean": sum(e.reward for e in episodes) / n,
        "no_answer_rate": sum(e.scored.parsed is None for e in episodes) / n,
    }
    by_problem: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        by_problem[e.problem.id].append(e.scored.correct)
    se = accuracy_se(list(by_problem.values()))
    if math.isfinite(se):  # one problem has no spread to measure
        out["acc_se"] = se
    out["n_problems"] = len(by_problem)
    out["n_samples"] = n
    # Every answering turn scored once, in one batch (code scoring runs a sandbox).
    turns = [(e, t) for e in episodes for t in e.turns if t.role in workflow.answer_roles]
    turn_scores = task.score_many([(t.text, e.problem) for e, t in turns])
    correct_by_turn = {id(t): s.correct for (_, t), s in zip(turns, turn_scores)}
    by_role: dict[str, list[bool]] = defaultdict(list)
    for (_, turn), score in zip(turns, turn_scores):
        by_role[turn.role].append(score.correct)
    for role, marks in by_role.items():
        out[role_key(role, "acc")] = sum(marks) / len(marks)

    def correct(turn: Turn) -> bool:
        return correct_by_turn[id(turn)]

    if workflow.parallel_role:
        hits = [any(correct(t) for t in e.role_turns(workflow.parallel_role)) for e in episodes]
        out[f"pass@{workflow.slots(params)}"] = sum(hits) / n
    if workflow.metrics:
        out.update(workflow.metrics(episodes, correct, params))
    out.update(role_signatures(episodes, workflow.parallel_role))
    return {f"{split}/{k}": v for k, v in out.items()}
