"""The grid root's schema: what a composed tree's `grid` node may hold (gpu, cluster,
launcher, the data root, the dry run's cost model, the tables), checked at plan time.

conf/cluster/*.yaml is the first file a new user writes, so a misspelled key there
(`partiton:`) must fail `gridrun plan` in one line naming the key and its closest valid
spelling, exactly as a run key does (the run schema's rules, gridrun/seam/runconfig.py's
`from_dict`), never be replaced by a default deep inside submission. Each launcher declares
its own settings (`Launcher.settings_type`), as a workflow declares its params.

Left out: composing the node (gridrun/grid/compose.py) and what the launchers do with it;
sweep.json keeps the validated cluster and launcher as plain mappings (every key with its
default filled in), which the launchers read back through `cluster_spec` and `settings_type`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gridrun.grid.errors import GridError, checked, option_file
from gridrun.grid.launchers.base import LauncherSettings, launcher_class, launcher_settings
from gridrun.grid.launchers.cluster import ClusterSpec, cluster_spec


@dataclass
class GpuSpec:
    """A GPU class (conf/gpu/<name>.yaml)."""

    name: str
    # GPUs a cell takes (a whole node's worth on the GPU classes, 0 on cpu).
    gpus_per_cell: int = 0
    # Usable memory of one GPU, GiB: the total CUDA reports, not the data sheet's size (the
    # memory model's card, gridrun/memory.py).
    memory_gib: int | float = 0
    # The GPUs are asked for but the trainer runs on the CPU: `gridrun canary --cpu` on a SLURM
    # profile, whose job checks each task's GPU binding (cell.json says so; the trainer then
    # does not require a GPU it can use).
    binding_only: bool = False


@dataclass
class EstimateSpec:
    """The dry run's cost model (conf/config.yaml's grid.estimate, rows of conf/tables.yaml)."""

    step_s: float
    relative_cost: float
    val_cost: float = 0.5


@dataclass
class GridSpec:
    """The composed `grid` node, launcher aside (its settings depend on the launcher named)."""

    data_root: str
    scale: str
    gpu: GpuSpec
    cluster: ClusterSpec
    estimate: EstimateSpec
    # conf/tables.yaml's rows, already read through the run's interpolations.
    workflow_task: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    scale_gpu: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)


@dataclass
class GridRoot:
    """A cell's grid root, checked: the grid spec and its launcher's settings."""

    spec: GridSpec
    launcher: LauncherSettings


def grid_root(node: Mapping[str, Any], files: Mapping[str, str] | None = None) -> GridRoot:
    """The composed `grid` node, checked against the schema; a bad key or value is a one-line
    GridError naming it, its closest valid spelling and the file to fix (`files`: group ->
    the option file it was composed from, Composer.option_files; else named by `name:`)."""
    files = files or {}
    # The user-written parts first, so that an error names their file.
    cluster_spec(_mapping(node, "cluster"), files.get("cluster"))
    gpu = _mapping(node, "gpu")
    checked(GpuSpec, dict(gpu), "grid.gpu.", files.get("gpu") or option_file("gpu", gpu))
    launcher = _mapping(node, "launcher")
    settings_type = launcher_class(str(launcher.get("name"))).settings_type
    settings = launcher_settings(launcher, settings_type, files.get("launcher"))
    rest = {key: value for key, value in node.items() if key != "launcher"}
    return GridRoot(spec=checked(GridSpec, rest, "grid.", "conf/config.yaml's grid node"), launcher=settings)


def as_dict(spec: Any) -> dict[str, Any]:
    """A checked spec as sweep.json records it: every key, defaults filled in."""
    return dataclasses.asdict(spec)


def _mapping(node: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = node.get(key)
    if not isinstance(value, Mapping):
        raise GridError(f"grid.{key}: expected a mapping, got {value!r}: pick one with {key}=<name>")
    return value
