"""Cells: the kinds of runs in a sweep, their coordinates and their readable ids.

    train     multi-agent GRPO         workflow x task x scale x policy x seed   voting-ip-1.7b-math-s0
    sa_rl     single-agent RL control  task x scale x seed                       sa_rl-1.7b-math-s0
    base      base-model evaluation    (single + workflow) x task x scale        base-voting-1.7b-math
    transfer  SA-RL generator in a     workflow x task x scale x seed            transfer-voting-1.7b-math-s0
              workflow, evaluated      (needs sa_rl-<scale>-<task>-s<seed> done)
    shuffled  reward control: trains   (single + workflow x policy)              shuffled-voting-ip-1.7b-math-s0
              as its train / sa_rl     x task x scale x seed                     shuffled-sa_rl-1.7b-math-s0
              twin on rewards permuted
              within each step
    eval      adapters trained         (single + workflow x policy)              eval-voting-ip-1.7b-math-s0
              elsewhere (the sweep's   x task x scale x seed                     eval-single-1.7b-math-s0
              policy.adapters) in a    (policy: the sources', for the id and
              workflow, evaluated      the {policy} of policy.adapters)

A sweep that names variants (bundles of overrides, gridrun/grid/spec.py) crosses its train
cells and their shuffled twins with them, and the variant ends their ids
(`voting-ip-toy-arith-s0-injected`, `shuffled-voting-ip-toy-arith-s0-injected`); the sa_rl,
base and transfer controls are planned once, without a variant, as in a sweep without any.

Ids are built from the coordinates alone, so the same axes always give the same ids. The
toy world pairs scale=toy with task=arith only; any other pairing with either is refused.
A sweep may plan a kind at fewer values of an axis than the sweep's (`restrict`: the paper
ran transfer at 1.7B only; `restrict: {shuffled: {workflow: [single]}}` plans the SA-RL
reward control alone).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

from gridrun.seam.registry import single_agent_workflow
from gridrun.seam.runconfig import CellKind

AXES = ("workflow", "task", "scale", "policy", "seed", "kind")
KINDS = tuple(kind.value for kind in CellKind)
# The kinds whose workflow axis adds `single` to the sweep's workflows (and may be restricted to it).
SINGLE_KINDS = (CellKind.BASE, CellKind.SHUFFLED, CellKind.EVAL)
POLICY_TAGS = {"isolated": "ip", "shared": "sp"}
TOY_SCALE = "toy"


@dataclass(frozen=True)
class Cell:
    kind: CellKind
    workflow: str
    task: str
    scale: str
    # None where the kind has no such axis (sa_rl, base, transfer, eval, shuffled sa_rl: policy;
    # base: seed).
    policy: str | None = None
    seed: int | None = None
    # The sweep's variant (a named bundle of overrides); None for controls and in a sweep
    # without variants.
    variant: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CellKind(self.kind))

    @property
    def id(self) -> str:
        return self._axes_id() + (f"-{self.variant}" if self.variant else "")

    def _axes_id(self) -> str:
        if self.kind is CellKind.TRAIN:
            return f"{self.workflow}-{self.policy_tag}-{self.scale}-{self.task}-s{self.seed}"
        if self.kind is CellKind.SA_RL:
            return f"sa_rl-{self.scale}-{self.task}-s{self.seed}"
        if self.kind is CellKind.TRANSFER or (self.kind is CellKind.EVAL and not self.policy):
            return f"{self.kind}-{self.workflow}-{self.scale}-{self.task}-s{self.seed}"
        if self.kind is CellKind.EVAL:
            return f"eval-{self.workflow}-{self.policy_tag}-{self.scale}-{self.task}-s{self.seed}"
        if self.kind is CellKind.SHUFFLED:
            return f"shuffled-{self.trained_twin()._axes_id()}"
        return f"base-{self.workflow}-{self.scale}-{self.task}"

    def trained_twin(self) -> Cell:
        """The trained cell at this cell's coordinates (the twin rule, written once): sa_rl
        for workflow single, else train; a shuffled cell's id and an eval cell's {cell} name it."""
        kind = CellKind.SA_RL if self.workflow == single_agent_workflow() else CellKind.TRAIN
        return Cell(kind, self.workflow, self.task, self.scale, self.policy, self.seed)

    @property
    def policy_tag(self) -> str:
        """The policy as cell ids write it (ip, sp), "" for none."""
        return POLICY_TAGS.get(self.policy or "", self.policy or "")

    @property
    def needs(self) -> list[Cell]:
        """Cells that must be done before this one starts (a transfer cell: its SA-RL run)."""
        if self.kind is CellKind.TRANSFER:
            return [Cell(CellKind.SA_RL, single_agent_workflow(), self.task, self.scale, None, self.seed)]
        return []

    def coords(self) -> dict[str, Any]:
        """The cell's coordinates (sweep.json, cells.parquet); `variant` only where it has one."""
        coords: dict[str, Any] = {
            "workflow": self.workflow,
            "task": self.task,
            "scale": self.scale,
            "policy": self.policy,
            "seed": self.seed,
        }
        if self.variant:
            coords["variant"] = self.variant
        return coords

    def group_choices(self) -> list[str]:
        """Hydra group overrides selecting this cell's options (controls run `shared`:
        one role, or no training at all, so the routing makes no difference)."""
        policy = "transfer" if self.kind.evaluates_adapters else self.policy or "shared"
        return [
            f"workflow={self.workflow}",
            f"task={self.task}",
            f"scale={self.scale}",
            f"policy={policy}",
        ]

    def cell_node(self) -> dict[str, Any]:
        """The `cell` node of its config.yaml (the variant only where there is one)."""
        node: dict[str, Any] = {"id": self.id, "kind": self.kind.value, "seed": self.seed or 0}
        if self.variant:
            node["variant"] = self.variant
        return node


