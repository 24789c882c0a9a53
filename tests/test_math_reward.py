"""Tests for gridrun.tasks.math_reward: last-box extraction, math-verify equivalence, guards, threads."""

from __future__ import annotations

import dataclasses
import json
import random
import string
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gridrun.tasks.math_reward import MathScore, score_math, score_math_json

PENALTY = -0.1

# (response, reference): math-verify must call these equal.
EQUIVALENT = [
    ("\\boxed{85}", "85"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34"),
    ("\\boxed{2x+2}", "2(x+1)"),
    ("\\boxed{x^2+1}", "1+x^2"),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{-3}", "-3"),
    ("\\boxed{1,000}", "1000"),  # thousands separator, not a set
    ("\\boxed{2,1}", "1,2"),  # a bare list is a set: order does not matter
    ("\\boxed{1,2}", "\\{1,2\\}"),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}"),  # escaped braces inside the box are not box braces
    ("\\boxed{(1,2)}", "(1,2)"),
    ("\\boxed{x \\in [1,2]}", "[1,2]"),
    ("\\boxed{1/3}", "0.333333"),  # math-verify rounds floats to 6 places
    ("\\boxed{3.14159265}", "\\pi"),
    ("\\boxed{10\\%}", "10"),  # math-verify treats a percentage as equal to its number...
    ("\\boxed{10\\%}", "0.1"),  # ...and to its fraction
    ("\\boxed{0.1}", "10\\%"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{5\\text{ cm}}", "5"),  # units are dropped
    ("\\boxed{\\$5}", "5"),
    ("\\boxed{x=5}", "5"),  # an assignment is compared by its right-hand side
    ("\\boxed{y=1+2x}", "y=2x+1"),
    ("\\boxed{\\text{Monday}}", "Monday"),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\fbox{7}", "7"),
    ("\\boxed 5", "5"),  # bare number form
    ("The answer is $\\boxed{\\boxed{7}}$.", "7"),
]

# (response, reference): parseable, but not equal.
NOT_EQUIVALENT = [
    ("\\boxed{84}", "85"),
    ("\\boxed{3}", "-3"),
    ("\\boxed{\\frac{1}{3}}", "0.5"),
    ("\\boxed{0.33}", "1/3"),  # differs at the 6-place rounding
    ("\\boxed{\\pi}", "3.14"),  # 3.14159.. rounded to 6 places is not 3.14
    ("\\boxed{2x+1}", "2(x+1)"),
    ("\\boxed{x^2+2}", "x^2+1"),
    ("\\boxed{1,3}", "1,2"),
    ("\\boxed{[1,2)}", "(1,2)"),  # interval ends matter
    ("\\boxed{11\\%}", "10"),
    ("\\boxed{\\text{Tuesday}}", "Monday"),
]


@pytest.mark.parametrize(("response", "answer"), EQUIVALENT)
def test_equivalent_answers_score_one(response: str, answer: str) -> None:
    result = score_math(response, answer)
    assert result == MathScore(1.0, result.parsed, "correct")
    assert result.parsed is not None and result.parsed in response


@pytest.mark.parametrize(("response", "answer"), NOT_EQUIVALENT)
def test_different_answers_score_zero(response: str, answer: str) -> None:
    result = score_math(response, answer)
    assert (result.reward, result.flag) == (0.0, "wrong")
    assert result.parsed is not None


def test_parsed_is_the_stripped_box_text() -> None:
    assert score_math("so \\boxed{ \\frac{1}{2} } done", "0.5").parsed == "\\frac{1}{2}"


@pytest.mark.parametrize(
    ("response", "reward", "parsed"),
    [
        ("first \\boxed{85}, on reflection \\boxed{84}", 0.0, "84"),  # a right first box does not save a wrong last
        ("first \\boxed{84}, on reflection \\boxed{85}", 1.0, "85"),
        ("\\boxed{84} and \\fbox{85}", 1.0, "85"),  # \fbox counts as a box
        ("\\boxed{85}. Remember to use \\boxed for answers.", 1.0, "85"),  # prose mention is not a box
        ("\\boxed{84} ... \\boxed{\\frac{170}{2}}", 1.0, "\\frac{170}{2}"),  # nested braces in the last box
    ],
)
def test_only_the_last_box_counts(response: str, reward: float, parsed: str) -> None:
    result = score_math(response, "85")
    assert (result.reward, result.parsed) == (reward, parsed)


def test_two_close_boxes_are_not_merged_into_a_set() -> None:
    # math-verify's own parse(response) would read "\boxed{1}, \boxed{2}" as the set {1, 2}.
    assert score_math("\\boxed{1}, \\boxed{2}", "1,2").flag == "wrong"
    assert score_math("\\boxed{1}, \\boxed{2}", "2").flag == "correct"


@pytest.mark.parametrize("response", ["The answer is 85.", "", "$85$", "\\boxed", "\\boxedfoo{85}"])
def test_no_box_gets_the_penalty(response: str) -> None:
    assert score_math(response, "85") == MathScore(PENALTY, None, "no_box")


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{}",
        "\\boxed{   }",
        "\\boxed{\\frac{1}{2}",  # unclosed
        "\\boxed{85} then \\boxed{85",  # the last box is unclosed: an earlier good box does not count
        "\\boxed{@@##}",  # math-verify cannot parse it
        "\\boxed{\\frac{1}{}}",
        "\\boxed{" + "1+" * 400 + "1}",  # longer than the 500-char cap
    ],
)
def test_unusable_box_gets_the_penalty(response: str) -> None:
    assert score_math(response, "85") == MathScore(PENALTY, None, "unparseable")


