"""Synthetic supervised transcripts for every role of every workflow on `task=arith`.

Each example is (messages, response) built from the very prompts the workflows send
(`ArithPrompts`), in the output shape each role is expected to keep. Mistakes are made on
purpose (wrong sums, miscomputed checks, wrong picks, repeated strategies) so that the warm
start yields a model with real but imperfect skill in every role: RL has room to improve it,
and role drift has a shape to drift from.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from gridrun.tasks.arith import ArithPrompts
from gridrun.tasks.base import Messages, Problem

STRATEGIES = ("tens then ones", "ones then tens", "direct sum")

# Share of each role in the warm-start mixture. The warm start stops when the generator
# reaches its target, so the other roles get enough share to be usable by then (workers
# and revisions practise the same sums, which also feeds the generator's skill).
ROLE_MIX: dict[str, float] = {
    "generator": 0.32,
    "revision": 0.10,
    "evaluator": 0.12,
    "aggregator": 0.08,
    "orchestrator": 0.06,
    "worker": 0.22,
    "synthesizer": 0.10,
}
# Share of evaluator and revision examples shown the whole conversation so far (Eval-Opt's
# released protocol, protocol.eval_opt_context=full) instead of the latest answer alone.
P_FULL_CONTEXT = 0.5
# Deliberate mistake rates.
P_WRONG_SUM = 0.15
P_WRONG_CHECK = 0.10
P_WRONG_PICK = 0.10
P_REPEATED_STRATEGY = 0.10

Example = tuple[Messages, str]
_PROMPTS = ArithPrompts()


def _operands(problem: Problem) -> tuple[int, int]:
    a, b = problem.question.split(" + ")
    return int(a), int(b)


def _maybe_wrong(total: int, rng: random.Random, p: float = P_WRONG_SUM) -> int:
    if rng.random() >= p:
        return total
    return total + rng.choice((-10, -1, 1, 10))


def solution(a: int, b: int, rng: random.Random) -> str:
    s = _maybe_wrong(a + b, rng)
    return f"{a} + {b} = {s}. \\boxed{{{s}}}"


def worker_solution(a: int, b: int, strategy: str, rng: random.Random) -> str:
    s = _maybe_wrong(a + b, rng)
    ta, oa, tb, ob = a // 10 * 10, a % 10, b // 10 * 10, b % 10
    if strategy == "tens then ones":
        steps = f"{ta} + {tb} = {ta + tb}. {oa} + {ob} = {oa + ob}. {ta + tb} + {oa + ob} = {s}."
    elif strategy == "ones then tens":
        steps = f"{oa} + {ob} = {oa + ob}. {ta} + {tb} = {ta + tb}. {oa + ob} + {ta + tb} = {s}."
    else:
        steps = f"{a} + {b} = {s}."
    return f"{steps} \\boxed{{{s}}}"


def _answer_of(text: str) -> int:
    return int(text.rsplit("\\boxed{", 1)[1].rstrip("}"))


def _candidates(a: int, b: int, rng: random.Random, n: int = 3) -> list[str]:
    # Candidates are wrong more often than the generator so that selection matters.
    return [f"{a} + {b} = {s}. \\boxed{{{s}}}" for s in (_maybe_wrong(a + b, rng, 0.4) for _ in range(n))]


def _majority_index(answers: list[int]) -> int:
    counts = {x: answers.count(x) for x in answers}
    best = max(counts.values())
    return next(i for i, x in enumerate(answers) if counts[x] == best)


def generator_example(problem: Problem, rng: random.Random) -> Example:
    a, b = _operands(problem)
    return _PROMPTS.generator(problem.question), solution(a, b, rng)


def evaluator_response(a: int, b: int, proposed: int, rng: random.Random) -> str:
    computed = _maybe_wrong(a + b, rng, P_WRONG_CHECK)
    if computed == proposed:
        return f"{a} + {b} = {computed}. \\boxed{{Correct}}"
    return f"{a} + {b} = {computed}, not {proposed}. \\boxed{{Incorrect}}"


def _said(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _rejected_rounds(problem: Problem, rng: random.Random, rounds: int) -> Messages:
    """The conversation of Eval-Opt under the full context after `rounds` rejected answers:
    the generator's prompt, then each wrong answer and the critique that rejected it."""
    a, b = _operands(problem)
    history = _PROMPTS.generator(problem.question)
    for _ in range(rounds):
        wrong = _maybe_wrong(a + b, rng, 1.0)
        history = history + [_said(f"{a} + {b} = {wrong}. \\boxed{{{wrong}}}"),
                             _said(f"{a} + {b} = {a + b}, not {wrong}. \\boxed{{Incorrect}}")]
    return history


