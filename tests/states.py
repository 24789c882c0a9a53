"""state.json as some run left it, for test fixtures.

The code writes state.json only through the named transitions of gridrun/seam/cellstate.py
(`RunDir.record`), which refuse a change the state machine does not allow; a fixture that
needs a cell in a given state (running on a dead pid, failed twice, done with an accuracy)
writes that record directly, as a run, a crash or an older gridrun could have left it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gridrun.seam.rundir import RunDir, atomic_write_json


def put_state(run_dir: RunDir, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into the cell's state.json (planned when absent) and return it."""
    state = run_dir.read_state().to_json()
    state.update(fields, updated_at=time.time())
    atomic_write_json(run_dir.state_json, state)
    return state


def reopen(cell: Path) -> None:
    """A finished cell read as an interrupted one (preempted), so that `gridrun run` resumes
    it: done is final for `run`, and these tests resume a finished cell on purpose (more
    steps in its config, a checkpoint moved or damaged)."""
    put_state(RunDir(cell), state="preempted")
