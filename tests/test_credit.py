"""reward.credit=per_role on hand-made episodes: each workflow's per-role rewards, scored by
the real arith task (answer 85; a wrong box 0, no box the format penalty -0.1)."""

from __future__ import annotations

import pytest

from gridrun.seam.registry import workflow as get_workflow
from gridrun.tasks.arith import ArithTask
from gridrun.tasks.base import Problem
from gridrun.train.credit import assign_credit, role_reward_metrics
from gridrun.train.episode import Episode, Turn

TASK = ArithTask(n_train=1, n_val=1, format_penalty=-0.1)
RIGHT, WRONG, NO_BOX = "so \\boxed{85}", "so \\boxed{84}", "I am not sure"


def turn(role: str, text: str, parsed: object = None, slot: int = 0, round_: int = 0) -> Turn:
    return Turn(role, slot, round_, [], [1], [2], [-0.5], text, "stop", parsed)


def scored(turns: list[Turn], final: str | None, sample: int = 0) -> Episode:
    episode = Episode(Problem(id="p", question="37 + 48", answer="85"), sample, turns, final_response=final)
    episode.score = TASK.score(final, episode.problem)
    return episode


def credited(workflow: str, episodes: list[Episode]) -> list[list[float]]:
    assign_credit(episodes, TASK, get_workflow(workflow))
    return [e.rewards_of_turns() for e in episodes]


def test_voting_voters_earn_their_own_answer_and_the_aggregator_its_pick() -> None:
    # 1: voters right, wrong, unboxed; the aggregator picks the right one (best available: 1).
    # 2: the same candidates, the aggregator picks the wrong one (a right one existed: 0).
    # 3: every voter wrong; the aggregator picks one: as good as any available, 1.
    # 4: the aggregator commits to none: the episode's reward (the task's penalty, -0.1).
    voters = [turn("generator", t, slot=k) for k, t in enumerate((RIGHT, WRONG, NO_BOX))]
    wrong_voters = [turn("generator", WRONG, slot=k) for k in range(3)]
    episodes = [
        scored([*voters, turn("aggregator", "\\boxed{1}", 0)], RIGHT),
        scored([*voters, turn("aggregator", "\\boxed{2}", 1)], WRONG, 1),
        scored([*wrong_voters, turn("aggregator", "\\boxed{3}", 2)], WRONG, 2),
        scored([*voters, turn("aggregator", "none", None)], None, 3),
    ]
    assert credited("voting", episodes) == [
        [1.0, 0.0, -0.1, 1.0], [1.0, 0.0, -0.1, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, -0.1, -0.1]]
    # Broadcast would have given the aggregator 1, 0, 0, -0.1: episode 3's pick is not its fault.
    assert [e.reward for e in episodes] == [1.0, 0.0, 0.0, -0.1]


def test_eval_opt_evaluators_earn_a_right_verdict() -> None:
    # Round 0: a wrong answer judged Incorrect (right verdict: 1); round 1: the revised right
    # answer judged Correct (1). Then an episode whose evaluator accepts a wrong answer (0)
    # and one whose evaluator gives no verdict on a right answer (0), each generator its own.
    episodes = [
        scored([turn("generator", WRONG), turn("evaluator", "\\boxed{Incorrect}", False),
                turn("generator", RIGHT, round_=1), turn("evaluator", "\\boxed{Correct}", True, round_=1)], RIGHT),
        scored([turn("generator", WRONG), turn("evaluator", "\\boxed{Correct}", True)], WRONG, 1),
        scored([turn("generator", RIGHT), turn("evaluator", "looks fine", None)], RIGHT, 2),
    ]
    # Broadcast gives the first episode's wrong first answer 1 as well; per_role gives it 0.
    assert credited("eval_opt", episodes) == [[0.0, 1.0, 1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]


def test_orch_workers_workers_earn_their_own_answer() -> None:
    turns = [turn("orchestrator", "1. add\n2. count\n3. guess"),
             *(turn("worker", t, slot=k) for k, t in enumerate((RIGHT, NO_BOX, WRONG))),
             turn("synthesizer", WRONG)]
    (episode,) = [scored(turns, WRONG)]
    # The orchestrator keeps the episode's outcome (0); the synthesizer's own is the final one.
    assert credited("orch_workers", [episode]) == [[0.0, 1.0, -0.1, 0.0, 0.0]]
    # Each role's training reward is its own metric (the mean over the role's turns).
    assert role_reward_metrics([episode]) == {
        "role/orchestrator/reward": 0.0, "role/worker/reward": pytest.approx(0.3), "role/synthesizer/reward": 0.0}


def test_broadcast_role_rewards_are_the_episodes() -> None:
    episodes = [scored([turn("generator", RIGHT, slot=k) for k in range(3)] + [turn("aggregator", "\\boxed{1}", 0)], RIGHT),
                scored([turn("generator", WRONG, slot=k) for k in range(3)] + [turn("aggregator", "\\boxed{1}", 0)], WRONG, 1)]
    assert role_reward_metrics(episodes) == {"role/generator/reward": 0.5, "role/aggregator/reward": 0.5}
    assert [e.turn_rewards for e in episodes] == [None, None]


@pytest.mark.usefixtures("toy_world")
def test_a_per_role_credit_cell_with_per_role_advantages_trains_and_logs_each_roles_reward(tmp_path) -> None:
    from gridrun.cellrun import run_cell
    from gridrun.seam.rundir import RunDir
    from tests.conftest import make_cell

    cell = make_cell(tmp_path, workflow={"name": "voting"}, policy={"name": "isolated"},
                     reward={"credit": "per_role"}, grpo={"estimator": "per_role"})
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    train = [r for r in RunDir(cell).read_metrics() if r["split"] == "train"]
    assert all({"role/generator/reward", "role/aggregator/reward"} <= set(row) for row in train)
    # The aggregator's reward is 0 or 1 per turn, so its mean is in [0, 1].
    assert all(0.0 <= row["role/aggregator/reward"] <= 1.0 for row in train)
