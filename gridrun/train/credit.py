"""Role-level credit: which reward trains each turn (`reward.credit`), and each role's reward
as a metric of the step.

broadcast (the paper's): the episode's one outcome reward on every turn; nothing is set here.
per_role: the workflow's registered `credit` (gridrun/workflows/) gives each turn its own,
from the task's score of the answering turns' own text (scored in one batch, as validation
scores them); stored on Episode.turn_rewards, which GRPO's rows read
(gridrun/train/advantages.py). Validation never uses it: accuracy is the committed answer's.
Left out: counterfactual credit (re-running a workflow with one role's turn replaced).
"""

from __future__ import annotations

from collections import defaultdict

from gridrun.seam.metric_keys import role_key
from gridrun.seam.registry import Workflow
from gridrun.tasks.base import Score, Task
from gridrun.train.distributed import Dist
from gridrun.train.episode import Episode, Turn


def assign_credit(episodes: list[Episode], task: Task, workflow: Workflow) -> None:
    """Set every episode's turn_rewards by the workflow's per-role credit (reward.credit=per_role)."""
    if workflow.credit is None:
        raise ValueError(f"workflow {workflow.name} defines no per-role rewards")
    answering = [(e, t) for e in episodes for t in e.turns if t.role in workflow.answer_roles]
    scores = task.score_many([(t.text, e.problem) for e, t in answering])
    by_turn = {id(t): s for (_, t), s in zip(answering, scores)}

    def score(turn: Turn) -> Score:
        return by_turn[id(turn)]

    for episode in episodes:
        rewards = workflow.credit(episode, score)
        if len(rewards) != len(episode.turns):
            raise ValueError(f"{workflow.name}'s credit gave {len(rewards)} rewards for {len(episode.turns)} turns")
        episode.turn_rewards = [float(r) for r in rewards]


def role_reward_metrics(episodes: list[Episode], dist: Dist | None = None) -> dict[str, float]:
    """`role/<r>/reward`: the mean training reward of the step's turns of each role, every
    rank's (under broadcast, the episode rewards weighed by the role's turns)."""
    dist = dist or Dist()
    everyone, _ = dist.gather([(t.role, r) for e in episodes for t, r in zip(e.turns, e.rewards_of_turns())])
    by_role: dict[str, list[float]] = defaultdict(list)
    for role, reward in everyone:
        by_role[role].append(reward)
    return {role_key(role, "reward"): sum(values) / len(values) for role, values in by_role.items()}
