"""`make demo`'s commands timed as a new user runs them: an empty cache, a new results folder.

    .venv/bin/python bench/demo.py --json                 this CPU's own kernels
    .venv/bin/python bench/demo.py --isa avx2 --json      torch and oneDNN held to AVX2

`--isa avx2` sets ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 for every command, so
an AVX-512 machine runs the kernels an AVX2-only CPU (no AVX-512, no native bf16) would. It
emulates the instruction set, not a slower core: a Zen 1 EPYC also has half the vector width
per cycle, so its times are longer than this one's. Each phase (toy build, sweep, status,
collect) reports its wall time and its CPU time (user + system of the processes it started);
`table1` is the collected Table 1 (peak validation accuracy per cell), so runs on different
kernels can be compared for the same numbers.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
PHASES = (
    ("toy_build", ["toy", "build"]),
    ("sweep", ["sweep", "conf=smoke", "--max-parallel", "2"]),
    ("status", ["status", "conf=smoke"]),
    ("collect", ["collect", "conf=smoke"]),
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_demo(env: dict[str, str], extra: list[str]) -> dict[str, dict[str, float]]:
    """Each phase's wall and CPU seconds, the phases run one after the other as `make demo` does."""
    timings = {}
    for name, args in PHASES:
        if name == "sweep":
            args = [*args[:2], *extra, *args[2:]]
        cpu, wall = _children_cpu(), time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gridrun.cli", *args], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"bench/demo.py: `gridrun {' '.join(args)}` failed ({done.returncode}): {done.stderr[-2000:]}")
        timings[name] = {"wall_s": round(time.perf_counter() - wall, 1), "cpu_s": round(_children_cpu() - cpu, 1)}
    return timings


def table1(results: Path) -> list[dict[str, str]]:
    """Table 1's rows as collect wrote them (table1.csv)."""
    with open(results / "smoke" / "table1.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--isa", choices=sorted(ISA_ENV), help="hold torch's and oneDNN's kernels to this level")
    parser.add_argument("overrides", nargs="*", help="extra sweep overrides (e.g. train.total_steps=2 for a quick check)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        env = {**os.environ, "GRIDRUN_RESULTS": str(results), "GRIDRUN_CACHE": str(Path(tmp) / "cache"),
               **ISA_ENV.get(args.isa or "", {})}
        phases = run_demo(env, args.overrides)
        result = {
            "benchmark": "make demo from an empty cache",
            "isa": args.isa or "native",
            "phases": phases,
            "wall_s": round(sum(p["wall_s"] for p in phases.values()), 1),
            "cpu_s": round(sum(p["cpu_s"] for p in phases.values()), 1),
            "table1": table1(results),
        }
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
