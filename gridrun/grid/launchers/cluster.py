"""A cluster profile (conf/cluster/<name>.yaml): where cells run, the scheduler settings a job
asks for, per-cell overrides, and where a site keeps its models. Checked at plan time with the
rest of the grid root (gridrun/grid/gridconfig.py); the SLURM launcher reads it back from
sweep.json through `cluster_spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gridrun.grid.errors import checked, option_file


@dataclass
class CellOverride:
    """Scheduler settings for the cells whose id matches a glob (a cluster's cell_overrides);
    unset keys keep the profile's."""

    partition: str | None = None
    time_limit_h: int | float | None = None
    cpus_per_cell: int | None = None
    mem_gb_per_cell: int | float | None = None
    constraint: str | None = None
    qos: str | None = None
    account: str | None = None
    tasks_per_cell: int | None = None
    sbatch_extra: list[str] | None = None


@dataclass
class ClusterSpec:
    """Where cells run (conf/cluster/<name>.yaml documents each key; paper.yaml is the template)."""

    name: str
    # GPU class -> scheduler partition (null or absent: none for that class); empty: no
    # scheduler (launcher=local).
    partitions: dict[str, str | None] = field(default_factory=dict)
    # GPU class -> GPU type in --gres (null: untyped gpu:<n>).
    gpu_types: dict[str, str | None] = field(default_factory=dict)
    # GPU class -> --constraint (null: none).
    constraints: dict[str, str | None] = field(default_factory=dict)
    account: str | None = None
    qos: str | None = None
    cpus_per_cell: int = 1
    mem_gb_per_cell: int | float = 4
    time_limit_h: int | float = 24
    # Data-parallel ranks per cell; null: one per GPU (one for a CPU cell).
    tasks_per_cell: int | None = None
    # Extra #SBATCH long options (--exclusive, --mail-type=FAIL).
    sbatch_extra: list[str] = field(default_factory=list)
    # Shell lines a job runs before its tasks.
    setup: list[str] = field(default_factory=list)
    # Glob on the cell id -> its own scheduler settings.
    cell_overrides: dict[str, CellOverride] = field(default_factory=dict)
    # Hub id -> a local folder holding that checkpoint, read instead of the hub cache. Where
    # the files are, not what the model is: no config.yaml or fingerprint holds it
    # (gridrun/modelfiles.py).
    model_dirs: dict[str, str] = field(default_factory=dict)
    # Refuse to submit when the venv, the results or HF_HOME sit on node-local storage (/tmp,
    # a tmpfs): false only for a cluster that is one node.
    check_shared_paths: bool = True


def cluster_spec(cluster: Mapping[str, Any], file: str | None = None) -> ClusterSpec:
    """A cluster profile (as composed, or as sweep.json records it), checked, with its defaults."""
    return checked(ClusterSpec, dict(cluster), "grid.cluster.", file or option_file("cluster", cluster))
