"""Advantage rows of a training step (gridrun/train/advantages.py: turn_advantages) under both presets, on
hand-built episodes: the released code's turn-level groups vs the text's episode groups."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from gridrun.seam.registry import workflow as get_workflow
from gridrun.seam.runconfig import GRPOSpec
from gridrun.tasks.base import Problem, Score
from gridrun.train.advantages import shuffle_rewards, turn_advantages
from gridrun.train.episode import Episode, Turn

RELEASED = GRPOSpec(group_key="problem_trajectory", adv_eps=0.0)
AS_WRITTEN = GRPOSpec(group_key="problem", adv_eps=0.0)


def turn(role: str, slot: int = 0, round_: int = 0) -> Turn:
    return Turn(role, slot, round_, [], [1], [2], [-0.5], "", "stop")


def episode(problem: str, sample: int, reward: float, turns: list[Turn]) -> Episode:
    ep = Episode(Problem(id=problem, question="q", answer="a"), sample, turns)
    ep.score = Score(reward, None, "correct" if reward == 1.0 else "wrong")
    return ep


def orch_workers_episode(sample: int, reward: float) -> Episode:
    turns = [turn("orchestrator")] + [turn("worker", k) for k in range(3)] + [turn("synthesizer")]
    return episode("p", sample, reward, turns)


def test_orch_workers_worker_advantages_are_1_0465_times_the_episode_ones() -> None:
    # 8 episodes, rewards 1 1 0 0 0 0 0 0: mean 0.25, sum of squared deviations
    # 2 * 0.75^2 + 6 * 0.25^2 = 1.5. Episode groups: std = sqrt(1.5 / 7). The three workers
    # share one trajectory name, so their group holds 24 rows with the same mean and 3 x the
    # squared deviations: std = sqrt(4.5 / 23). Ratio of advantages sqrt(23 / 21) = 1.04654.
    rewards = [1.0, 1.0] + [0.0] * 6
    episodes = [orch_workers_episode(k, r) for k, r in enumerate(rewards)]
    workflow = get_workflow("orch_workers")
    released, stats = turn_advantages(episodes, workflow, RELEASED)
    written, _ = turn_advantages(episodes, workflow, AS_WRITTEN)
    assert stats.groups == 3  # orchestrator, worker, synthesizer of problem p
    ratio = math.sqrt(23 / 21)
    assert ratio == pytest.approx(1.0465, abs=1e-4)
    for released_row, written_row in zip(released, written):
        orchestrator, *workers, synthesizer = released_row
        assert orchestrator == pytest.approx(written_row[0]) and synthesizer == pytest.approx(written_row[4])
        assert workers == pytest.approx([written_row[1] * ratio] * 3, rel=1e-6)
    assert released[0][1] == pytest.approx(0.75 / math.sqrt(4.5 / 23), rel=1e-6)


def test_orch_workers_with_1_2_3_and_2_workers_form_one_worker_group_of_8_rows() -> None:
    # protocol.orch_workers=parsed: 1, 2, 3 and 2 workers in 4 episodes rewarded 1, 0, 0, 1.
    # The worker group (trajectory name `worker`) holds 1 + 2 + 3 + 2 = 8 rows, rewards
    # 1 0 0 0 0 0 1 1: mean 3/8, squared deviations 3 * 0.625^2 + 5 * 0.375^2 = 1.875, std
    # sqrt(1.875 / 7) = 0.51755; a rewarded worker +0.625 / std = 1.20761, the others -0.72457.
    # Orchestrator and synthesizer: 1 0 0 1, +-0.5 / sqrt(1/3) = +-0.86603.
    counts, rewards = [1, 2, 3, 2], [1.0, 0.0, 0.0, 1.0]
    episodes = [
        episode("p", k, r, [turn("orchestrator")] + [turn("worker", s) for s in range(c)] + [turn("synthesizer")])
        for k, (c, r) in enumerate(zip(counts, rewards))
    ]
    advantages, stats = turn_advantages(episodes, get_workflow("orch_workers"), RELEASED)
    assert (stats.groups, stats.singleton, stats.zero_variance) == (3, 0, 0)
    std = math.sqrt(1.875 / 7)
    assert 0.625 / std == pytest.approx(1.20761, rel=1e-5)
    for row, c, r in zip(advantages, counts, rewards):
        sign = 1.0 if r else -1.0
        assert len(row) == c + 2
        assert row[0] == row[-1] == pytest.approx(sign * 0.5 / math.sqrt(1 / 3), rel=1e-6)
        assert row[1:-1] == pytest.approx([(r - 0.375) / std] * c, rel=1e-6)
    assert sum(v for row in advantages for v in row[1:-1]) == pytest.approx(0.0, abs=1e-5)


def test_variable_worker_counts_reach_the_update_as_that_many_sequences() -> None:
    # 1 + 2 + 3 + 2 workers: the worker adapter (IP) trains 8 sequences, 2 mini-batches of 4;
    # the orchestrator's 4 sequences are one. The mini-batches count sequences, not slots.
    from gridrun.train.update import TrainSeq, minibatch_plan

    episodes = [
        episode("p", k, float(k % 2), [turn("orchestrator")] + [turn("worker", s) for s in range(c)] + [turn("synthesizer")])
        for k, c in enumerate([1, 2, 3, 2])
    ]
    advantages, _ = turn_advantages(episodes, get_workflow("orch_workers"), RELEASED)
    seqs = [TrainSeq(t.role, t.role, [1], t.completion_ids, t.logprobs, adv, False)
            for e, row in zip(episodes, advantages) for t, adv in zip(e.turns, row)]
    plan = minibatch_plan(seqs, ("orchestrator", "worker", "synthesizer"), RELEASED, 4, 1, random.Random(0))
    assert {adapter: [len(cut) for cut in cuts] for adapter, cuts in plan.items()} == {
        "orchestrator": [4], "worker": [4, 4], "synthesizer": [4]}


def test_grpo_n_1_groups_are_singletons_with_their_raw_reward_under_released() -> None:
    # One episode per problem: every (problem, trajectory) group has one row, so each turn
    # gets its episode's raw reward (adv_eps 0 here); singleton_advantage=zero gives 0.
    episodes = [episode(p, 0, r, [turn("generator", s) for s in range(3)] + [turn("aggregator")])
                for p, r in (("p", 1.0), ("q", -0.1))]
    advantages, stats = turn_advantages(episodes, get_workflow("voting"), RELEASED)
    assert advantages == [[1.0] * 4, pytest.approx([-0.1] * 4)]
    assert (stats.groups, stats.singleton) == (8, 8)
    zero = GRPOSpec(group_key="problem_trajectory", adv_eps=0.0, singleton_advantage="zero")
    assert turn_advantages(episodes, get_workflow("voting"), zero)[0] == [[0.0] * 4] * 2


def test_voting_voters_are_distinct_trajectories_so_both_presets_agree() -> None:
    # generator0/1/2 each form a group of 8 rows with the episodes' rewards: the same
    # advantages as one row per episode.
    workflow = get_workflow("voting")
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    episodes = [
        episode("p", k, r, [turn("generator", s) for s in range(3)] + [turn("aggregator")])
        for k, r in enumerate(rewards)
    ]
    released, stats = turn_advantages(episodes, workflow, RELEASED)
    written, _ = turn_advantages(episodes, workflow, AS_WRITTEN)
    assert stats.groups == 4
    assert [v for row in released for v in row] == pytest.approx([v for row in written for v in row], rel=1e-6)


def eval_opt_episodes() -> list[Episode]:
    # Problem p, 4 episodes with 0-3 revisions: right answers accepted at once (1 generator
    # turn), wrong ones revised 3 times (4 generator + 4 evaluator turns). Problem q: the
    # other way round, the right ones revised twice.
    def rounds(n: int) -> list[Turn]:
        return [t for r in range(n) for t in (turn("generator", 0, r), turn("evaluator", 0, r))]

    return [
        episode("p", 0, 1.0, rounds(1)), episode("p", 1, 1.0, rounds(1)),
        episode("p", 2, 0.0, rounds(4)), episode("p", 3, 0.0, rounds(4)),
        episode("q", 0, 1.0, rounds(3)), episode("q", 1, 0.0, rounds(1)),
        episode("q", 2, 0.0, rounds(2)), episode("q", 3, 0.0, rounds(1)),
    ]


def generator_sums(episodes: list[Episode], advantages: list[list[float]]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for ep, row in zip(episodes, advantages):
        for t, adv in zip(ep.turns, row):
            if t.role == "generator":
                sums[ep.problem.id] = sums.get(ep.problem.id, 0.0) + adv
    return sums


def test_eval_opt_generator_advantages_sum_to_zero_per_problem_under_released() -> None:
    episodes = eval_opt_episodes()
    workflow = get_workflow("eval_opt")
    released, stats = turn_advantages(episodes, workflow, RELEASED)
    assert stats.groups == 4  # (p, generator), (p, evaluator), (q, generator), (q, evaluator)
    # Every turn is its own trajectory: p's generator group is 10 rows, rewards 1 1 0 x 8:
    # mean 0.2, std sqrt((2 * 0.64 + 8 * 0.04) / 9) = sqrt(1.6 / 9), so +0.8 / std = 1.8974
    # and -0.2 / std = -0.4743; they sum to 2 * 1.8974 - 8 * 0.4743 = 0.
    std = math.sqrt(1.6 / 9)
    assert released[0] == pytest.approx([0.8 / std] * 2, rel=1e-6)
    assert released[2][0] == pytest.approx(-0.2 / std, rel=1e-6)
    assert generator_sums(episodes, released) == pytest.approx({"p": 0.0, "q": 0.0}, abs=1e-5)
    # The episode reading gives every turn its episode's +-0.866 (p: mean 0.5, std
    # sqrt(1/3)): wrong episodes have more turns, so p's generator turns sum to
    # 2 * 0.866 - 8 * 0.866 = -5.196, the net negative push the released code did not have.
    written, _ = turn_advantages(episodes, workflow, AS_WRITTEN)
    assert generator_sums(episodes, written)["p"] == pytest.approx(-6 * 0.5 / math.sqrt(1 / 3), rel=1e-6)


def test_a_problem_whose_episodes_all_fail_the_format_gets_zero_everywhere() -> None:
    # Both presets count the all -0.1 groups as zero-variance: 3 (one per role) turn groups.
    episodes = [orch_workers_episode(k, -0.1) for k in range(4)]
    advantages, stats = turn_advantages(episodes, get_workflow("orch_workers"), RELEASED)
    assert all(v == 0.0 for row in advantages for v in row)
    assert (stats.groups, stats.zero_variance) == (3, 3)
    _, episode_stats = turn_advantages(episodes, get_workflow("orch_workers"), AS_WRITTEN)
    assert (episode_stats.groups, episode_stats.zero_variance) == (1, 1)


def test_each_roles_zero_variance_share_counts_the_groups_holding_its_turns() -> None:
    # Eval-Opt, problem p: 4 one-round episodes rewarded 1 0 1 0; problem q: 4 all 0. Released
    # (a group per problem x trajectory; one-round turns have a trajectory each): p's groups
    # vary, q's do not, so each role has 1 of 2 groups zero-variance. As written (one group per
    # problem, the episode's advantage on every turn): the same 1 of 2 for every role.
    # Problem r's one episode is a singleton group: not counted (group_advantages' rule).
    workflow = get_workflow("eval_opt")
    turns = [turn("generator"), turn("evaluator")]
    episodes = ([episode("p", k, r, turns) for k, r in enumerate([1.0, 0.0, 1.0, 0.0])]
                + [episode("q", k, 0.0, turns) for k in range(4)] + [episode("r", 0, 1.0, turns)])
    for spec in (RELEASED, AS_WRITTEN):
        _, stats = turn_advantages(episodes, workflow, spec)
        assert stats.role_zero_variance == {"generator": 0.5, "evaluator": 0.5}
    # Voting: q's generators rewarded alike but its aggregator not -> only the generator's group is flat.
    voting = get_workflow("voting")
    vote = [episode("q", k, 0.0, [turn("generator", s) for s in range(3)] + [turn("aggregator")]) for k in range(2)]
    for k, ep in enumerate(vote):
        ep.turn_rewards = [0.0, 0.0, 0.0, float(k)]
    _, stats = turn_advantages(vote, voting, RELEASED)
    assert stats.role_zero_variance == {"generator": 1.0, "aggregator": 0.0}


def test_the_reward_control_permutes_a_steps_rewards_and_keeps_their_multiset() -> None:
    rewards = [1.0, 0.0, 0.0, -0.1, 1.0, 0.0, 0.0, 0.0]
    episodes = [episode(f"p{i // 4}", i % 4, r, [turn("generator")]) for i, r in enumerate(rewards)]
    shuffle_rewards(episodes, seed=0, step=3)
    trained = [e.reward for e in episodes]
    assert sorted(trained) == sorted(rewards)
    # The scores (what accuracy reads) are untouched; only what GRPO trains on moved.
    assert [e.score.reward for e in episodes] == rewards
    # Drawn from (seed, step) alone: the same step again (a resumed run) draws the same
    # permutation; another step or seed draws another.
    def drawn(seed: int, step: int) -> list[float]:
        fresh = [episode("p", i, r, [turn("generator")]) for i, r in enumerate(rewards)]
        shuffle_rewards(fresh, seed, step)
        return [e.reward for e in fresh]

    assert drawn(0, 3) == trained
    assert len({tuple(drawn(seed, step)) for seed in range(3) for step in range(1, 6)}) > 5


def test_the_reward_control_refuses_unscored_episodes() -> None:
    unscored = Episode(Problem(id="p", question="q", answer="a"), 0, [turn("generator")])
    with pytest.raises(RuntimeError, match="after scoring"):
        shuffle_rewards([unscored], seed=0, step=1)


def test_estimators_are_registered_by_name_and_the_trainer_asks_for_grpo(monkeypatch) -> None:
    # A researcher's estimator is one decorated function: here every row gets its reward
    # minus 1, so rewards 1 and 0 give 0 and -1, whatever the groups.
    from gridrun.train import advantages

    monkeypatch.setattr(advantages, "ESTIMATORS", dict(advantages.ESTIMATORS))
    monkeypatch.setattr(advantages, "PER_TURN", set(advantages.PER_TURN))
    assert advantages.DEFAULT_ESTIMATOR == "grpo" and advantages.estimator("grpo") is advantages.grpo_estimator

    @advantages.register_estimator("minus_one")
    def minus_one(rewards, keys, spec):
        return rewards - 1.0, advantages.GroupStats(len(set(keys)), 0, 0)

    episodes = [episode("p", k, r, [turn("generator")]) for k, r in enumerate([1.0, 0.0])]
    values, stats = turn_advantages(episodes, get_workflow("single"), AS_WRITTEN, estimator_name="minus_one")
    assert values == [[0.0], [-1.0]] and stats.groups == 1
    with pytest.raises(ValueError, match="registered twice"):
        advantages.register_estimator("minus_one")(minus_one)
    with pytest.raises(ValueError, match=r"no advantage estimator 'gpro' \(registered: grpo, minus_one, per_role\)"):
        advantages.estimator("gpro")


def voting_pair(voters: list[list[float]] | None = None, aggregator: list[float] | None = None) -> list[Episode]:
    """Problem p, two Voting episodes rewarded 1 and 0 (three voters, then the aggregator);
    with `voters` / `aggregator`, each turn's own reward (reward.credit=per_role)."""
    episodes = [episode("p", k, r, [turn("generator", s) for s in range(3)] + [turn("aggregator")])
                for k, r in enumerate([1.0, 0.0])]
    if voters is not None and aggregator is not None:
        for e, own, agg in zip(episodes, voters, aggregator):
            e.turn_rewards = [*own, agg]
    return episodes


