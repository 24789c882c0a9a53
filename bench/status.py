"""Benchmark status: wall time of `gridrun status --json` over a planned grid of 1176 cells.

Plans full_matrix with 'seed=range(0,24)' (24 seeds x 48 seeded cells, transfer cells included, + 24 base = 1176)
into a temporary results dir, marks a quarter of them running or done with validation
fields (so rows carry what a live sweep shows), then times the whole command in a fresh
process. Budget: under 0.5 s.

    .venv/bin/python bench/status.py --json

Prints one JSON object: command, cells, plan_s, runs, wall_s_min, wall_s_median,
cpu_s_median, budget_s, within_budget (on the median wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from wall import gridrun, summary, time_command

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.rundir import atomic_write_json

BUDGET_S = 0.5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, GRIDRUN_RESULTS=results)
        planning, _ = time_command(gridrun("plan", "conf=full_matrix", "seed=range(0,24)"), env, 1)
        sweep = SweepDir(Path(results), "full_matrix")
        for i, cell_id in enumerate(sweep.cell_ids()[::4]):
            # As a live sweep leaves them (written whole: no transition leads from planned to these).
            run_dir = sweep.cell(cell_id)
            atomic_write_json(run_dir.state_json, {
                **run_dir.read_state(), "state": "done" if i % 2 else "running", "step": 250, "total_steps": 500,
                "started_at": time.time() - 3600, "last_val_acc": 0.4, "peak_val_acc": 0.45, "peak_step": 200,
                "alerts": [], "attempt": 1, "job_id": str(1000 + i),
            })
        timings, out = time_command(gridrun("status", "--json"), env, args.runs)
    result = summary("gridrun status --json", timings, BUDGET_S, cells=len(json.loads(out)), plan_s=round(planning.wall_s[0], 2))
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