def test_format_penalty_is_configurable() -> None:
    assert score_math("no box", "1", format_penalty=-0.5).reward == -0.5
    assert score_math("\\boxed{}", "1", format_penalty=0.0).reward == 0.0


def test_long_reference_raises_the_box_cap() -> None:
    # The cap is max(500, 2 * len(answer)), so a long reference can still be matched.
    long = "+".join(["x"] * 300)
    assert score_math(f"\\boxed{{{long}}}", long).flag == "correct"


def test_huge_garbage_returns_quickly() -> None:
    rng = random.Random(0)
    garbage = "".join(rng.choice(string.printable) for _ in range(2_000_000))
    start = time.perf_counter()
    assert score_math(garbage, "85").flag in {"no_box", "unparseable", "wrong"}
    assert score_math(garbage + "\\boxed{85}", "85").flag == "correct"
    assert score_math("\\boxed{" + "{" * 5_000_000, "85").flag == "unparseable"
    assert score_math("\\boxedx " * 500_000, "85").flag == "no_box"
    # Measured at ~0.1 s; a Python-level character loop would take several seconds.
    assert time.perf_counter() - start < 2.0


_SCORE_ALL = """
import json, sys
from gridrun.tasks.math_reward import score_math
for response, answer in json.load(sys.stdin):
    print(json.dumps(list(vars(score_math(response, answer)).values())), flush=True)
"""


def _score_in_subprocess(cases: list[tuple[str, str]], seconds: float) -> list[MathScore]:
    """Score in a child process, so a sympy runaway fails the test instead of hanging pytest.

    A thread cannot do it: Python's big-int power runs in C without releasing the GIL.
    """
    done = subprocess.run(
        [sys.executable, "-c", _SCORE_ALL],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=seconds,
        cwd=Path(__file__).resolve().parents[1],
        check=True,
    )
    return [MathScore(*json.loads(line)) for line in done.stdout.splitlines()]


RUNAWAY = [
    "10^{10^{10}}",  # sympy would compute all 10^10 digits
    "\\frac{1}{10^{10^{10}}}",
    "9^{9^{9}}",
    "2^{10^4}",  # a tower: simplify factors its 3011-digit value (hangs), though 2^{10000} is fine
    "(10^{10})!",
    "\\binom{10^{6}}{5000}",
    "(x+1)^{500}",  # simplify expands it: seconds
    "\\sum_{i=1}^{10^{6}} \\sin(i)",  # sympy tries to evaluate the sum
    "\\int_0^1 e^{-x^2} \\sin(x^3) dx",
]


def test_runaway_answers_are_refused_quickly() -> None:
    # Each of these keeps math-verify busy for minutes or forever once its timeouts are off.
    results = _score_in_subprocess([(f"\\boxed{{{box}}}", "0.5") for box in RUNAWAY], 60.0)
    assert results == [MathScore(0.0, box, "wrong") for box in RUNAWAY]


REASONABLE = [
    ("2\\cdot 2^{9999}", "2^{10000}"),  # ~3000 digits, literal exponent: cheap for sympy
    ("2^{2\\cdot 5000}", "2^{10000}"),
    ("5000\\cdot 4999!", "5000!"),
    ("2^{2^8}", "2^{256}"),  # a small power tower (78 digits) is still compared
    ("2^{5!}", "2^{120}"),
    ("10^{\\log_{10}(1000)}", "1000"),
    ("(x+1)^2", "x^2+2x+1"),
]


def test_big_but_reasonable_answers_are_still_verified() -> None:
    results = _score_in_subprocess([(f"\\boxed{{{box}}}", answer) for box, answer in REASONABLE], 60.0)
    assert results == [MathScore(1.0, box, "correct") for box, _ in REASONABLE]


def test_thread_safe() -> None:
    cases = [(r, a, 1.0) for r, a in EQUIVALENT] + [(r, a, 0.0) for r, a in NOT_EQUIVALENT]
    cases += [("\\boxed{}", "1", PENALTY), ("nothing", "1", PENALTY)]
    work = cases * 4
    random.Random(1).shuffle(work)
    # With math-verify's default signal.alarm timeouts every call here would raise ValueError.
    with ThreadPoolExecutor(max_workers=8) as pool:
        rewards = list(pool.map(lambda c: score_math(c[0], c[1]).reward, work))
    assert rewards == [expected for _, _, expected in work]


def test_json_form() -> None:
    assert score_math_json("\\boxed{\\frac{1}{2}}", "0.5") == {"reward": 1.0, "parsed": "\\frac{1}{2}"}
    assert score_math_json("no box", "0.5") == {"reward": PENALTY, "parsed": None}


def test_score_is_frozen() -> None:
    result = score_math("\\boxed{1}", "1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reward = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(("box", "answer"), [
    ("84", "85"), ("085", "85"), ("-5", "5"), ("-5", "-5"), ("+7", "7"), ("0", "-0"), (" 12 ", "12"),
    ("123456789012345678901234567890", "123456789012345678901234567891"), ("1000", "1e3"), ("1,000", "1000"),
])
def test_integer_answers_score_as_math_verify_scores_them(box: str, answer: str) -> None:
    # Two integer literals are compared by value without sympy; the verdict must be
    # math-verify's own on the same pair (the last two are not both integers: math-verify's).
    from math_verify import parse, verify

    ours = score_math(f"\\boxed{{{box}}}", answer)
    theirs = verify(parse(f"${answer}$"), parse(f"\\boxed{{{box}}}"))
    assert ours.reward == (1.0 if theirs else 0.0), (box, answer, theirs)
