"""Tasks: problems, role prompts and rewards (`arith`, `math`, `code`); torch-free, and
importing neither the grid nor the trainer. Each task module declares its params and registers
itself (gridrun/seam/registry.py); `make_task` builds one from a run's task node.

    base.py         what every task provides: problems, role prompts, a scorer
    arith.py math.py code.py   the tasks
    answers.py      the one parser of each answer shape (`\\boxed{}`, code fences, verdicts)
    math_reward.py  math-verify's reward; math_grader.py: the released code's grader
    code_reward.py  running a program against its tests in the sandbox
    sandbox.py      bubblewrap with rlimits; harness.py: the test runner shipped inside it
    data.py         `gridrun data prepare`; prepared.py: the prepared format every task reads
    math_sample/    a small prepared math set shipped with gridrun (the CPU canary's, offline)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gridrun.seam import registry

if TYPE_CHECKING:
    from gridrun.tasks.base import Task


def make_task(params: registry.TaskParams) -> Task:
    """The task a run's `task` node names, with the prompts other modules added for roles
    its own prompts class does not have."""
    entry = registry.task(params.name, params.plugin)
    task = entry.build(params)
    task.prompts.add(registry.extra_prompts(params.name))
    return task