def test_per_role_pools_a_roles_slots_into_one_normalisation_per_problem() -> None:
    # Broadcast rewards 1 and 0. grpo (released): each voter slot is its own trajectory,
    # rows [1, 0]: mean 0.5, std sqrt(0.5), so +-0.5 / 0.70711 = +-0.70711. per_role (Dr.MAS,
    # the agent is the role): the generator's 6 rows [1 1 1 0 0 0] form one group, mean 0.5,
    # std sqrt(6 * 0.25 / 5) = sqrt(0.3), so +-0.5 / 0.54772 = +-0.91287. The aggregator is
    # one trajectory either way: +-0.70711.
    workflow = get_workflow("voting")
    grpo, grpo_stats = turn_advantages(voting_pair(), workflow, RELEASED)
    per_role, stats = turn_advantages(voting_pair(), workflow, RELEASED, estimator_name="per_role")
    assert grpo == [pytest.approx([0.70711] * 4, rel=1e-4), pytest.approx([-0.70711] * 4, rel=1e-4)]
    assert per_role == [pytest.approx([0.91287] * 3 + [0.70711], rel=1e-4),
                        pytest.approx([-0.91287] * 3 + [-0.70711], rel=1e-4)]
    assert (grpo_stats.groups, stats.groups) == (4, 2)
    # The config key chooses it (the trainer passes no name).
    chosen, _ = turn_advantages(voting_pair(), workflow, GRPOSpec(group_key="problem_trajectory", adv_eps=0.0,
                                                                   estimator="per_role"))
    assert chosen == per_role


