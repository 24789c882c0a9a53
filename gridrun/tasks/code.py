"""`task=code`: DeepCoder's PrimeIntellect problems, scored by running the last fenced Python block.

Data comes from `gridrun data prepare code` (gridrun/tasks/data.py, format in
gridrun/tasks/prepared.py). The reward is `gridrun.tasks.code_reward`: the program runs in the
sandbox against the problem's stdin/stdout or function-call tests, and the reward is the
fraction passed (`mode="pass_rate"`, the paper) or 1 only if all pass (`mode="all_pass"`, its
released code). `Score.correct` always means every test passed, whatever the mode, so accuracy
is comparable between modes; `Score.flag` names the dominant failure otherwise.

Prompts are our own wording, written for Qwen3 with thinking disabled. Each role is told its
output shape, because the drift signatures measure departures from exactly these shapes: the
evaluator writes a short critique without code and ends with `\\boxed{Correct}` or
`\\boxed{Incorrect}`, the aggregator answers `\\boxed{k}`, the orchestrator numbered strategies,
and generator, workers and synthesizer one fenced python block.

Function-call problems: the statement alone may not say which function the tests call, so
the problem's question gets one sentence naming it (`interface_note`) when the task is loaded.

Model-written programs run only in a working sandbox: the task refuses to load without one
(``SandboxUnavailable``, one line naming the fix) unless ``sandbox="none"`` (config
``task.sandbox=none``) opts out by name, which is logged loudly (and recorded in the cell's
config.yaml; ``score_code`` flags each such result ``unsandboxed``).

Left out: a format penalty (a response without code scores 0, flag `no_code`), partial credit
for programs that time out, and other languages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gridrun import registry
from gridrun.registry import TaskParams, register_task
from gridrun.tasks.answers import last_python_block
from gridrun.tasks.base import Messages, Problem, RolePrompts, Score, Task, user_message
from gridrun.tasks.code_reward import FLAG_NAMES, CodeLimits, CodeScore, Mode, score_code, score_code_batch
from gridrun.tasks.prepared import read_split, require_data
from gridrun.tasks.sandbox import SandboxConfig, SandboxUnavailable, require

MODES = ("pass_rate", "all_pass")
# Per-test failure flags, in the order that breaks ties when two are equally frequent.
_TEST_FAILURES = tuple(f for f in FLAG_NAMES if f not in ("no_code", "syntax_error", "skipped", "unsandboxed"))

_PROGRAM_SHAPE = (
    "Unless the problem asks for a specific function, the program reads the input from standard input "
    "and prints the answer to standard output. Give the complete program in one fenced ```python block."
)


def interface_note(tests: Sequence[dict[str, Any]]) -> str:
    """The sentence telling the model which function the tests call; empty for stdin problems."""
    names = {t["fn_name"] for t in tests if t.get("fn_name")}
    if len(names) != 1:
        return ""
    (name,) = names
    return (f"Implement the function `{name}` (at top level, or as a method of `class Solution`). "
            "The tests call it with their arguments and check the value it returns; it should not read input.")


class CodePrompts(RolePrompts):
    def generator(self, question: str) -> Messages:
        return user_message(f"{question}\n\nWrite a Python 3 program that solves this problem. {_PROGRAM_SHAPE}")

    def revision(self, question: str, previous: str, critique: str) -> Messages:
        return self.generator(question) + [
            {"role": "assistant", "content": previous},
            {
                "role": "user",
                "content": f"A reviewer checked your program:\n\n{critique}\n\n"
                "Fix what is wrong (or keep what is right) and give the complete program again "
                "in one fenced ```python block.",
            },
        ]

    def evaluator(self, question: str, solution: str) -> Messages:
        return user_message(
            f"Problem:\n{question}\n\nProposed program:\n{solution}\n\n"
            "Review this program: does it give the right output for every valid input, fast enough? "
            "In a few sentences, point out the first bug if there is one. Do not write code. "
            "End with exactly \\boxed{Correct} or \\boxed{Incorrect}."
        )

    def aggregator(self, question: str, candidates: list[str]) -> Messages:
        listed = "\n\n".join(f"### Candidate {i + 1}\n{c}" for i, c in enumerate(candidates))
        return user_message(
            f"Problem:\n{question}\n\n{listed}\n\n"
            "Which candidate's program solves the problem correctly? Reply only with its number as "
            f"\\boxed{{k}} (k from 1 to {len(candidates)})."
        )

    def orchestrator(self, question: str, n_strategies: int) -> Messages:
        return user_message(
            f"Problem:\n{question}\n\nDo not write code. Propose {n_strategies} different strategies "
            f"(algorithms or approaches) for solving it, one per line, numbered 1. to {n_strategies}., "
            "each a single sentence."
        )

    def worker(self, question: str, strategy: str) -> Messages:
        return user_message(
            f"{question}\n\nSolve the problem with this strategy: {strategy}\n"
            f"Write a Python 3 program. {_PROGRAM_SHAPE}"
        )

    def synthesizer(self, question: str, solutions: list[str]) -> Messages:
        listed = "\n\n".join(f"### Program {i + 1}\n{s}" for i, s in enumerate(solutions))
        return user_message(
            f"Problem:\n{question}\n\n{listed}\n\n"
            "Compare these programs and decide which one is correct, fixing it if none is. "
            "Give the final complete program in one fenced ```python block."
        )


def code_flag(score: CodeScore) -> str:
    """'correct' when every test passed; else the program-level failure or the commonest test failure."""
    if score.total and score.passed == score.total:
        return "correct"
    for program_level in ("no_code", "syntax_error"):
        if score.flags.get(program_level):
            return program_level
    counts = [(score.flags.get(f, 0), -i, f) for i, f in enumerate(_TEST_FAILURES)]
    count, _, flag = max(counts)
    return flag if count else "wrong_answer"


def _with_interface(problem: Problem) -> Problem:
    note = interface_note(problem.tests)
    if not note:
        return problem
    return Problem(id=problem.id, question=f"{problem.question}\n\n{note}", answer=problem.answer,
                   tests=problem.tests)


class CodeTask(Task):
    name = "code"

    def __init__(self, data_path: str | Path, mode: Mode = "pass_rate", test_timeout_s: float = 6.0,
                 sandbox: str = "bwrap") -> None:
        if mode not in MODES:
            raise ValueError(f"code reward mode {mode!r} is not one of {list(MODES)}: set task.code_reward_mode")
        if test_timeout_s <= 0:
            raise ValueError(f"test_timeout_s must be positive, got {test_timeout_s}")
        try:
            self.sandbox = SandboxConfig(isolation=sandbox)  # type: ignore[arg-type]
        except ValueError as err:
            raise ValueError(f"{err}: set task.sandbox") from None
        try:
            require(self.sandbox)  # refuse now, before any training, not at the first reward
        except SandboxUnavailable as err:
            raise SandboxUnavailable(f"{err}; or set task.sandbox=none to run model-written code unisolated") from None
        self.train = [_with_interface(p) for p in read_split(data_path, "train", "code")]
        self.val = [_with_interface(p) for p in read_split(data_path, "val", "code")]
        self.mode = mode
        self.limits = CodeLimits(timeout_s=float(test_timeout_s))
        self.prompts = CodePrompts()


    def extract_answer(self, response: str) -> str | None:
        # The reward's own extractor, so `Score.parsed` is exactly the program that ran.
        return last_python_block(response)

    def _score(self, response: str, result: CodeScore) -> Score:
        return Score(result.reward, last_python_block(response), code_flag(result))

    def score(self, response: str | None, problem: Problem) -> Score:
        if response is None:
            return Score(0.0, None, "no_answer")
        result = score_code(response, list(problem.tests), self.mode, limits=self.limits, sandbox=self.sandbox)
        return self._score(response, result)

    def score_many(self, items: list[tuple[str | None, Problem]]) -> list[Score]:
        # One call into the batch scheduler: it runs all programs' tests on a shared worker pool.
        ran = [(i, r, p) for i, (r, p) in enumerate(items) if r is not None]
        results = (score_code_batch([(r, list(p.tests)) for _, r, p in ran], self.mode,
                                    limits=self.limits, sandbox=self.sandbox) if ran else [])
        scores: list[Score] = [Score(0.0, None, "no_answer")] * len(items)
        for (i, response, _), result in zip(ran, results):
            scores[i] = self._score(response, result)
        return scores


@dataclass
class CodeParams(TaskParams):
    name: str = "code"
    # Local prepared data (`gridrun data prepare code` writes data/code).
    data_path: str | None = None
    # pass_rate: the fraction of tests passed (the paper's text); all_pass: 1 only if all pass
    # (its released code).
    code_reward_mode: Literal["pass_rate", "all_pass"] = "pass_rate"
    # Wall-clock limit of one test in the sandbox, seconds.
    code_test_timeout_s: float = 6.0
    # bwrap: model-written programs run only in a working bubblewrap sandbox (the cell refuses
    # to start without one). none: run them WITHOUT isolation (they can read, write, kill and
    # connect to whatever the cell's user can), logged loudly; for trusted code or debugging.
    sandbox: Literal["bwrap", "none"] = "bwrap"

    def __post_init__(self) -> None:
        require_data(self)


TASK = register_task(registry.Task(
    name="code", params=CodeParams, prompts=CodePrompts,
    build=lambda p: CodeTask(p.data_path, mode=p.code_reward_mode, test_timeout_s=p.code_test_timeout_s,
                             sandbox=p.sandbox),
))
