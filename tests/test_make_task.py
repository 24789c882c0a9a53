"""`make_task`: a run's task settings to a task, torch-free (gridrun/tasks/__init__.py)."""

from __future__ import annotations

import pytest

from gridrun.tasks import make_task
from gridrun.tasks.arith import ArithTask


def test_arith_gets_its_split_sizes_and_penalty() -> None:
    # 3 train and 2 validation problems, drawn from the 90 x 90 = 8100 pairs; the penalty is passed on.
    task = make_task("arith", n_train=3, n_val=2, format_penalty=-0.5, code_test_timeout_s=1.0)
    assert isinstance(task, ArithTask)
    assert (len(task.train_problems()), len(task.val_problems()), task.format_penalty) == (3, 2, -0.5)


def test_an_unknown_task_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown task 'maths': set task.name to one of arith, math, code"):
        make_task("maths")