def test_per_role_on_each_turns_own_reward() -> None:
    # Turn rewards (as reward.credit=per_role gives them): voters [1 0 1] and [0 0 1],
    # aggregator 1 and 0. per_role: generator rows 1 0 1 0 0 1, mean 0.5, std sqrt(0.3):
    # +-0.91287; aggregator +-0.70711. grpo (released): generator0 [1, 0] +-0.70711,
    # generator1 [0, 0] and generator2 [1, 1] zero-variance groups (advantage 0, counted).
    voters, aggregator = [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], [1.0, 0.0]
    workflow = get_workflow("voting")
    per_role, _ = turn_advantages(voting_pair(voters, aggregator), workflow, RELEASED, estimator_name="per_role")
    a, b = 0.5 / math.sqrt(0.3), 0.5 / math.sqrt(0.5)
    assert per_role == [pytest.approx([a, -a, a, b], rel=1e-5), pytest.approx([-a, -a, a, -b], rel=1e-5)]
    grpo, stats = turn_advantages(voting_pair(voters, aggregator), workflow, RELEASED)
    assert grpo == [pytest.approx([b, 0.0, 0.0, b], rel=1e-5), pytest.approx([-b, 0.0, 0.0, -b], rel=1e-5)]
    assert (stats.groups, stats.zero_variance) == (4, 2)
    # Under group_key=problem the turns are rows too (each has its own reward), in one
    # problem group: 8 rows 1 0 1 1 | 0 0 1 0, mean 0.5, std sqrt(8 * 0.25 / 7).
    written, stats = turn_advantages(voting_pair(voters, aggregator), workflow, AS_WRITTEN)
    c = 0.5 / math.sqrt(2 / 7)
    assert written == [pytest.approx([c, -c, c, c], rel=1e-5), pytest.approx([-c, -c, c, -c], rel=1e-5)]
    assert stats.groups == 1


