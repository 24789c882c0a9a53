"""The released code's math grader (gridrun/tasks/math_grader.py), against verdicts worked
out by hand from its rules, and where they differ from math-verify's (task.grader=math_verify,
the as_written preset)."""

from __future__ import annotations

import pytest
import yaml

from gridrun.grid import PACKAGE_DIR
from gridrun.tasks.answers import released_box
from gridrun.tasks.base import Problem
from gridrun.tasks.math import score_boxed
from gridrun.tasks.math_grader import grade, score_released


def test_no_box_scores_zero_released_and_the_penalty_as_written() -> None:
    # Released: a response without \boxed{} scores 0.0 (no format penalty); as_written's
    # preset file sets math-verify with -0.1.
    as_written = yaml.safe_load((PACKAGE_DIR / "conf" / "preset" / "task" / "as_written_math.yaml").read_text())
    assert (score_released("The answer is 5.", "5").reward, score_released("The answer is 5.", "5").flag) == (0.0, "no_box")
    assert score_boxed("The answer is 5.", "5", "released", 0.0).reward == 0.0
    assert score_boxed("The answer is 5.", "5", as_written["grader"], as_written["format_penalty"]).reward == -0.1


@pytest.mark.parametrize("response, expected", [
    ("so \\boxed{5} or rather \\boxed{6}.", "6"),       # the last box
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),          # nested braces counted
    ("\\boxed 5", None),                                # only the form \boxed{
    ("\\boxed{5", None),                                # unclosed
    ("\\fbox{5}", None),                                # \fbox is not read
    ("\\boxed{\\{1\\}}", "\\{1\\}"),                    # braces counted plainly, escapes too
])
def test_the_released_box_is_the_last_exact_boxed_form(response: str, expected: str | None) -> None:
    assert released_box(response) == expected


@pytest.mark.parametrize("given, reference, correct, why", [
    ("\\frac{1}{2}", "0.5", True, "mathd: '0.5' is rewritten to \\frac{1}{2}"),
    ("3/4", "\\frac{3}{4}", True, "mathd: an integer a/b becomes \\frac{a}{b}"),
    ("\\dfrac12", "\\frac{1}{2}", True, "mathd: dfrac -> frac, \\frac12 -> \\frac{1}{2}"),
    ("x=5", "5", True, "mathd: a left side of at most 2 characters is dropped"),
    ("10\\%", "10", True, "mathd: \\% removed"),
    ("90^\\circ", "90", True, "mathd: degrees removed"),
    ("\\text{(B)}", "(B)", True, "mathd: a leading \\text{} unwrapped"),
    ("1,000", "1000", True, "sympy path: thousands separator stripped, integer canonical"),
    ("6.0", "6", True, "sympy path: an integral float becomes the integer"),
    ("2\\sqrt{2}", "\\sqrt{8}", True, "sympy: 2*sqrt(2) - sqrt(8) simplifies to 0"),
    ("\\pi/2", "\\frac{\\pi}{2}", True, "sympy: pi/2 - pi/2 = 0"),
    ("1\\frac{1}{2}", "\\frac{3}{2}", True, "sympy: '1 1/2' is the mixed number 1+1/2"),
    ("3\\cdot 4", "12", False, "'3*4' is no integer string, the reference is: no sympy"),
    ("3\\cdot x", "3x", True, "sympy: \\cdot is a product"),
    ("(1,2)", "(2,1)", False, "tuple elements compared in order"),
    ("(1,2)", "[1,2]", False, "an interval's brackets must match"),
    ("2/4", "\\frac{1}{2}", False, "two fractions compare as written: unreduced is wrong"),
    ("0.333333", "\\frac{1}{3}", False, "sympy: 1/3 - 0.333333 is not 0"),
    ("5.5", "5", False, "an integer reference needs an integer answer"),
    ("x^{2}+1", "1+x^2", True, "sympy: braces are dropped first, then (1+x**2)-(x**2+1) = 0"),
    ("e^(x)", "e^x", False, "'^(' is refused before sympy (it could hang)"),
    ("2^{10}", "1024", False, "'2^10' is no integer string, the reference is: no sympy"),
])
def test_released_verdicts_worked_out_from_its_rules(given: str, reference: str, correct: bool, why: str) -> None:
    assert grade(given, reference) is correct, why


