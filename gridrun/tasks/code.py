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

What the model sees of a problem (`question`): under `lcb_instruction` (the released code's
way, in our wording) the statement inside a LiveCodeBench-style instruction saying what the
program does with its input and which function the tests call; under `bare` the statement,
and for a function-call problem one sentence naming its function (`interface_note`), since
the statement alone may not say which one the tests call.

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

from gridrun.seam import registry
from gridrun.seam.registry import ConfigError, TaskParams, register_task
from gridrun.tasks.answers import last_python_block
from gridrun.tasks.base import Messages, Problem, RolePrompts, Score, Task, user_message
from gridrun.tasks.code_reward import FLAG_NAMES, CodeLimits, CodeScore, Mode, score_code, score_code_batch
from gridrun.tasks.prepared import read_split, read_test, require_data
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

    # Eval-Opt with the whole conversation above (protocol.eval_opt_context=full): the
    # program and review are already there, so these only say what to do with them.
    def evaluator_followup(self, question: str, solution: str) -> Messages:
        return user_message(
            "Review the latest program above: does it give the right output for every valid input, fast enough? "
            "In a few sentences, point out the first bug if there is one. Do not write code. "
            "End with exactly \\boxed{Correct} or \\boxed{Incorrect}."
        )

    def revision_followup(self, question: str, previous: str, critique: str) -> Messages:
        return user_message(
            "The last message above is a reviewer's check of your latest program. Fix what is wrong "
            "(or keep what is right) and give the complete program again in one fenced ```python block."
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


def lcb_instruction(question: str, tests: Sequence[dict[str, Any]]) -> str:
    """The problem inside a LiveCodeBench-style instruction, as the released code presented
    code problems (our wording): the statement, then what the program must do with its input."""
    names = {t["fn_name"] for t in tests if t.get("fn_name")}
    if len(names) == 1:
        (name,) = names
        form = (f"Write a Python function `{name}` (at top level, or as a method of `class Solution`) that solves "
                "it; it is called with the arguments of each test and its return value is checked.")
    else:
        form = ("Write a Python program that solves it: read the input from standard input and print the "
                "answer to standard output.")
    return (f"You are given a programming problem. Solve it in Python 3.\n\n### Problem\n{question}\n\n"
            f"### Format\n{form} Give your code in one fenced ```python block.")


def _with_instruction(problem: Problem) -> Problem:
    return Problem(id=problem.id, question=lcb_instruction(problem.question, problem.tests), answer=problem.answer,
                   tests=problem.tests)


class CodeTask(Task):
    name = "code"

    def __init__(self, data_path: str | Path, mode: Mode = "all_pass", limits: CodeLimits | None = None,
                 sandbox: str = "bwrap", question: str = "lcb_instruction") -> None:
        if mode not in MODES:
            raise ValueError(f"code reward mode {mode!r} is not one of {list(MODES)}: set task.code_reward_mode")
        limits = limits or limits_of()
        try:
            self.sandbox = SandboxConfig(isolation=sandbox)  # type: ignore[arg-type]
        except ValueError as err:
            raise ValueError(f"{err}: set task.sandbox") from None
        try:
            require(self.sandbox)  # refuse now, before any training, not at the first reward
        except SandboxUnavailable as err:
            raise SandboxUnavailable(f"{err}; or set task.sandbox=none to run model-written code unisolated") from None
        present = _with_instruction if question == "lcb_instruction" else _with_interface
        self.train = [present(p) for p in read_split(data_path, "train", "code")]
        self.val = [present(p) for p in read_split(data_path, "val", "code")]
        test, self.test_missing = read_test(data_path, "code")
        self.test = [present(p) for p in test]
        self.mode = mode
        self.limits = limits
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
    # all_pass: 1 only if every test passes, stopping at the first failure (the released
    # code); pass_rate: the fraction of tests passed (the paper's text).
    code_reward_mode: Literal["pass_rate", "all_pass"] = "all_pass"
    # Wall-clock limit of one test in the sandbox, seconds (the released code's 3).
    code_test_timeout_s: float = 3.0
    # A program's tests share a budget of min(code_budget_cap_s, code_test_timeout_s +
    # code_budget_per_test_s * tests), seconds; tests left when it is spent fail as "budget".
    # Released: per-test timeouts only, and at most 120 s per problem.
    code_budget_per_test_s: float = 3.0
    code_budget_cap_s: float = 120.0
    # What the model sees of a problem: "lcb_instruction", the statement inside a
    # LiveCodeBench-style instruction (as the released code prepared it; gridrun's wording),
    # or "bare", the statement alone (with one sentence naming the function the tests call).
    question: Literal["lcb_instruction", "bare"] = "lcb_instruction"
    # bwrap: model-written programs run only in a working bubblewrap sandbox (the cell refuses
    # to start without one). none: run them WITHOUT isolation (they can read, write, kill and
    # connect to whatever the cell's user can), logged loudly; for trusted code or debugging.
    sandbox: Literal["bwrap", "none"] = "bwrap"

    def __post_init__(self) -> None:
        require_data(self)
        for key in ("code_test_timeout_s", "code_budget_cap_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"task.{key} must be > 0 seconds, got {getattr(self, key)}")
        if self.code_budget_per_test_s < 0:
            raise ConfigError(f"task.code_budget_per_test_s must be >= 0 seconds, got {self.code_budget_per_test_s}")


def limits_of(params: CodeParams | None = None) -> CodeLimits:
    """The reward's time limits a code task's params set; without params, CodeParams' defaults
    (the released code's), for scoring outside a cell."""
    if params is None:  # the class's defaults (an instance would need a data_path)
        return CodeLimits(timeout_s=CodeParams.code_test_timeout_s, budget_per_test_s=CodeParams.code_budget_per_test_s,
                          budget_cap_s=CodeParams.code_budget_cap_s)
    return CodeLimits(timeout_s=params.code_test_timeout_s, budget_per_test_s=params.code_budget_per_test_s,
                      budget_cap_s=params.code_budget_cap_s)


TASK = register_task(registry.Task(
    name="code", params=CodeParams, prompts=CodePrompts,
    build=lambda p: CodeTask(p.data_path, mode=p.code_reward_mode, limits=limits_of(p), sandbox=p.sandbox,
                             question=p.question),
))
