"""From a step's scored episodes to the advantage of every turn: the one home of advantages.

    shuffle_rewards   the shuffled-reward control: each episode trains on another's reward
    turn_advantages   the rows GRPO groups (per preset: one per role turn, keyed by problem
                      and trajectory name; or one per episode, keyed by problem), gathered
                      across ranks, then the estimator's value of each row back on its turns
    estimators        named functions (rewards, rows, grpo spec) -> advantages, registered
                      with `register_estimator` and chosen by the run's `grpo.estimator`

Registered: `grpo` (the paper's; group_advantages: verl's GRPO outcome advantage with
gridrun's zero-variance and singleton rules, over the preset's groups) and `per_role`
(Dr.MAS, arXiv 2602.08847: each agent's advantages normalised by its own reward statistics).
A researcher's estimator is one function decorated with `@register_estimator("name")` in
their module, chosen with `grpo.estimator=<module>:<name>` (the module is imported first),
never an `if` in the loop.

Rows are role turns under group_key=problem_trajectory, and under group_key=problem too when
the estimator asks for turns (`per_role`) or the turns carry rewards of their own
(reward.credit=per_role); otherwise one row per episode.
Left out: process (per-token) rewards, a value baseline (no critic), the KL penalty (a loss
term: gridrun/train/ppo.py), and the random streams' seeds (gridrun/train/seeds.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from gridrun.seam.registry import ConfigError, Workflow, named
from gridrun.seam.runconfig import GRPOSpec
from gridrun.train.distributed import Dist
from gridrun.train.episode import Episode
from gridrun.train.seeds import Stream, derive


@dataclass(frozen=True)
class GroupStats:
    groups: int
    singleton: int
    zero_variance: int
    # role -> its share of zero-variance groups (`zero_variance_shares`; turn_advantages fills
    # it in, whatever the estimator counted).
    role_zero_variance: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """One advantage row: a role turn, or a whole episode (role None) under group_key=problem."""

    # The episode's problem id.
    problem: Hashable
    # The preset's group of the row: (problem, trajectory name) or the problem.
    group: Hashable
    # The turn's role type (same-role slots alike); None for an episode row.
    role: str | None


# (rewards (rows,) float, each row's Row, the run's grpo node) ->
# (advantages (rows,) float32, the groups counted).
Estimator = Callable[[torch.Tensor, Sequence[Row], GRPOSpec], tuple[torch.Tensor, GroupStats]]
ESTIMATORS: dict[str, Estimator] = {}
# Estimators that need one row per turn whatever the preset's rows (they read Row.role).
PER_TURN: set[str] = set()
DEFAULT_ESTIMATOR = "grpo"


def register_estimator(name: str, per_turn: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator: register an advantage estimator under `name` (a second one of a name is
    refused); `per_turn`: its rows are role turns under every preset (it reads Row.role)."""

    def add(function: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator '{name}' is registered twice: give the new one another name")
        ESTIMATORS[name] = function
        if per_turn:
            PER_TURN.add(name)
        return function

    return add


def estimator(name: str) -> Estimator:
    """The estimator registered as `name` ("<module>:<name>": after importing the module,
    which registers it); a ConfigError naming the registered ones if none is."""
    return ESTIMATORS[_registered(name)]


def _registered(name: str) -> str:
    """The short name of the estimator `name` names (registry.named)."""
    named("grpo.estimator", name, ESTIMATORS, "advantage estimator", "gridrun.train.advantages.register_estimator")
    return name.rpartition(":")[2]


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
def grpo_estimator(rewards: torch.Tensor, rows: Sequence[Row], spec: GRPOSpec) -> tuple[torch.Tensor, GroupStats]:
    """group_advantages over the preset's groups (Row.group) with the run's grpo.norm_by_std,
    adv_eps and singleton_advantage. rewards: (rows,); returns (rows,) float32."""
    return group_advantages(rewards, [r.group for r in rows], spec.norm_by_std, spec.adv_eps, spec.singleton_advantage)


@register_estimator("per_role", per_turn=True)
def per_role_estimator(rewards: torch.Tensor, rows: Sequence[Row], spec: GRPOSpec) -> tuple[torch.Tensor, GroupStats]:
    """Dr.MAS's agent-wise normalisation (arXiv 2602.08847; its code groups verl's GRPO by
    `uid_agent_id`): a row's advantage is (r - mean_k) / (std_k + eps) over the rows of its
    agent k for its problem, every turn of k in the problem's n episodes one row (turns are
    not averaged per trajectory first). gridrun's agent is the role type: same-role slots
    (Voting's 3 voters, Orch-Workers' workers) share one adapter and pool their rows, as
    every Eval-Opt round of a role does. The zero-variance and singleton rules are grpo's.
    rewards: (rows,) one per turn; returns (rows,) float32.

    Under group_key=problem_trajectory this differs from grpo only where a role has several
    trajectory names (Voting's generator0/1/2); under group_key=problem it replaces the
    episode's problem-wide baseline by each role's own."""
    return group_advantages(rewards, [(r.problem, r.role) for r in rows], spec.norm_by_std, spec.adv_eps,
                            spec.singleton_advantage)


def turn_advantages(
    episodes: list[Episode], workflow: Workflow, spec: GRPOSpec, dist: Dist | None = None,
    estimator_name: str | None = None,
) -> tuple[list[list[float]], GroupStats]:
    """The advantage of every turn of every episode (outer list: episodes, inner: turns), by
    `estimator_name` (default: the run's grpo.estimator).

    group_key=problem_trajectory (released): one row per turn, grouped by (problem, the
    workflow's trajectory name of the turn). group_key=problem (as_written): one row per
    episode grouped by problem, its advantage copied to every turn; one row per turn (the
    same groups) where the estimator is per turn or a turn has its own reward. A row's
    reward is its turn's (Episode.turn_rewards: reward.credit), else its episode's outcome.
    With several ranks the rows of every rank are gathered (a problem's episodes are all on
    one rank) and each rank gets its own turns' values."""
    dist = dist or Dist()
    name = _registered(estimator_name or spec.estimator)
    per_episode = spec.group_key == "problem" and name not in PER_TURN and all(e.turn_rewards is None for e in episodes)
    # Each row with the roles whose turns train on its advantage (an episode row: all of them).
    rows: list[tuple[Row, float, tuple[str, ...]]]
    if per_episode:
        rows = [(Row(e.problem.id, e.problem.id, None), e.reward, tuple(dict.fromkeys(str(t.role) for t in e.turns)))
                for e in episodes]
    else:
        rows = [
            (Row(e.problem.id, e.problem.id if spec.group_key == "problem" else (e.problem.id, workflow.trajectory_name(t)),
                 str(t.role)), reward, (str(t.role),))
            for e in episodes for t, reward in zip(e.turns, e.rewards_of_turns())
        ]
    everyone, mine = dist.gather(rows)
    values, stats = ESTIMATORS[name](
        torch.tensor([r for _, r, _ in everyone], dtype=torch.float32), [k for k, _, _ in everyone], spec
    )
    _check_result(estimator_name or spec.estimator, values, len(everyone))
    stats = dataclasses.replace(stats, role_zero_variance=zero_variance_shares(everyone))
    own = values[mine].tolist()
    if per_episode:
        return [[adv] * len(e.turns) for e, adv in zip(episodes, own)], stats
    out, at = [], 0
    for e in episodes:
        out.append(own[at : at + len(e.turns)])
        at += len(e.turns)
    return out, stats


def zero_variance_shares(rows: Sequence[tuple[Row, float, Sequence[str]]]) -> dict[str, float]:
    """Per role: of the groups (Row.group) of 2+ rows that hold its turns, the share whose
    rewards are all equal (float32, group_advantages' rule), so whose advantages are 0: the
    role learns nothing from them. The preset's groups, whatever groups the estimator forms."""
    rewards: dict[Hashable, list[float]] = defaultdict(list)
    roles: dict[Hashable, dict[str, None]] = defaultdict(dict)
    for row, reward, row_roles in rows:
        rewards[row.group].append(reward)
        roles[row.group].update(dict.fromkeys(row_roles))
    counted: dict[str, list[int]] = {}  # role -> [groups, zero-variance groups]
    for group, values in rewards.items():
        if len(values) < 2:
            continue
        flat = torch.tensor(values, dtype=torch.float32)
        equal = int(flat.max().item() == flat.min().item())
        for role in roles[group]:
            count = counted.setdefault(role, [0, 0])
            count[0] += 1
            count[1] += equal
    return {role: zero / groups for role, (groups, zero) in counted.items()}


def _check_result(name: str, values: object, rows: int) -> None:
    """An estimator's contract: one finite advantage per row, a 1-D tensor in the rows' order
    (a misaligned one would train each turn on another's advantage without a word)."""
    shape = tuple(values.shape) if isinstance(values, torch.Tensor) else None
    if shape != (rows,):
        got = f"a tensor of shape {list(shape)}" if shape is not None else type(values).__name__
        raise ConfigError(f"grpo.estimator '{name}' returned {got} for {rows} rows: an estimator returns (advantages, "
                          "stats) with one advantage per row, a 1-D tensor")
    assert isinstance(values, torch.Tensor)
    if not bool(torch.isfinite(values).all()):
        raise ConfigError(f"grpo.estimator '{name}' returned a non-finite advantage: fix the estimator")


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
