"""Benchmark planning: wall time of `gridrun sweep conf=full_matrix --dry-run`.

The whole command as a user runs it (interpreter start, imports, composing and validating
all 72 cells with Hydra's own composition, cached between cells, and drawing the plan), in a
fresh process each time, into an empty results dir. Budget: under 3 s (issue 14).

    .venv/bin/python bench/plan.py --json

Prints one JSON object: command, cells, runs, wall_s_min, wall_s_median, cpu_s_median,
budget_s, within_budget (on the median wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from wall import gridrun, summary, time_command

BUDGET_S = 3.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, GRIDRUN_RESULTS=results)
        timings, out = time_command(gridrun("sweep", "conf=full_matrix", "--dry-run"), env, args.runs)
        assert not os.listdir(results), "--dry-run wrote into the results dir"
    cells = int(out.split(" cells (")[0].rsplit("\n", 1)[-1].strip())
    result = summary("gridrun sweep conf=full_matrix --dry-run", timings, BUDGET_S, cells=cells)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