def test_per_role_under_as_written_replaces_the_problem_wide_baseline_by_each_roles() -> None:
    # Eval-Opt's released groups are already per role (every turn is a trajectory named after
    # it), so per_role under group_key=problem gives exactly the released numbers (p's
    # generator rows 1 1 0 x 8: +0.8 / sqrt(1.6 / 9)), where grpo gives every turn its
    # episode's +-0.866.
    episodes = eval_opt_episodes()
    workflow = get_workflow("eval_opt")
    released, _ = turn_advantages(episodes, workflow, RELEASED)
    per_role, stats = turn_advantages(episodes, workflow, AS_WRITTEN, estimator_name="per_role")
    assert per_role == [pytest.approx(row, rel=1e-6) for row in released]
    assert per_role[0][0] == pytest.approx(0.8 / math.sqrt(1.6 / 9), rel=1e-6) and stats.groups == 4


def test_a_researchers_estimator_is_named_module_colon_name(tmp_path, monkeypatch) -> None:
    from gridrun.seam.registry import ConfigError
    from gridrun.train import advantages

    monkeypatch.setattr(advantages, "ESTIMATORS", dict(advantages.ESTIMATORS))
    (tmp_path / "my_estimators.py").write_text(
        "from gridrun.train.advantages import GroupStats, register_estimator\n\n"
        "@register_estimator('centred')\n"
        "def centred(rewards, rows, spec):\n"
        "    return rewards - rewards.mean(), GroupStats(1, 0, 0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    values, _ = turn_advantages(voting_pair(), get_workflow("voting"), RELEASED, estimator_name="my_estimators:centred")
    assert values == [[0.5] * 4, [-0.5] * 4]
    with pytest.raises(ConfigError, match="grpo.estimator='no_such_module:x': plugin 'no_such_module' cannot be imported"):
        advantages.estimator("no_such_module:x")
    with pytest.raises(ConfigError, match=r"no advantage estimator 'centre' \(registered: centred, grpo, per_role\)"):
        advantages.estimator("my_estimators:centre")


def test_the_plan_knows_the_built_in_estimators_and_losses_without_torch() -> None:
    from gridrun.seam.runconfig import BUILT_IN_ESTIMATORS, BUILT_IN_POLICY_LOSSES
    from gridrun.train import advantages, losses

    assert set(BUILT_IN_ESTIMATORS) == {n for n, f in advantages.ESTIMATORS.items()
                                        if f.__module__ == advantages.__name__}
    assert set(BUILT_IN_POLICY_LOSSES) == {n for n, f in losses._POLICY_LOSSES.items() if f.__module__ == losses.__name__}


@pytest.mark.parametrize(("returned", "message"), [
    (lambda r: r[:-1], r"returned a tensor of shape \[3\] for 4 rows"),
    (lambda r: r.unsqueeze(1), r"returned a tensor of shape \[4, 1\] for 4 rows"),
    (lambda r: r.tolist(), r"returned list for 4 rows"),
    (lambda r: r * float("nan"), r"returned a non-finite advantage"),
])
def test_an_estimator_breaking_its_contract_is_named(monkeypatch: pytest.MonkeyPatch, returned: Any,
                                                     message: str) -> None:
    # A wrong-length result would train each turn on another's advantage, silently.
    from gridrun.seam.registry import ConfigError
    from gridrun.train import advantages
    monkeypatch.setattr(advantages, "ESTIMATORS", dict(advantages.ESTIMATORS))

    @advantages.register_estimator("broken")
    def broken(rewards, keys, spec):
        return returned(rewards - rewards.mean()), advantages.GroupStats(1, 0, 0)

    episodes = [episode("p", k, r, [turn("generator")]) for k, r in enumerate([1.0, 0.0, 1.0, 0.0])]
    with pytest.raises(ConfigError, match=rf"grpo.estimator 'broken' {message}"):
        turn_advantages(episodes, get_workflow("single"), AS_WRITTEN, estimator_name="broken")
