"""A stand-in for `gridrun run <run_dir>` in fast tests of the local launcher: it takes the
run's lock and records its states through the real writer (`RunDir.record`), as the trainer
does, but trains nothing: it makes `steps` steps of `step_s` seconds, then records done.

    python -m tests.grid.fake_cell <run_dir> [steps] [step_s]

A folder deleted under it makes its next record raise (NotARunDir), as under the trainer."""

from __future__ import annotations

import os
import socket
import sys
import time

from gridrun.seam import cellstate
from gridrun.seam.rundir import RunDir


def main(argv: list[str]) -> int:
    run_dir = RunDir(argv[0])
    steps = int(argv[1]) if len(argv) > 1 else 2
    step_s = float(argv[2]) if len(argv) > 2 else 0.2
    with run_dir.hold(job_id=os.environ.get("GRIDRUN_JOB_ID")):
        run_dir.record(cellstate.started(os.getpid(), socket.gethostname(), steps))
        for step in range(1, steps + 1):
            time.sleep(step_s)
            run_dir.record(cellstate.progressed(step=step))
        run_dir.record(cellstate.done())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
