"""Each workflow end to end with a scripted llm: the turns recorded and the answer committed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gridrun.seam.registry import workflow as get_workflow
from gridrun.seam.runconfig import ProtocolSpec
from gridrun.tasks.arith import ArithTask
from gridrun.tasks.base import Problem
from gridrun.train.episode import Episode
from gridrun.workflows.eval_opt import EvalOptParams
from gridrun.workflows.orch_workers import OrchWorkersParams
from gridrun.workflows.single import SingleParams
from gridrun.workflows.voting import VotingParams
from tests.fakes import run_scripted

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK = ArithTask(n_train=10, n_val=10)
PROBLEM = Problem(id="p", question="37 + 48", answer="85")
# The schema's defaults are the released protocol; LATEST is gridrun's reading before it.
RELEASED = ProtocolSpec()
LATEST = ProtocolSpec(eval_opt_context="latest", aggregator_parse="last_box", verdict_box="last", orch_workers="fixed")


def episode() -> Episode:
    return Episode(problem=PROBLEM, sample=0)


def test_single_commits_to_generator_answer() -> None:
    ep = episode()
    run_scripted(get_workflow("single"), TASK, SingleParams(), ep, lambda *a: "37 + 48 = 85. \\boxed{85}")
    assert [t.role for t in ep.turns] == ["generator"]
    assert ep.turns[0].parsed == "85"
    assert ep.final_response == "37 + 48 = 85. \\boxed{85}"


def test_eval_opt_revises_until_accepted() -> None:
    # Round 0 wrong and rejected, round 1 right and accepted: 4 turns, final = round-1 answer.
    answers = {0: "37 + 48 = 84. \\boxed{84}", 1: "37 + 48 = 85. \\boxed{85}"}
    verdicts = {0: "85, not 84. \\boxed{Incorrect}", 1: "\\boxed{Correct}"}

    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        return answers[round_] if role == "generator" else verdicts[round_]

    ep = episode()
    run_scripted(get_workflow("eval_opt"), TASK, EvalOptParams(rounds=3), ep, reply, LATEST)
    assert [(t.role, t.round) for t in ep.turns] == [
        ("generator", 0), ("evaluator", 0), ("generator", 1), ("evaluator", 1)
    ]
    assert ep.info["verdicts"] == [False, True]
    assert ep.final_response == answers[1]
    # The revision prompt carries the previous attempt and the critique; the evaluator sees
    # (question, latest answer) only.
    revision = ep.turns[2].messages
    assert revision[1]["content"] == answers[0] and verdicts[0] in revision[2]["content"]
    assert ep.turns[3].messages == TASK.prompts.evaluator(PROBLEM.question, answers[1])


def test_eval_opt_released_context_is_every_earlier_turn() -> None:
    # An always-rejecting evaluator, 3 rounds: g0 e0 g1 e1 g2 e2. Under the released context
    # the conversation is the generator's first prompt, then every model turn so far as an
    # assistant message (the instructions between them are not kept), then the role's
    # instruction: the last evaluator sees 1 + 5 + 1 messages, g0 e0 g1 e1 g2 in order.
    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        return f"37 + 48 = {83 + round_}. \\boxed{{{83 + round_}}}" if role == "generator" else f"no ({round_}) \\boxed{{Incorrect}}"

    ep = episode()
    run_scripted(get_workflow("eval_opt"), TASK, EvalOptParams(rounds=3), ep, reply, RELEASED)
    texts = [t.text for t in ep.turns]
    assert [(t.role, t.round) for t in ep.turns] == [(r, k) for k in range(3) for r in ("generator", "evaluator")]
    first = TASK.prompts.generator(PROBLEM.question)
    said = [{"role": "assistant", "content": text} for text in texts]
    last_evaluator = ep.turns[5].messages
    assert last_evaluator == first + said[:5] + TASK.prompts.evaluator_followup(PROBLEM.question, texts[4])
    assert len(last_evaluator) == 7
    # The second revision sees g0 e0 g1 e1, then the instruction carrying the last critique.
    assert ep.turns[4].messages == first + said[:4] + [{"role": "user", "content": f"Feedback: {texts[3]}\nSolve again."}]
    # The first evaluator: the question (in the generator's prompt) and the first answer.
    assert ep.turns[1].messages == first + said[:1] + TASK.prompts.evaluator_followup(PROBLEM.question, texts[0])
    assert ep.info["verdicts"] == [False] * 3 and ep.final_response == texts[4]


def test_verdict_rate_is_the_verdict_tag_under_both_protocols() -> None:
    # Round 0's review ends on a number after its verdict: the last-box protocol reads no
    # verdict (so it revises) but the tag is there and counts; round 1's has none. Rate: 1 of
    # 1 review (released accepts at once), 1 of 2 (last box). Accuracy scores the verdicts
    # acted on: released accepted a wrong 84 (0 of 1); last box read None twice (0 of 2).
    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        if role == "generator":
            return f"\\boxed{{{84 + round_}}}"
        return "\\boxed{Correct}, it is \\boxed{84}" if round_ == 0 else "fine"

    for protocol, judged in ((RELEASED, 1), (LATEST, 2)):
        ep = episode()
        run_scripted(get_workflow("eval_opt"), TASK, EvalOptParams(rounds=2), ep, reply, protocol)
        metrics = get_workflow("eval_opt").metrics([ep], lambda turn: turn.parsed == "85", EvalOptParams())
        assert len(ep.role_turns("evaluator")) == judged
        assert metrics["role/evaluator/verdict_rate"] == 1 / judged
        assert metrics["role/evaluator/verdict_acc"] == 0.0


@pytest.mark.parametrize(("protocol", "verdicts", "turns"), [(RELEASED, [True], 2), (LATEST, [False, True], 4)])
def test_eval_opt_verdict_from_the_first_or_last_box(protocol: ProtocolSpec, verdicts: list, turns: int) -> None:
    # The evaluator accepts, then changes its mind in the same turn: the released code reads
    # the first box (accepted: 2 turns), gridrun's last-box reading rejects and revises.
    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        if role == "generator":
            return "\\boxed{85}"
        return "\\boxed{Correct}. Hmm, re-adding: \\boxed{Incorrect}" if round_ == 0 else "\\boxed{Correct}"

    ep = episode()
    run_scripted(get_workflow("eval_opt"), TASK, EvalOptParams(rounds=3), ep, reply, protocol)
    assert ep.info["verdicts"] == verdicts and len(ep.turns) == turns


def test_eval_opt_malformed_verdicts_use_every_round_and_every_answer_is_judged() -> None:
    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        return f"\\boxed{{{80 + round_}}}" if role == "generator" else "looks fine to me"

    ep = episode()
    run_scripted(get_workflow("eval_opt"), TASK, EvalOptParams(rounds=2), ep, reply)
    # rounds=2: two generator turns, each judged; a malformed verdict is no acceptance.
    assert [(t.role, t.round) for t in ep.turns] == [
        ("generator", 0), ("evaluator", 0), ("generator", 1), ("evaluator", 1)
    ]
    assert ep.info["verdicts"] == [None, None]
    assert ep.turns[-2].parsed == "81"
    assert ep.final_response == "\\boxed{81}"


@pytest.mark.parametrize(("task", "generator_turns"), [("math", 3), ("code", 2)])
def test_eval_opt_always_rejected_makes_the_released_turn_counts(task: str, generator_turns: int) -> None:
    # The released loop (max_iterations 3 on math, 2 on code) under an evaluator that always
    # rejects: 3 + 3 turns on math, 2 + 2 on code. The rounds come from the shipped conf.
    table = yaml.safe_load((REPO_ROOT / "gridrun" / "conf" / "tables.yaml").read_text())["workflow_task"]
    rounds = table["eval_opt"][task]["rounds"]

    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        return "\\boxed{85}" if role == "generator" else "\\boxed{Incorrect}"

    ep = episode()
    run_scripted(get_workflow("eval_opt"), TASK, EvalOptParams(rounds=rounds), ep, reply)
    roles = [t.role for t in ep.turns]
    assert (roles.count("generator"), roles.count("evaluator")) == (generator_turns, generator_turns)
    assert roles == ["generator", "evaluator"] * generator_turns
    assert ep.info["verdicts"] == [False] * generator_turns


@pytest.mark.parametrize(
    "selection, protocol, expected_final",
    [
        ("\\boxed{2}", LATEST, "second \\boxed{85}"),
        ("\\boxed{7}", LATEST, None),
        ("candidate two", LATEST, None),
        # Released: the first box; a box naming no candidate falls to the first lone digit;
        # with neither, candidate 1.
        ("\\boxed{2} or \\boxed{3}", RELEASED, "second \\boxed{85}"),
        ("number 3 it is: \\boxed{7}", RELEASED, "third \\boxed{86}"),
        ("candidate two", RELEASED, "first \\boxed{84}"),
    ],
)
def test_voting_commits_to_the_selected_candidate(selection: str, protocol: ProtocolSpec, expected_final: str | None) -> None:
    texts = ["first \\boxed{84}", "second \\boxed{85}", "third \\boxed{86}"]

    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        return texts[slot] if role == "generator" else selection

    ep = episode()
    llm = run_scripted(get_workflow("voting"), TASK, VotingParams(), ep, reply, protocol)
    assert [(t.role, t.slot) for t in ep.turns] == [
        ("generator", 0), ("generator", 1), ("generator", 2), ("aggregator", 0)
    ]
    assert ep.info["candidate_answers"] == ["84", "85", "86"]
    assert ep.final_response == expected_final
    # The aggregator saw every candidate.
    assert all(t in ep.turns[3].messages[0]["content"] for t in texts)
    assert llm.calls[-1][0] == "aggregator"
    # A selection naming no candidate commits to nothing: the format penalty, not a score.
    if expected_final is None:
        assert TASK.score(ep.final_response, PROBLEM).reward == TASK.format_penalty


def test_orch_workers_fills_missing_strategies() -> None:
    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        return {
            "orchestrator": "1. tens then ones\n2. direct sum",
            "worker": f"\\boxed{{{85 if slot else 84}}}",
            "synthesizer": "Answers: 84, 85, 85. \\boxed{85}",
        }[role]

    ep = episode()
    run_scripted(get_workflow("orch_workers"), TASK, OrchWorkersParams(), ep, reply, LATEST)
    assert [(t.role, t.slot) for t in ep.turns] == [
        ("orchestrator", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("synthesizer", 0)
    ]
    assert ep.info["strategies"] == ["tens then ones", "direct sum"]
    assert ep.info["missing_strategies"] == 1
    assert "Method: direct sum" in ep.turns[2].messages[0]["content"]
    assert "Method: any method" in ep.turns[3].messages[0]["content"]
    assert ep.info["worker_answers"] == ["84", "85", "85"]
    assert TASK.score(ep.final_response, PROBLEM).correct


def test_aggregator_shape_metrics_ignore_the_released_fallbacks() -> None:
    # The released parse commits "candidate two" to candidate 1, but the shape the aggregator
    # is asked for (a box naming a candidate) is missing: select and terse rates count 1 of 2,
    # as under the last-box protocol; select_acc reads the picks committed to (2nd: right; 1st: wrong).
    texts = ["first \\boxed{84}", "second \\boxed{85}", "third \\boxed{86}"]
    episodes = []
    for selection in ("\\boxed{2}", "candidate two"):
        ep = episode()
        run_scripted(get_workflow("voting"), TASK, VotingParams(), ep,
                     lambda role, slot, r, m, sel=selection: texts[slot] if role == "generator" else sel, RELEASED)
        episodes.append(ep)
    assert [e.info["selected"] for e in episodes] == [1, 0]
    metrics = get_workflow("voting").metrics(episodes, lambda turn: turn.parsed == "85", VotingParams())
    assert metrics == {"role/aggregator/select_rate": 0.5, "role/aggregator/terse_rate": 0.5,
                       "role/aggregator/select_acc": 0.5}


@pytest.mark.parametrize(
    ("plan", "strategies"),
    [
        ("1. tens then ones", ["tens then ones"]),
        ("1. tens then ones\n2. direct sum", ["tens then ones", "direct sum"]),
        ("1. tens then ones\n2. direct sum\n3. ones then tens\n4. guess", ["tens then ones", "direct sum", "ones then tens"]),
        # No numbered line: the released parser's lines of more than 10 characters stand in.
        ("add the tens first\nok", ["add the tens first"]),
    ],
)
def test_orch_workers_runs_one_worker_per_strategy_given(plan: str, strategies: list[str]) -> None:
    def reply(role: str, slot: int, round_: int, messages: list) -> str:
        return {"orchestrator": plan, "worker": f"\\boxed{{{84 + slot}}}", "synthesizer": "\\boxed{85}"}[role]

    n = len(strategies)
    ep = episode()
    run_scripted(get_workflow("orch_workers"), TASK, OrchWorkersParams(), ep, reply, RELEASED)
    assert [(t.role, t.slot) for t in ep.turns] == (
        [("orchestrator", 0)] + [("worker", k) for k in range(n)] + [("synthesizer", 0)])
    assert [t.messages[0]["content"].split("Method: ")[1] for t in ep.turns[1:-1]] == strategies
    assert (ep.info["workers"], ep.info["missing_strategies"]) == (n, 3 - len(ep.turns[0].parsed))
    # The synthesizer compares exactly the workers that ran.
    assert ep.turns[-1].messages == TASK.prompts.synthesizer(PROBLEM.question, [t.text for t in ep.turns[1:-1]])
    # fixed: always 3 workers, whatever the plan.
    fixed = episode()
    run_scripted(get_workflow("orch_workers"), TASK, OrchWorkersParams(), fixed, reply, LATEST)
    assert fixed.info["workers"] == 3 and [t.role for t in fixed.turns].count("worker") == 3


def test_unknown_workflow_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown workflow 'votng' \(did you mean 'voting'\?\)"):
        get_workflow("votng")
