"""The Launcher interface and the registry of launchers: how queued cells become running
`gridrun run <run_dir>` processes.

    admit(sweep, ids) -> ids             under the lock, before anything is queued: checks the
                                         launcher's settings (raises GridError) and may hold
                                         cells back (an attempt cap)
    submit(sweep, ids, accepted) -> {id: job_id}  under the sweep's lock; returns quickly;
                                         a scheduler calls `accepted` with each batch's ids as
                                         the scheduler takes it, and raises PartlySubmitted
                                         when it refuses one midway (a per-user job limit)
    wait(sweep, ids) -> exit code        after the lock is released; blocking launchers
                                         (local) run the cells here, schedulers return
    reconcile(states) -> {id: (state, why)}  cells whose state.json says queued/running but
                                         whose job is gone (killed, lost node, preempted); a
                                         result equal to the cell's state is no change, only
                                         the scheduler's word for it (shown by `gridrun status`;
                                         gridrun/grid/launchers/observe.py asks it)
    cancel(sweep, ids)                   under the lock; the cells end as cancelled

A launcher is named in conf/launcher/<name>.yaml and registered in LAUNCHERS; a SLURM
launcher (submitit) plugs in the same way. Every launcher starts a cell's process the same
way (gridrun/grid/launchers/process.py). Left out: queueing (dispatch.py) and what a cell's
state really is (gridrun/grid/launchers/observe.py). Stdlib only: `gridrun status` imports this.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from gridrun.grid.errors import GridError, checked, option_file

if TYPE_CHECKING:
    from gridrun.grid.sweepdir import SweepDir
    from gridrun.seam.cellstate import StateRecord

# Called with each batch of {cell id: job id} as the scheduler accepts it (dispatch records them).
Accepted = Callable[[Mapping[str, str]], None]


class PartlySubmitted(GridError):
    """The scheduler refused a batch after accepting others: `left` were not submitted
    (the refused batch and every one after it), `reason` is the scheduler's own line."""

    def __init__(self, left: list[str], reason: str) -> None:
        super().__init__(reason)
        self.left = left
        self.reason = reason

@dataclass
class LauncherSettings:
    """A launcher's settings; each launcher extends it with its own, beside its class
    (local.py's LocalSettings, slurm.py's SlurmSettings), their defaults written there only:
    gridrun/grid/compose.py stores them with Hydra as schema/launcher/<name>, which
    conf/launcher/<name>.yaml places under itself (its defaults list) and names the launcher."""

    name: str
    # Cells (local) or array elements (slurm) running at once; null: the launcher's choice.
    max_parallel: int | None = None


S = TypeVar("S", bound=LauncherSettings)


def launcher_settings(launcher: Mapping[str, Any], settings_type: type[S], file: str | None = None) -> S:
    """A launcher's settings (as composed, or as sweep.json and --max-parallel give them), checked."""
    return checked(settings_type, dict(launcher), "grid.launcher.", file or option_file("launcher", launcher))


# name -> "module:Class"; imported when a cell of that launcher is touched, and by the
# composer (gridrun/grid/compose.py), which stores each one's settings with Hydra.
LAUNCHERS: dict[str, str] = {
    "local": "gridrun.grid.launchers.local:LocalLauncher",
    "slurm": "gridrun.grid.launchers.slurm:SlurmLauncher",
}


class Launcher(ABC):
    name: ClassVar[str]
    # Whether a free run lock means the cell's job is over (`live_state`); False for a
    # scheduler that may requeue a killed job, whose own word `reconcile` asks for.
    lock_is_liveness: ClassVar[bool] = True
    # The settings its conf/launcher/<name>.yaml may hold, checked at plan time.
    settings_type: ClassVar[type[LauncherSettings]] = LauncherSettings

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)

    def admit(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        """The cells to queue, before any is marked queued; raise GridError to refuse them all."""
        return ids

    @abstractmethod
    def submit(self, sweep: SweepDir, ids: list[str], accepted: Accepted | None = None) -> dict[str, str]:
        """Hand queued cells to the scheduler; return each one's job id. Under the lock."""

    def wait(self, sweep: SweepDir, ids: list[str]) -> int:
        """Run or watch the submitted cells until they end (blocking launchers); 0 if all done."""
        return 0

    @classmethod
    @abstractmethod
    def reconcile(cls, states: Mapping[str, StateRecord]) -> dict[str, tuple[str, str]]:
        """For active cells (id -> state.json), those whose job is gone: id -> (state, why)."""

    @abstractmethod
    def cancel(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        """Stop these active cells' jobs; returns a line per cell saying what was done."""


def launcher_class(name: str) -> type[Launcher]:
    if name not in LAUNCHERS:
        raise GridError(f"no launcher '{name}' (registered: {', '.join(LAUNCHERS)}): set launcher=<one of them>")
    module, _, name_in_module = LAUNCHERS[name].partition(":")
    cls: type[Launcher] = getattr(importlib.import_module(module), name_in_module)
    return cls


def make_launcher(settings: Mapping[str, Any]) -> Launcher:
    """The launcher named by settings['name'] (conf/launcher/<name>.yaml, as in sweep.json)."""
    return launcher_class(str(settings.get("name", "local")))(settings)
