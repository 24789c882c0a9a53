"""Benchmark collect: wall time of `gridrun collect` over a synthetic 1176-cell sweep whose
1008 training cells logged 500 steps each.

Plans full_matrix with 'seed=range(0,24)' (24 seeds x 48 seeded cells, transfer cells included, + 24 base = 1176)
into a temporary results dir, then writes every cell's state.json (done, one hour) and a
metrics.jsonl shaped like the trainer's: per training step the globals, `adapter/<a>/...`
and 14 `role/<role>/...` metrics per role of the cell's workflow; a validation row every 10
steps with accuracy and every role's signatures (base cells: step 0 only). Values are a
seeded random walk, so cliffs, ratios and flags have something to find. Then times the
whole command (tables, figures, report included) in a fresh process. Budget: under 30 s.

    .venv/bin/python bench/collect.py --json

Prints one JSON object: command, cells, metric_rows (lines of metrics.jsonl), long_rows
(rows of metrics.parquet), write_s, load_1min (the machine's load average before timing,
which matters on a shared machine), cpus, runs, wall_s_min, wall_s_median, cpu_s_median
(collect and its worker processes), budget_s, within_budget.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from wall import gridrun, summary, time_command

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.rundir import atomic_write_json

BUDGET_S = 30.0
STEPS = 500
VAL_EVERY = 10
ROLES = {
    "single": ("generator",),
    "eval_opt": ("generator", "evaluator"),
    "voting": ("generator", "aggregator"),
    "orch_workers": ("orchestrator", "worker", "synthesizer"),
}
ROLE_METRICS = ("tokens", "token_share", "grad_share", "grad_norm", "loss", "chi2", "chi2_centered", "ppl", "entropy",
                "clip_frac", "len_mean", "trunc_rate", "rollout_logp_absdiff", "opt_steps")
SIGNATURES = ("len_mean", "len_p50", "len_p95", "trunc_rate", "box_rate", "hedge_rate")


def metric_lines(kind: str, coords: dict, rng: random.Random) -> list[str]:
    roles = ROLES["single" if kind == "sa_rl" else coords["workflow"]]
    adapters = ("shared",) if coords.get("policy") == "shared" else roles
    acc = rng.uniform(0.2, 0.5)
    val = [{"step": 0, "split": "val", "val/acc": acc,
            **{f"val/role/{r}/{m}": rng.random() for r in roles for m in SIGNATURES}}]
    if kind == "base":
        return [json.dumps(row, sort_keys=True) for row in val]
    rows = []
    for step in range(1, STEPS + 1):
        acc = min(1.0, max(0.0, acc + rng.gauss(0.001, 0.01)))
        row = {"step": step, "split": "train", "lr": 1e-5, "reward/acc": acc, "reward/mean": acc,
               "time/step_s": 30.0, "adv/groups": 64}
        for adapter in adapters:
            row[f"adapter/{adapter}/grad_norm"] = rng.uniform(0.1, 1.0)
            row[f"adapter/{adapter}/opt_steps"] = 1
        shares = [rng.uniform(0.5, 1.5) for _ in roles]
        for role, share in zip(roles, shares, strict=True):
            row.update({f"role/{role}/{m}": rng.uniform(0.5, 2.0) for m in ROLE_METRICS})
            row[f"role/{role}/token_share"] = row[f"role/{role}/grad_share"] = share / sum(shares)
        rows.append(row)
        if step % VAL_EVERY == 0:
            rows.append({"step": step, "split": "val", "val/acc": acc,
                         **{f"val/role/{r}/{m}": rng.random() for r in roles for m in SIGNATURES}})
    return [json.dumps(row, sort_keys=True) for row in val + rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, GRIDRUN_RESULTS=results)
        time_command(gridrun("plan", "conf=full_matrix", "seed=range(0,24)"), env, 1)
        sweep = SweepDir(Path(results), "full_matrix")
        started = time.perf_counter()
        rng = random.Random(0)
        lines = 0
        for cell in sweep.read()["cells"]:
            run_dir = sweep.cell(cell["id"])
            atomic_write_json(run_dir.state_json, {"state": "done", "step": STEPS, "total_steps": STEPS, "attempt": 1,
                                                   "started_at": 0.0, "finished_at": 3600.0})
            text = metric_lines(cell["kind"], cell["coords"], rng)
            run_dir.metrics_jsonl.write_text("\n".join(text) + "\n")
            lines += len(text)
        write_s = time.perf_counter() - started
        load = os.getloadavg()[0]
        timings, _ = time_command(gridrun("collect", "conf=full_matrix"), env, args.runs)
        import pandas as pd

        long_rows = len(pd.read_parquet(sweep.metrics_parquet, columns=["step"]))
        result = summary("gridrun collect conf=full_matrix", timings, BUDGET_S, cells=len(sweep.cell_ids()),
                         metric_rows=lines, long_rows=long_rows, write_s=round(write_s, 1), load_1min=round(load, 2),
                         cpus=os.cpu_count())
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
