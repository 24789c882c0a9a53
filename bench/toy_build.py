"""Toy-world warm start: one process vs WARM_RANKS data-parallel processes, side by side.

    .venv/bin/python bench/toy_build.py --json

Both sides run the same short build (the default seed, `--steps` warm-start steps, no
stopping on accuracy) into a temporary folder, one after the other in this run: wall time
from the call to the written model, so process start-up and imports count, as they do in
a real build. The real build runs until addition "clicks" (300 steps for seed 0), so its
time is about (steps / --steps) times the measured one, start-up aside.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from gridrun.seam.runconfig import ToySpec
from gridrun.toy import build


def timed_build(ranks: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        build.build(ToySpec(target_accuracy=2.0, max_warm_steps=steps), Path(tmp) / "world", ranks=ranks)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=60, help="warm-start steps per build")
    args = parser.parse_args()
    one = timed_build(1, args.steps)
    parallel = timed_build(build.WARM_RANKS, args.steps)
    result = {
        "benchmark": "toy warm start, 1 process vs data-parallel",
        "steps": args.steps,
        "ranks": build.WARM_RANKS,
        "one_process_s": round(one, 2),
        "data_parallel_s": round(parallel, 2),
        "speedup": round(one / parallel, 2),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
