"""Tasks: problems, role prompts and rewards (`arith`, `math`, `code`); torch-free, and
importing neither the grid nor the trainer. `make_task` builds one from a run's task settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gridrun.tasks.base import Task

TASK_NAMES = ("arith", "math", "code")


def make_task(
    name: str,
    *,
    data_path: str | None = None,
    format_penalty: float = -0.1,
    code_reward_mode: str = "pass_rate",
    code_test_timeout_s: float = 6.0,
    sandbox: str = "bwrap",
    n_train: int = 5000,
    n_val: int = 400,
) -> Task:
    """The task `name`; the keywords are a run's `task.*` settings (each task reads its own).

    Task modules are imported here, on demand: math pulls in sympy, code the sandbox."""
    if name == "arith":
        from gridrun.tasks.arith import ArithTask

        return ArithTask(n_train=n_train, n_val=n_val, format_penalty=format_penalty)
    if name == "math":
        from gridrun.tasks.math import MathTask

        return MathTask(data_path or "", format_penalty=format_penalty)
    if name == "code":
        from gridrun.tasks.code import CodeTask

        return CodeTask(data_path or "", mode=code_reward_mode, test_timeout_s=code_test_timeout_s, sandbox=sandbox)
    raise ValueError(f"unknown task '{name}': set task.name to one of {', '.join(TASK_NAMES)}")
