"""From a step's scored episodes to the advantage of every turn: the one home of advantages.

    shuffle_rewards   the shuffled-reward control: each episode trains on another's reward
    turn_advantages   the rows GRPO groups (per preset: one per role turn, keyed by problem
                      and trajectory name; or one per episode, keyed by problem), gathered
                      across ranks, then the estimator's value of each row back on its turns
    estimators        named functions (rewards, group keys, grpo spec) -> advantages,
                      registered with `register_estimator` and looked up with `estimator`

One estimator is registered today, `grpo` (group_advantages: verl's GRPO outcome advantage
with gridrun's zero-variance and singleton rules), and no config key chooses another: the
trainer asks for `DEFAULT_ESTIMATOR` by name, so a researcher's estimator is one decorated
function here plus the name passed in, never an `if` in the loop.
Left out: process (per-token) rewards, a value baseline (no critic), the KL penalty (a loss
term: gridrun/train/ppo.py), and the random streams' seeds (gridrun/train/seeds.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gridrun.registry import Workflow
from gridrun.runconfig import GRPOSpec
from gridrun.train.distributed import Dist
from gridrun.train.episode import Episode
from gridrun.train.seeds import Stream, derive


@dataclass(frozen=True)
class GroupStats:
    groups: int
    singleton: int
    zero_variance: int


# (rewards (rows,) float, the group key of each row, the run's grpo node) ->
# (advantages (rows,) float32, the groups counted).
Estimator = Callable[[torch.Tensor, Sequence[Hashable], GRPOSpec], tuple[torch.Tensor, GroupStats]]
ESTIMATORS: dict[str, Estimator] = {}
DEFAULT_ESTIMATOR = "grpo"


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator: register an advantage estimator under `name` (a second one of a name is refused)."""

    def add(function: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator '{name}' is registered twice: give the new one another name")
        ESTIMATORS[name] = function
        return function

    return add


def estimator(name: str) -> Estimator:
    """The estimator registered as `name`."""
    if name not in ESTIMATORS:
        raise ValueError(f"no advantage estimator '{name}' (registered: {', '.join(sorted(ESTIMATORS))})")
    return ESTIMATORS[name]


def group_advantages(
    rewards: torch.Tensor,
    keys: Sequence[Hashable],
    norm_by_std: bool = True,
    eps: float = 1e-6,
    singleton: str = "zero",
) -> tuple[torch.Tensor, GroupStats]:
    """Per-row advantage (r - mean_g) / (std_g + eps), std unbiased as in verl.

    rewards: (rows,) float; keys: the group of each row. Returns (rows,) float32.
    A group is zero-variance when its max equals its min: a float32 std of equal values such
    as -0.1 or 0.3 need not be exactly 0, and would hand the group a small equal advantage.
    singleton: a group of one row gets "raw" (verl's mean 0 and std 1: r / (1 + eps), or r
    without the std) or "zero".
    """
    if singleton not in ("raw", "zero"):
        raise ValueError(f"unknown singleton advantage '{singleton}': use raw or zero")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        members[key].append(i)
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    singletons = zero_variance = 0
    for idx in members.values():
        if len(idx) == 1:
            singletons += 1
            if singleton == "raw":
                advantages[idx] = rewards[idx].float() / (1.0 + eps) if norm_by_std else rewards[idx].float()
            continue
        group = rewards[idx].float()
        if group.max().item() == group.min().item():
            zero_variance += 1
            continue
        centred = group - group.mean()
        advantages[idx] = centred / (group.std() + eps) if norm_by_std else centred
    return advantages, GroupStats(len(members), singletons, zero_variance)


@register_estimator("grpo")
def grpo_estimator(rewards: torch.Tensor, keys: Sequence[Hashable], spec: GRPOSpec) -> tuple[torch.Tensor, GroupStats]:
    """group_advantages with the run's grpo.norm_by_std, adv_eps and singleton_advantage.
    rewards: (rows,); returns (rows,) float32."""
    return group_advantages(rewards, keys, spec.norm_by_std, spec.adv_eps, spec.singleton_advantage)


def turn_advantages(
    episodes: list[Episode], workflow: Workflow, spec: GRPOSpec, dist: Dist | None = None,
    estimator_name: str = DEFAULT_ESTIMATOR,
) -> tuple[list[list[float]], GroupStats]:
    """The advantage of every turn of every episode (outer list: episodes, inner: turns).

    group_key=problem_trajectory (released): one row per turn, reward = its episode's final
    outcome, grouped by (problem, the workflow's trajectory name of the turn).
    group_key=problem (as_written): one row per episode grouped by problem, its advantage
    copied to every turn. With several ranks the rows of every rank are gathered (a
    problem's episodes are all on one rank) and each rank gets its own turns' values."""
    dist = dist or Dist()
    rows: list[tuple[Any, float]]  # group key (a problem, or a problem and trajectory) and reward
    if spec.group_key == "problem":
        rows = [(e.problem.id, e.reward) for e in episodes]
    else:
        rows = [((e.problem.id, workflow.trajectory_name(t)), e.reward) for e in episodes for t in e.turns]
    everyone, mine = dist.gather(rows)
    values, stats = estimator(estimator_name)(
        torch.tensor([r for _, r in everyone], dtype=torch.float32), [k for k, _ in everyone], spec
    )
    own = values[mine].tolist()
    if spec.group_key == "problem":
        return [[adv] * len(e.turns) for e, adv in zip(episodes, own)], stats
    out, at = [], 0
    for e in episodes:
        out.append(own[at : at + len(e.turns)])
        at += len(e.turns)
    return out, stats


def shuffle_rewards(episodes: list[Episode], seed: int, step: int, dist: Dist | None = None) -> None:
    """The reward control: each episode trains on the reward of another episode of this step.

    One permutation of the whole step's rewards (every rank's, gathered), drawn from (seed,
    step) alone (the SHUFFLE stream): every rank draws the same one, and a resumed run the
    one it drew before."""
    dist = dist or Dist()
    scores = [e.score for e in episodes]
    if any(score is None for score in scores):
        raise RuntimeError("shuffle_rewards runs after scoring: an episode has no score")
    everyone, mine = dist.gather([score.reward for score in scores if score is not None])
    generator = torch.Generator().manual_seed(derive(seed, Stream.SHUFFLE, step))
    order = torch.randperm(len(everyone), generator=generator).tolist()
    for episode, source in zip(episodes, order[mine]):
        episode.shuffled_reward = everyone[source]
