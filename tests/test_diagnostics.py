"""Trajectory-side diagnostics: the percentile they all rest on, and the evaluator's code blocks."""

from __future__ import annotations

from gridrun.tasks.base import Problem
from gridrun.train.diagnostics import percentile, role_signatures
from gridrun.train.episode import Episode, Turn
from gridrun.workflows.eval_opt import has_code_block


def test_nearest_rank_percentile() -> None:
    # Nearest rank = the ceil(q/100 * n)-th smallest. p50 of [1, 2]: ceil(1) = 1st -> 1 (the
    # old rounding gave 2 wherever q * n / 100 was an odd integer).
    assert percentile([2.0, 1.0], 50) == 1.0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0  # ceil(1.5) = 2nd
    # p95 of 1..20: 0.95 * 20 = 19 exactly -> the 19th, not the 20th.
    assert percentile([float(v) for v in range(1, 21)], 95) == 19.0
    assert percentile([float(v) for v in range(1, 21)], 96) == 20.0  # ceil(19.2)
    assert percentile([5.0], 0) == 5.0 and percentile([], 50) == 0.0


def evaluator_turn(text: str) -> Turn:
    return Turn(role="evaluator", slot=0, round=0, messages=[], prompt_ids=[], completion_ids=[], logprobs=[],
                text=text, finish_reason="stop")


def test_code_block_counts_complete_python_blocks_of_three_lines() -> None:
    three = "Try this:\n```python\na = 1\nb = 2\nprint(a + b)\n```\n\\boxed{Correct}"
    assert has_code_block(evaluator_turn(three))
    # Two lines is a quoted expression, not code; an unclosed block (truncated) is not code either,
    # exactly as the code reward reads it (gridrun.tasks.answers.python_blocks).
    assert not has_code_block(evaluator_turn("```python\na = 1\nb = 2\n```"))
    assert not has_code_block(evaluator_turn("```python\na = 1\nb = 2\nprint(a + b)\n"))
    assert not has_code_block(evaluator_turn("```bash\nls\ncd /\nls\n```"))


def test_inter_worker_jaccard_takes_whatever_number_of_workers_ran() -> None:
    # Orch-Workers under the released protocol: 1, 2 and 3 workers. One worker has no pair and
    # is not scored; two share 1 of 3 trigrams (abc; bcd, bce): 1/3; three identical: 1. The
    # mean over scored episodes is (1/3 + 1) / 2 = 2/3.
    def worker(slot: int, text: str) -> Turn:
        return Turn("worker", slot, 0, [], [], [1], [], text, "stop")

    plans = [["a b c d"], ["a b c d", "a b c e"], ["x y z"] * 3]
    episodes = [Episode(Problem(id=f"p{i}", question="q"), 0, [worker(k, t) for k, t in enumerate(texts)])
                for i, texts in enumerate(plans)]
    assert role_signatures(episodes, "worker")["role/worker/slot_jaccard3"] == 2 / 3
