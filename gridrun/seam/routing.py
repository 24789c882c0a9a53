"""Which adapter serves and learns from each role, and how strongly each role pulls on it.

One torch-free home for the role -> adapter arithmetic that the plan (memory, disk), the
trainer (its routing, update and LRs) and the analysis (grouped alerts) all read:

- shared   (SP): every role -> one adapter, `shared` (also a one-role workflow's under any
  policy but grouped).
- isolated (IP): one adapter per role *type*, named after it; same-role slots (3 voters, 3
  workers) share it.
- grouped: one adapter per group of `policy.groups`, named after it.
- base cells: every role on the base model. transfer and eval cells: frozen adapters found
  when the cell runs (gridrun/train/policy.py resolves them into the same `Routing`).

The per-role knobs: a loss weight (grpo.role_weight, and 1/k on the parallel role under
multiplicity_norm=share), an LR multiplier (optim.role_lr_scale, ramped by the LR schedule,
gridrun/train/lr_schedule.py; 1/k under multiplicity_norm=lr) and optimizer steps per
training step (optim.role_steps; one for the parallel role under multiplicity_norm=steps).
The run schema's checks (gridrun/seam/runconfig.py) leave a per-adapter knob only on a role
alone on its adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.seam.runconfig import PARALLEL, SHARED_ADAPTER, CellKind, ConfigError, RunConfig


@dataclass(frozen=True)
class Routing:
    # role -> adapter name, None = base model.
    role_adapter: dict[str, str | None]
    # Adapters that learn (each gets its own optimizer).
    trainable: tuple[str, ...]
    # Adapters loaded frozen from elsewhere (transfer and eval cells): name -> peft folder.
    frozen: dict[str, Path] = field(default_factory=dict)

    def adapter(self, role: str) -> str | None:
        return self.role_adapter[role]

    def roles_of(self, adapter: str) -> list[str]:
        return [r for r, a in self.role_adapter.items() if a == adapter]


def adapter_groups(config: RunConfig) -> dict[str, tuple[str, ...]]:
    """Each trained adapter -> the roles it serves and learns from, in the workflow's role
    order. Empty under policy transfer (its adapters are frozen, found when the cell runs)."""
    roles = config.workflow_entry().roles
    if config.policy.name == "transfer":
        return {}
    if config.policy.name == "grouped":
        return {group: tuple(r for r in roles if r in members) for group, members in config.policy.groups.items()}
    if config.policy.name == "shared" or len(roles) == 1:
        return {SHARED_ADAPTER: roles}
    return {role: (role,) for role in roles}


def grouping(config: RunConfig) -> dict[str, tuple[str, ...]] | None:
    """adapter_groups under policy grouped (the alerts read the adapters there); None otherwise."""
    return adapter_groups(config) if config.policy.name == "grouped" else None


def adapter_of(config: RunConfig) -> dict[str, str]:
    """Role -> the name of the trained adapter it runs on (adapter_groups, inverted)."""
    return {role: adapter for adapter, members in adapter_groups(config).items() for role in members}


def trained_routing(config: RunConfig) -> Routing:
    """The routing of a cell that trains its adapters or runs on the base model (not transfer)."""
    roles = config.workflow_entry().roles
    if config.cell.kind is CellKind.BASE:
        return Routing({r: None for r in roles}, ())
    of = adapter_of(config)
    return Routing({r: of[r] for r in roles}, tuple(adapter_groups(config)))


def _parallel(config: RunConfig) -> str:
    """The workflow's parallel role (the checks refuse `parallel` keys and multiplicity_norm on
    a workflow without one)."""
    parallel = config.workflow_entry().parallel_role
    if parallel is None:
        raise ConfigError(f"{config.workflow.name} has no parallel role (same-role multiplicity)")
    return parallel


def _per_role(config: RunConfig, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with `parallel` resolved to the workflow's parallel role."""
    return {(_parallel(config) if role == PARALLEL else role): value for role, value in values.items()}


def _factors(config: RunConfig, values: Mapping[str, float], normalized_by: str) -> dict[str, float]:
    """`values` per role, the parallel role's divided by its slots when multiplicity_norm is
    `normalized_by`."""
    factors = _per_role(config, values)
    if config.grpo.multiplicity_norm == normalized_by:
        parallel = _parallel(config)
        factors[parallel] = factors.get(parallel, 1.0) / config.parallel_slots
    return factors


def role_weights(config: RunConfig) -> dict[str, float]:
    """Each role's loss weight (roles not listed weigh 1)."""
    return _factors(config, config.grpo.role_weight, "share")


def role_lr_scales(config: RunConfig, reached: float = 1.0) -> dict[str, float]:
    """Each role's LR multiplier (roles not listed: 1) with optim.role_lr_scale's part
    `reached` of the way from 1 (the ramp, gridrun/train/lr_schedule.py's `ramp_reached`)."""
    scales = {role: 1.0 + (s - 1.0) * reached for role, s in config.optim.role_lr_scale.items()}
    return _factors(config, scales, "lr")


def adapter_lr_scales(config: RunConfig, reached: float = 1.0) -> dict[str, float]:
    """role_lr_scales keyed by each role's adapter."""
    of = adapter_of(config)
    return {of[role]: scale for role, scale in role_lr_scales(config, reached).items()}


def role_steps(config: RunConfig) -> dict[str, int]:
    """Optimizer steps per training step of the roles that set them; roles not listed cut by
    size, as the paper."""
    steps = _per_role(config, config.optim.role_steps)
    if config.grpo.multiplicity_norm == "steps":
        steps[_parallel(config)] = 1
    return steps


def adapter_steps(config: RunConfig) -> dict[str, int]:
    """role_steps keyed by each role's adapter."""
    of = adapter_of(config)
    return {of[role]: steps for role, steps in role_steps(config).items()}