def base_control(kind: str, coords: dict[str, Any]) -> str | None:
    """The id of the base control a cell is measured against: its workflow's (SA-RL's is
    `single`'s) at its task and scale; None for a base cell."""
    if kind == CellKind.BASE:
        return None
    workflow = single_agent_workflow() if kind == CellKind.SA_RL else coords["workflow"]
    return Cell(kind=CellKind.BASE, workflow=workflow, task=coords["task"], scale=coords["scale"]).id


def expand(
    axes: dict[str, list[Any]],
    restrict: dict[str, dict[str, list[Any]]] | None = None,
    variants: list[str] | None = None,
) -> list[Cell]:
    """Every cell of the sweep, train first, in axis order (the toy pairing is checked per
    composed cell, gridrun/grid/plan.py, where the task's registry entry is known).

    `restrict` (kind -> axis -> values) plans a kind only where its coordinates are among
    those values. `variants` (names) crosses the train and shuffled cells, each variant of a
    cell after the other (the controls once, without one)."""
    cells = _expand_axes(axes)
    limits = restrict or {}
    cells = [
        cell
        for cell in cells
        if all(cell.coords()[axis] in values for axis, values in limits.get(cell.kind, {}).items())
    ]
    if not variants:
        return cells
    return [
        crossed
        for cell in cells
        for crossed in (
            [dataclasses.replace(cell, variant=v) for v in variants] if _takes_variants(cell) else [cell]
        )
    ]


def _takes_variants(cell: Cell) -> bool:
    """A train cell and a workflow's shuffled twin; SA-RL's twin is a control like SA-RL."""
    return cell.kind.crossed_by_variants and cell.workflow != single_agent_workflow()


def _expand_axes(axes: dict[str, list[Any]]) -> list[Cell]:
    cells: list[Cell] = []
    single = single_agent_workflow()
    kinds = axes["kind"]
    if CellKind.TRAIN in kinds:
        for workflow, task, scale, policy, seed in itertools.product(
            axes["workflow"], axes["task"], axes["scale"], axes["policy"], axes["seed"]
        ):
            cells.append(Cell(CellKind.TRAIN, workflow, task, scale, policy, seed))
    if CellKind.SA_RL in kinds:
        for task, scale, seed in itertools.product(axes["task"], axes["scale"], axes["seed"]):
            cells.append(Cell(CellKind.SA_RL, single_agent_workflow(), task, scale, None, seed))
    if CellKind.BASE in kinds:
        for workflow, task, scale in itertools.product([single, *axes["workflow"]], axes["task"], axes["scale"]):
            cells.append(Cell(CellKind.BASE, workflow, task, scale))
    if CellKind.TRANSFER in kinds:
        for workflow, task, scale, seed in itertools.product(axes["workflow"], axes["task"], axes["scale"], axes["seed"]):
            cells.append(Cell(CellKind.TRANSFER, workflow, task, scale, None, seed))
    if CellKind.EVAL in kinds:
        for workflow, task, scale, seed in itertools.product([single, *axes["workflow"]], axes["task"], axes["scale"], axes["seed"]):
            policies = [None] if workflow == single else axes["policy"]
            cells.extend(Cell(CellKind.EVAL, workflow, task, scale, policy, seed) for policy in policies)
    if CellKind.SHUFFLED in kinds:
        for workflow, task, scale, seed in itertools.product([single, *axes["workflow"]], axes["task"], axes["scale"], axes["seed"]):
            policies = [None] if workflow == single else axes["policy"]
            cells.extend(Cell(CellKind.SHUFFLED, workflow, task, scale, policy, seed) for policy in policies)
    return cells
