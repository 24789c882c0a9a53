from __future__ import annotations

import pytest

from gridrun.tasks.answers import (
    last_boxed,
    last_python_block,
    parse_selection,
    parse_strategies,
    parse_verdict,
    python_blocks,
)
from gridrun.tasks.arith import ArithTask
from gridrun.tasks.base import Problem


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{}", None),
        ("no box", None),
        ("\\boxed{12", None),
        ("\\boxed{ 7 } trailing", "7"),
        # Only the last box counts: an unclosed last box is not answered by an earlier one.
        ("\\boxed{5} so \\boxed{6", None),
        ("the answer is \\boxed 7", "7"),  # the bare form, numbers only
        ("\\boxed{\\{1, 2\\}} and \\boxed{a \\} b}", "a \\} b"),  # escaped braces are not braces
        ("put it in \\boxed form", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "grader, response, reward, parsed",
    [
        # The two shapes that used to split: a box parser skipping the unclosed last box read
        # "5" while the reward scored that last box unparseable (-0.1); and it ignored the bare
        # `\\boxed 7` the reward scored correct, so a correct turn counted as unanswered.
        ("math_verify", "\\boxed{5} so \\boxed{6", -0.1, None),
        ("math_verify", "the answer is \\boxed 7", 1.0, "7"),
        # The released grader reads neither as a box: no answer, 0.0 (its reward without one).
        ("released", "\\boxed{5} so \\boxed{6", 0.0, None),
        ("released", "the answer is \\boxed 7", 0.0, None),
        ("released", "the answer is \\boxed{ 7 }", 1.0, "7"),
    ],
)
def test_a_turns_parsed_answer_is_the_box_its_reward_scored(grader: str, response: str, reward: float,
                                                            parsed: str | None) -> None:
    penalty = -0.1 if grader == "math_verify" else 0.0
    task = ArithTask(n_train=1, n_val=1, format_penalty=penalty, grader=grader)  # type: ignore[arg-type]
    problem = Problem(id="p", question="3 + 4", answer="7")
    score = task.score(response, problem)
    assert (score.reward, score.parsed) == (reward, parsed)
    assert task.extract_answer(response) == parsed


@pytest.mark.parametrize(
    "text, expected",
    [("ok \\boxed{Correct}", True), ("\\boxed{Incorrect}", False), ("\\boxed{\\text{Correct}}", True), ("\\boxed{42}", None), ("fine", None)],
)
def test_parse_verdict(text: str, expected: bool | None) -> None:
    assert parse_verdict(text) is expected


def test_parse_selection_is_one_based_and_bounded() -> None:
    assert parse_selection("\\boxed{3}", 3) == 2
    assert parse_selection("\\boxed{4}", 3) is None
    assert parse_selection("\\boxed{0}", 3) is None
    assert parse_selection("\\boxed{two}", 3) is None


def test_parse_strategies_keeps_numbered_lines_in_order() -> None:
    text = "Plan:\n2) second\n1. first\n4. too many\n1. duplicate"
    assert parse_strategies(text, 3) == ["first", "second"]


def test_last_python_block_ignores_other_languages() -> None:
    text = "```python\nprint(1)\n```\n```bash\nls\n```\n```\nprint(2)\n```"
    assert last_python_block(text) == "print(2)\n"
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```text\nnot code\n```\n"
    assert last_python_block(text) == "print(2)\n"
    assert last_python_block("a\n```\nprint(3)\n```") == "print(3)\n"
    assert last_python_block("no code here") is None
    assert last_python_block("```python\nprint(4)\n") is None  # truncated, no closing fence
    assert last_python_block("```cpp\nint main(){}\n```") is None


def test_python_blocks_keeps_every_complete_block_in_order() -> None:
    # Tags are case-insensitive; the trailing unclosed block is a truncated response, not code.
    text = "```Python\na = 1\nb = 2\n```\n```\n\n```\n```py\nc = 3\n"
    assert python_blocks(text) == ["a = 1\nb = 2\n", "\n"]
