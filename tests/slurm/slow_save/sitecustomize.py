"""Slow checkpoint storage for the jobs of tests/slurm/test_launcher.py's slow-save tests.

Python imports `sitecustomize` at start-up from PYTHONPATH, so a job whose PYTHONPATH starts
with this folder fsyncs every checkpoint's trainer.pt GRIDRUN_TEST_SLOW_SAVE_S seconds longer,
as writing a real adapter + optimizer checkpoint to shared storage does (the plan budgets
120 s for one). gridrun itself knows nothing of it: only os.fsync is wrapped.
"""

from __future__ import annotations

import os
import re
import time

DELAY_S = float(os.environ.get("GRIDRUN_TEST_SLOW_SAVE_S", "10"))
# The last file of a checkpoint written into its temporary folder (gridrun/train/checkpoint.py).
SAVING = re.compile(r"/\.step_\d+\.tmp/trainer\.pt$")
_fsync = os.fsync


def _slow_fsync(fd: int) -> None:
    _fsync(fd)
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return
    if SAVING.search(path):
        time.sleep(DELAY_S)


os.fsync = _slow_fsync
