"""`make_task`: a run's task node to a task, torch-free (gridrun/tasks/__init__.py)."""

from __future__ import annotations

import pytest

from gridrun.seam.registry import ConfigError
from gridrun.tasks import make_task
from gridrun.tasks.arith import ArithParams, ArithTask


def test_arith_gets_its_split_sizes_and_penalty() -> None:
    # 3 train and 2 validation problems, drawn from the 90 x 90 = 8100 pairs; the penalty is passed on.
    task = make_task(ArithParams(n_train=3, n_val=2, format_penalty=-0.5))
    assert isinstance(task, ArithTask)
    assert (len(task.train_problems()), len(task.val_problems()), task.format_penalty) == (3, 2, -0.5)


def test_arith_defaults_are_the_toy_worlds_split() -> None:
    # The params class is the only source of defaults: 5000 train, 200 validation problems
    # (what conf/task/arith.yaml always set; the dataclass once said 400).
    # No box scores 0.0 under the released grader (the schema's default; as_written sets -0.1).
    assert (ArithParams().n_train, ArithParams().n_val, ArithParams().format_penalty) == (5000, 300, 0.0)


def test_an_unknown_task_names_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown task 'maths' \(did you mean 'math'\?\)"):
        make_task(ArithParams(name="maths"))
