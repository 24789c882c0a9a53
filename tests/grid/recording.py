"""A launcher that runs nothing and records what it was handed (a test double for the
queueing logic; the local launcher's own tests run the real trainer)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gridrun.grid.launchers.base import Accepted, Launcher
from gridrun.grid.launchers.local import LocalSettings
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam import cellstate
from gridrun.seam.cellstate import StateRecord


@dataclass
class RecordingSettings(LocalSettings):
    """conf/launcher/local.yaml's keys (tests plan with grid.launcher.name=record over it)."""

    name: str = "record"
    # Seconds each submission takes.
    delay_s: float = 0.0


class RecordingLauncher(Launcher):
    name = "record"
    settings_type = RecordingSettings

    def submit(self, sweep: SweepDir, ids: list[str], accepted: Accepted | None = None) -> dict[str, str]:
        # A slow scheduler widens the window in which a second submitter could slip in.
        time.sleep(float(self.settings.get("delay_s", 0.0)))
        with open(sweep.root / "submissions.jsonl", "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "ids": ids}) + "\n")
        return {cell_id: f"rec-{os.getpid()}" for cell_id in ids}

    @classmethod
    def reconcile(cls, states: Mapping[str, StateRecord]) -> dict[str, tuple[str, str]]:
        return {}

    def cancel(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        for cell_id in ids:
            sweep.cell(cell_id).record(cellstate.cancelled("cancelled by the recording launcher"))
        return [f"{cell_id}: cancelled" for cell_id in ids]


def submissions(sweep: SweepDir) -> list[dict[str, Any]]:
    path = sweep.root / "submissions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