def test_where_the_released_grader_and_math_verify_disagree() -> None:
    # The reason the released grader is implemented, not approximated with math-verify: on
    # these boxes their verdicts differ (math-verify rounds floats to 6 places and reduces
    # fractions).
    for given, reference in (("2/4", "\\frac{1}{2}"), ("0.333333", "\\frac{1}{3}")):
        response = f"\\boxed{{{given}}}"
        assert score_boxed(response, reference, "released", 0.0).reward == 0.0
        assert score_boxed(response, reference, "math_verify", -0.1).reward == 1.0


def test_the_math_task_scores_with_its_grader() -> None:
    from gridrun.tasks.arith import ArithTask

    problem = Problem(id="p", question="1/4 + 1/4", answer="\\frac{1}{2}")
    released = ArithTask(n_train=1, n_val=1)
    as_written = ArithTask(n_train=1, n_val=1, format_penalty=-0.1, grader="math_verify")
    assert (released.score("\\boxed{2/4}", problem).reward, as_written.score("\\boxed{2/4}", problem).reward) == (0.0, 1.0)
    assert (released.score("no box", problem).reward, as_written.score("no box", problem).reward) == (0.0, -0.1)


def test_two_integers_are_compared_by_value_as_sympy_would() -> None:
    # The fast path for two integer literals gives sympy's verdict on (a) - (b) == 0.
    import sympy

    from gridrun.tasks.math_grader import _sympy_equal

    for a, b in (("57", "58"), ("58", "58"), ("-3", "3"), ("0", "-0"), ("007", "7"), ("10", "-10")):
        assert _sympy_equal(a, b) is (sympy.simplify(sympy.sympify(f"({int(a)})-({int(b)})")) == 0), (a, b)


# Answers that ran sympy for seconds to forever before the released grader was bounded:
# `**` slipped past its `^` guards, and nothing limited sympy's time.
@pytest.mark.parametrize("given, reference", [
    ("9**9**8", "\\frac{1}{2}"),
    ("9**9**7", "\\frac{1}{2}"),
    ("(x+1)**999", "x"),
    ("(x+1)**999", "\\frac{1}{2}"),
    ("2**(10**6)", "3"),
    ("9**(9**9)", "x+1"),
    ("(" * 150 + "x" + ")" * 150, "x+1"),
    ("+".join(["x"] * 3000), "x"),
])
def test_a_hostile_answer_is_graded_within_5_seconds(given: str, reference: str) -> None:
    import time

    t0 = time.monotonic()
    score = score_released(f"\\boxed{{{given}}}", reference)
    assert time.monotonic() - t0 <= 5.0, "graded too slowly"
    assert score.reward == 0.0


# sympy needs far more than 10 ms for this difference (it passes every guard: two letters,
# one-digit exponents), so a 10 ms limit must cut it off.
SLOW = ("\\boxed{(x+y)^9-(x-y)^9}", "y")


def test_a_comparison_past_the_time_limit_scores_wrong_and_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from gridrun.tasks import math_grader

    monkeypatch.setattr(math_grader, "TIME_LIMIT_S", 0.01)
    t0 = time.monotonic()
    score = score_released(*SLOW)
    assert time.monotonic() - t0 < 5.0
    assert (score.reward, score.flag) == (0.0, "timeout")
    monkeypatch.setattr(math_grader, "TIME_LIMIT_S", 3.0)
    assert score_released("\\boxed{2\\sqrt{2}}", "\\sqrt{8}").flag == "correct"  # the worker was replaced


def test_the_time_limit_holds_off_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # A trainer scores from any thread: the limit must not be a main-thread-only alarm.
    import threading

    from gridrun.tasks import math_grader

    monkeypatch.setattr(math_grader, "TIME_LIMIT_S", 0.01)
    flags: list[str] = []
    worker = threading.Thread(target=lambda: flags.append(score_released(*SLOW).flag))
    worker.start()
    worker.join(60)
    assert flags == ["timeout"]
