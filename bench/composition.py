"""Benchmark composition: gridrun's composer against Hydra's public `compose`, in one run.

Both compose every group combination the full matrix plans (48; seeds change only the `cell`
node, so the dry run composes each combination once), in one process, after one warm-up
composition each: gridrun's `Composer` (Hydra's steps from hydra._internal, with the parsed
files, loaded entries and defaults lists cached between cells) and `hydra.compose` under one
`initialize_config_dir`, which is all the caching Hydra's public API allows (it rebuilds its
own config, the defaults list and every file's node on each call). The dry run's budget is
3 s for the whole command (bench/plan.py); this is why gridrun/grid/compose.py stays on the
private calls and pyproject.toml pins hydra-core below 1.4.

    .venv/bin/python bench/composition.py --json

Prints one JSON object: combinations, runs, the median wall and CPU seconds of the 48
compositions for each (composer_s_median, hydra_compose_s_median, composer_cpu_s_median,
hydra_compose_cpu_s_median), cpu_ratio, budget_s, cpu_count, load_1min.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gridrun.grid.cells import expand
from gridrun.grid.compose import CONF_DIR, Composer
from gridrun.grid.spec import load_spec

BUDGET_S = 3.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    spec = load_spec("full_matrix", [], Composer())
    combinations = list(dict.fromkeys(tuple(c.group_choices()) for c in expand(spec.axes, spec.restrict)))
    # (wall, CPU) seconds of each run; CPU time does not depend on how busy a shared machine is.
    ours: list[tuple[float, float]] = []
    public: list[tuple[float, float]] = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        compose("config", overrides=list(combinations[0]))  # Hydra's plugins discovered once
        for _ in range(args.runs):
            # A fresh composer each run, as each `gridrun plan` process has (its caches start empty).
            started, cpu = time.perf_counter(), time.process_time()
            composer = Composer()
            for choices in combinations:
                composer.compose(list(choices))
            ours.append((time.perf_counter() - started, time.process_time() - cpu))
            started, cpu = time.perf_counter(), time.process_time()
            for choices in combinations:
                OmegaConf.to_container(compose("config", overrides=list(choices)), resolve=True)
            public.append((time.perf_counter() - started, time.process_time() - cpu))
    result = {
        "combinations": len(combinations),
        "runs": args.runs,
        "composer_s_median": _median(ours, 0),
        "hydra_compose_s_median": _median(public, 0),
        "composer_cpu_s_median": _median(ours, 1),
        "hydra_compose_cpu_s_median": _median(public, 1),
        "cpu_ratio": round(_median(public, 1) / _median(ours, 1), 1),
        "budget_s": BUDGET_S,
        "cpu_count": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


def _median(runs: list[tuple[float, float]], which: int) -> float:
    return round(statistics.median(run[which] for run in runs), 3)


if __name__ == "__main__":
    sys.exit(main())
