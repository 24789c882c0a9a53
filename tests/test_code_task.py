"""Tests for gridrun.tasks.code: CodeTask on the prepared DeepCoder fixture, scored in the real
bubblewrap sandbox (tests marked `sandbox`), in both test formats and both reward modes; the
refusal without a sandbox and the opt-out by name; the flag mapping on hand-made scores; the
prompts' output shapes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gridrun.tasks import code as code_module
from gridrun.tasks import sandbox
from gridrun.tasks.base import Problem
from gridrun.tasks.code import CodePrompts, CodeTask, code_flag, interface_note
from gridrun.tasks.code_reward import CodeLimits, CodeScore
from gridrun.tasks.data import prepare
from gridrun.tasks.sandbox import SandboxUnavailable
from tests.conftest import make_cell

needs_sandbox = pytest.mark.sandbox

CODE_FIXTURE = Path(__file__).parent / "fixtures" / "deepcoder_sample.jsonl"


def fenced(code: str) -> str:
    return f"Here is my plan.\n```python\n{code}```\nThat should work."


@pytest.fixture(scope="module")
def data_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("code")
    prepare("code", CODE_FIXTURE, out, val_size=3)
    return out


@pytest.fixture(scope="module")
def task(data_path: Path) -> CodeTask:
    # The paper's text's reward (pass rate) on bare statements: the tests below read fractions.
    return CodeTask(data_path, mode="pass_rate", limits=CodeLimits(timeout_s=2.0), question="bare")


def _problem(task: CodeTask, row: int) -> Problem:
    return next(p for p in task.train_problems() + task.val_problems() + task.test_problems() if p.id == f"code-{row:06d}")


# Row 0: a + b over stdin, tests (1,2) (5,7) (-1,1) (10,-3). Row 6: add(a, b) called with
# (1,2) (-4,4) (10,5) (0,0). Row 8: Solution().evens(xs).
A_PLUS_B = 0
ADD = 6
EVENS = 8


@needs_sandbox
def test_loads_the_prepared_fixture(task: CodeTask) -> None:
    assert (len(task.train_problems()), len(task.val_problems()), len(task.test_problems())) == (4, 3, 3)
    assert task.name == "code" and isinstance(task.prompts, CodePrompts)
    assert all(p.tests for p in task.train_problems() + task.val_problems())


@needs_sandbox
def test_function_call_problems_name_their_function(task: CodeTask) -> None:
    assert "`add`" in _problem(task, ADD).question and "class Solution" in _problem(task, ADD).question
    assert "Implement the function" not in _problem(task, A_PLUS_B).question
    assert interface_note([{"input": "1\n", "output": "1\n"}]) == ""


@needs_sandbox
def test_scores_stdin_and_function_call_responses(task: CodeTask) -> None:
    a_plus_b, add, evens = _problem(task, A_PLUS_B), _problem(task, ADD), _problem(task, EVENS)
    cases = [
        # (response, problem, reward, flag): worked out test by test.
        (fenced("a, b = map(int, input().split())\nprint(a + b)\n"), a_plus_b, 1.0, "correct"),
        # |a| + |b| is right for (1,2) and (5,7), wrong for (-1,1) and (10,-3): 2 of 4.
        (fenced("a, b = map(int, input().split())\nprint(abs(a) + abs(b))\n"), a_plus_b, 0.5, "wrong_answer"),
        (fenced("a, b = map(int, input().split())\nprint(a - b)\n"), a_plus_b, 0.0, "wrong_answer"),
        (fenced("def add(a, b):\n    return a + b\n"), add, 1.0, "correct"),
        # abs(a) + b is wrong only for (-4,4): 3 of 4.
        (fenced("def add(a, b):\n    return abs(a) + b\n"), add, 0.75, "wrong_answer"),
        (fenced("def add(a, b):\n    return a - b - 1\n"), add, 0.0, "wrong_answer"),
        (fenced("class Solution:\n    def evens(self, xs):\n        return [x for x in xs if x % 2 == 0]\n"),
         evens, 1.0, "correct"),
        (fenced("def add(a, b):\n    raise ValueError(a)\n"), add, 0.0, "runtime_error"),
        ("I would add the two numbers.", add, 0.0, "no_code"),
        (fenced("def add(a, b)\n    return a + b\n"), add, 0.0, "syntax_error"),
    ]
    scores = task.score_many([(response, problem) for response, problem, _, _ in cases])
    for (response, _, reward, flag), score in zip(cases, scores):
        assert (score.reward, score.flag) == (reward, flag), response
        assert score.correct == (flag == "correct")
        assert score.parsed == task.extract_answer(response)
    # The one-at-a-time path agrees with the batch path.
    single = task.score(cases[1][0], a_plus_b)
    assert (single.reward, single.flag) == (0.5, "wrong_answer")


@needs_sandbox
def test_none_scores_zero_no_answer_and_skips_the_sandbox(task: CodeTask, monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[int] = []
    real = code_module.score_code_batch

    def counting(items, *args, **kwargs):  # type: ignore[no-untyped-def]
        items = list(items)
        batches.append(len(items))
        return real(items, *args, **kwargs)

    monkeypatch.setattr(code_module, "score_code_batch", counting)
    add = _problem(task, ADD)
    good = fenced("def add(a, b):\n    return a + b\n")
    scores = task.score_many([(None, add), (good, add), (None, add)])
    assert [s.flag for s in scores] == ["no_answer", "correct", "no_answer"]
    assert [s.reward for s in scores] == [0.0, 1.0, 0.0]
    assert batches == [1]  # one batch, holding only the response that exists
    assert task.score(None, add) == scores[0]


@needs_sandbox
def test_all_pass_mode_gives_partial_programs_nothing(data_path: Path) -> None:
    task = CodeTask(data_path, mode="all_pass", limits=CodeLimits(timeout_s=2.0))
    partial = task.score(fenced("def add(a, b):\n    return abs(a) + b\n"), _problem(task, ADD))
    assert (partial.reward, partial.correct, partial.flag) == (0.0, False, "wrong_answer")
    assert task.score(fenced("def add(a, b):\n    return a + b\n"), _problem(task, ADD)).reward == 1.0


@needs_sandbox
def test_one_of_two_tests_passed_scores_0_released_and_half_as_written(data_path: Path) -> None:
    # |a| + |b| passes "1 2" -> 3 and fails "-1 1" -> 0: 1 of 2 tests. Released (all_pass, the
    # schema's default): 0.0; as_written (conf/preset/task/as_written_code.yaml: pass_rate): 0.5.
    import yaml

    from gridrun.grid import PACKAGE_DIR
    from gridrun.tasks.code import TASK, CodeParams

    problem = Problem(id="p", question="Print a + b.",
                      tests=({"input": "1 2\n", "output": "3\n"}, {"input": "-1 1\n", "output": "0\n"}))
    program = fenced("a, b = map(int, input().split())\nprint(abs(a) + abs(b))\n")
    as_written = yaml.safe_load((PACKAGE_DIR / "conf" / "preset" / "task" / "as_written_code.yaml").read_text())
    released_task = TASK.build(CodeParams(data_path=str(data_path)))
    as_written_task = TASK.build(CodeParams(data_path=str(data_path), **as_written))
    assert (released_task.mode, released_task.limits.timeout_s, released_task.limits.budget_cap_s) == ("all_pass", 3.0, 120.0)
    assert (as_written_task.mode, as_written_task.limits.timeout_s, as_written_task.limits.budget_cap_s) == (
        "pass_rate", 6.0, 600.0)
    assert released_task.score(program, problem).reward == 0.0
    assert as_written_task.score(program, problem).reward == 0.5
    # Released stops at the first failure: |a| - |b| fails "1 2", so "-1 1" (which it would
    # pass) never runs. One worker runs the tests in order; with several, each runs its own
    # share and stops at its share's first failure or once another worker's failed.
    from gridrun.tasks.code_reward import score_code

    first_fails = fenced("a, b = map(int, input().split())\nprint(abs(a) - abs(b))\n")
    result = score_code(first_fails, list(problem.tests), released_task.mode, limits=released_task.limits,
                        sandbox=released_task.sandbox, workers=1)
    assert (result.reward, result.passed, result.flags.get("skipped")) == (0.0, 0, 1)


def test_released_questions_are_wrapped_in_an_instruction(data_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # task.question=lcb_instruction (released): the statement inside a LiveCodeBench-style
    # instruction that says what the program does with its input; bare: the statement alone.
    monkeypatch.setattr(code_module, "require", lambda config: None)
    released = CodeTask(data_path, sandbox="none")
    bare = CodeTask(data_path, sandbox="none", question="bare")
    stdin = {p.id: p for p in released.train_problems() + released.val_problems() + released.test_problems()}[f"code-{A_PLUS_B:06d}"]
    plain = {p.id: p for p in bare.train_problems() + bare.val_problems() + bare.test_problems()}[f"code-{A_PLUS_B:06d}"]
    assert stdin.question.startswith("You are given a programming problem.") and plain.question in stdin.question
    assert "standard input" in stdin.question and "```python" in stdin.question
    call = {p.id: p for p in released.train_problems() + released.val_problems() + released.test_problems()}[f"code-{ADD:06d}"]
    assert "Write a Python function `add`" in call.question and "standard input" not in call.question


def test_constructor_rejects_unknown_mode(data_path: Path) -> None:
    with pytest.raises(ValueError, match="pass_rate"):
        CodeTask(data_path, mode="fraction")


@needs_sandbox
def test_extract_answer_takes_the_last_python_block(task: CodeTask) -> None:
    response = "```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```\n```text\nnot code\n```"
    assert task.extract_answer(response) == "print(2)\n"
    assert task.extract_answer("```python\nprint(1)\n") is None  # truncated: no closing fence


@pytest.mark.parametrize("flags, passed, total, expected", [
    ({}, 3, 3, "correct"),
    ({"no_code": 1}, 0, 3, "no_code"),
    ({"syntax_error": 1}, 0, 3, "syntax_error"),
    ({"wrong_answer": 1, "timeout": 2}, 0, 3, "timeout"),  # the commonest failure
    ({"runtime_error": 1, "wrong_answer": 1, "skipped": 5}, 0, 7, "runtime_error"),  # tie: FLAG_NAMES order
    ({"wrong_answer": 1, "unsandboxed": 1}, 2, 3, "wrong_answer"),  # unsandboxed is not a failure
    ({"skipped": 3}, 0, 3, "wrong_answer"),  # nothing judged failed, yet not all passed
])
def test_code_flag(flags: dict[str, int], passed: int, total: int, expected: str) -> None:
    assert code_flag(CodeScore(reward=passed / total, passed=passed, total=total, flags=flags)) == expected


def test_prompt_shapes() -> None:
    prompts = CodePrompts()
    q = "Print 42."
    assert "```python" in prompts.generator(q)[0]["content"]
    revision = prompts.revision(q, "```python\nprint(41)\n```", "Off by one.")
    assert [m["role"] for m in revision] == ["user", "assistant", "user"] and "Off by one." in revision[2]["content"]
    evaluator = prompts.evaluator(q, "print(42)")[0]["content"]
    assert "\\boxed{Correct}" in evaluator and "\\boxed{Incorrect}" in evaluator and "Do not write code" in evaluator
    assert "k from 1 to 3" in prompts.aggregator(q, ["a", "b", "c"])[0]["content"]
    orchestrator = prompts.orchestrator(q, 3)[0]["content"]
    assert "numbered 1. to 3." in orchestrator and "Do not write code" in orchestrator
    assert "use a dict" in prompts.worker(q, "use a dict")[0]["content"]
    synthesizer = prompts.synthesizer(q, ["print(41)", "print(42)"])[0]["content"]
    assert "### Program 2" in synthesizer and "```python" in synthesizer


# ------------------------------------------------------------------- fail closed
def test_refuses_to_load_without_a_sandbox(data_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap on PATH
    with pytest.raises(SandboxUnavailable) as err:
        CodeTask(data_path)
    message = str(err.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message and "task.sandbox=none" in message
    with pytest.raises(ValueError, match="set task.sandbox"):
        CodeTask(data_path, sandbox="off")


def test_opting_out_by_name_runs_without_bubblewrap(data_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox._warned.clear()
    with caplog.at_level(logging.WARNING, logger="gridrun.tasks.sandbox"):
        task = CodeTask(data_path, sandbox="none", limits=CodeLimits(timeout_s=2.0))
        add = _problem(task, ADD)
        assert task.score(fenced("def add(a, b):\n    return a + b\n"), add).reward == 1.0
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["UNTRUSTED CODE RUNS WITHOUT ISOLATION"]


def test_a_code_cell_without_a_sandbox_fails_at_start_in_one_line(data_path: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gridrun.cellrun import run_cell
    from gridrun.seam.rundir import RunDir

    cell = make_cell(tmp_path, "code-cell", task={"name": "code", "data_path": str(data_path)})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert run_cell(cell) == 1
    state = RunDir(cell).read_state().to_json()
    assert state["state"] == "failed" and "\n" not in state["error"]
    assert "apt-get install bubblewrap" in state["error"] and "task.sandbox=none" in state["error"]
