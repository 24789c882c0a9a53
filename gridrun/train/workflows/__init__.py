"""Workflow registry. A new workflow = one module here + one YAML in conf/workflow/."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gridrun.runconfig import WorkflowSpec
from gridrun.tasks.base import Task
from gridrun.train.episode import Episode, Turn
from gridrun.train.rollout import EpisodeLLM

Program = Callable[[EpisodeLLM, Episode, Task, WorkflowSpec], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Workflow:
    name: str
    # Role types, in the order their adapters are created under Isolated-Policy.
    roles: tuple[str, ...]
    # The role played by several parallel slots (voters, workers), if any.
    parallel_role: str | None
    run: Program
    # Whether the parallel slots are distinct trajectories (the released code names Voting's
    # voters generator0/1/2) or one (Orch-Workers' three workers are all `worker`).
    distinct_slots: bool = False

    def trajectory_name(self, turn: Turn) -> str:
        """The released code's trajectory name of a turn: its advantage group within a problem.

        Every Eval-Opt turn is its own trajectory named after its role, so all of a problem's
        generator turns (every round, every episode) form one group."""
        if self.distinct_slots and turn.role == self.parallel_role:
            return f"{turn.role}{turn.slot}"
        return turn.role

    def slots(self, spec: WorkflowSpec) -> int:
        """Same-role multiplicity of parallel_role."""
        return dataclasses.replace(spec, name=self.name).parallel_slots()


def get_workflow(name: str) -> Workflow:
    from gridrun.train.workflows import eval_opt, orch_workers, single, voting

    registry = {w.name: w for w in (single.WORKFLOW, eval_opt.WORKFLOW, voting.WORKFLOW, orch_workers.WORKFLOW)}
    if name not in registry:
        raise ValueError(f"unknown workflow '{name}': expected one of {sorted(registry)}")
    return registry[name]