def evaluator_example(problem: Problem, rng: random.Random) -> Example:
    a, b = _operands(problem)
    # Half the judged solutions are wrong, so a constant verdict is only 50% right.
    proposed = a + b if rng.random() < 0.5 else _maybe_wrong(a + b, rng, 1.0)
    shown = f"{a} + {b} = {proposed}. \\boxed{{{proposed}}}"
    if rng.random() < P_FULL_CONTEXT:
        # The 1st to 3rd judged answer, after the rounds that rejected the earlier ones.
        history = _rejected_rounds(problem, rng, rng.randrange(3)) + [_said(shown)]
        prompt = history + _PROMPTS.evaluator_followup(problem.question, shown)
    else:
        prompt = _PROMPTS.evaluator(problem.question, shown)
    return prompt, evaluator_response(a, b, proposed, rng)


def revision_example(problem: Problem, rng: random.Random) -> Example:
    a, b = _operands(problem)
    wrong = _maybe_wrong(a + b, rng, 1.0)
    previous = f"{a} + {b} = {wrong}. \\boxed{{{wrong}}}"
    critique = f"{a} + {b} = {a + b}, not {wrong}. \\boxed{{Incorrect}}"
    if rng.random() < P_FULL_CONTEXT:
        history = _rejected_rounds(problem, rng, rng.randrange(2)) + [_said(previous), _said(critique)]
        prompt = history + _PROMPTS.revision_followup(problem.question, previous, critique)
    else:
        prompt = _PROMPTS.revision(problem.question, previous, critique)
    return prompt, solution(a, b, rng)


def aggregator_example(problem: Problem, rng: random.Random) -> Example:
    a, b = _operands(problem)
    candidates = _candidates(a, b, rng)
    answers = [_answer_of(c) for c in candidates]
    pick = answers.index(a + b) if a + b in answers else _majority_index(answers)
    if rng.random() < P_WRONG_PICK:
        pick = rng.randrange(len(candidates))
    return _PROMPTS.aggregator(problem.question, candidates), f"\\boxed{{{pick + 1}}}"


def orchestrator_example(problem: Problem, rng: random.Random) -> Example:
    chosen = rng.sample(STRATEGIES, 3)
    if rng.random() < P_REPEATED_STRATEGY:
        chosen[2] = chosen[0]
    plan = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(chosen))
    return _PROMPTS.orchestrator(problem.question, 3), plan


def worker_example(problem: Problem, rng: random.Random) -> Example:
    a, b = _operands(problem)
    strategy = rng.choice(STRATEGIES + ("any method",))
    return _PROMPTS.worker(problem.question, strategy), worker_solution(a, b, strategy, rng)


def synthesizer_example(problem: Problem, rng: random.Random) -> Example:
    a, b = _operands(problem)
    solutions = [worker_solution(a, b, s, rng) for s in rng.sample(STRATEGIES, 3)]
    answers = [_answer_of(s) for s in solutions]
    final = answers[_majority_index(answers)]
    if rng.random() < P_WRONG_PICK:
        final = rng.choice(answers)
    listed = ", ".join(str(x) for x in answers)
    return _PROMPTS.synthesizer(problem.question, solutions), f"Answers: {listed}. \\boxed{{{final}}}"


BUILDERS: dict[str, Callable[[Problem, random.Random], Example]] = {
    "generator": generator_example,
    "revision": revision_example,
    "evaluator": evaluator_example,
    "aggregator": aggregator_example,
    "orchestrator": orchestrator_example,
    "worker": worker_example,
    "synthesizer": synthesizer_example,
}


def sample_examples(problems: list[Problem], n: int, rng: random.Random) -> list[Example]:
    roles = rng.choices(list(ROLE_MIX), weights=list(ROLE_MIX.values()), k=n)
    return [BUILDERS[role](rng.choice(problems), rng) for role in roles]
