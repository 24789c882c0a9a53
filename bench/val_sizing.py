"""How many validation problems a toy curve needs for a 10-point fall to be found: measured
on the per-problem records of a finished `conf=val_sizing` sweep (gridrun/sweeps/val_sizing.yaml).

Per decoding (the sweep's variants: sampled at T 0.7, greedy), over every pair of consecutive
validations of every run:
    acc               mean validation accuracy
    rho               the correlation of one problem's outcomes at the two validations
    se_paired_pp      the SE of the fall paired by problem, at the sweep's validation size
    se_unpaired_pp    the SE of the fall from the two validations' own SEs
    val_s_per_problem the validation's wall time per problem (time/val_s over n_problems)
then, for the cliff rule over `--validations` planned validations (gridrun/seam/significance.py),
the validation size at which it finds a true 10-point fall between two given validations
with 80% power (the fall's SE must be at most 10 / (z_rule + z_0.8)), paired and unpaired,
and what that size costs per validation against today's 200 problems.

    python bench/val_sizing.py results/val_sizing [--validations 11] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

from gridrun.seam.runconfig import load_config
from gridrun.seam.rundir import RunDir
from gridrun.seam.significance import CLIFF_PP, POWER, FallRule, normal_quantile, paired_difference

TODAY = 200


def pearson(x: list[int], y: list[int]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan


def measure(sweep: Path) -> dict[str, dict[str, float]]:
    pairs: dict[str, list[dict[str, float]]] = {}
    for cell in sorted((sweep / "cells").iterdir()):
        run = RunDir(cell)
        variant = load_config(run.config_yaml).cell.variant or "default"
        records, damage = run.read_records("val")
        if damage:
            sys.exit("\n".join(damage))
        times = {r["step"]: r["time/val_s"] / r["val/n_problems"] for r in run.read_metrics() if r["split"] == "val"}
        for a, b in itertools.pairwise(sorted(records)):
            ra, rb = records[a], records[b]
            diff = paired_difference(ra, rb)
            assert diff is not None and ra.problems == rb.problems
            se_a = math.sqrt(ra.acc * (1 - ra.acc) / (len(ra.problems) - 1))
            se_b = math.sqrt(rb.acc * (1 - rb.acc) / (len(rb.problems) - 1))
            pairs.setdefault(variant, []).append({
                "acc": (ra.acc + rb.acc) / 2, "rho": pearson(list(ra.correct), list(rb.correct)),
                "se_paired_pp": 100 * diff.se, "se_unpaired_pp": 100 * math.hypot(se_a, se_b),
                "problems": len(ra.problems), "val_s_per_problem": times[b],
            })
    return {variant: {k: sum(p[k] for p in rows) / len(rows) for k in rows[0]} | {"pairs": len(rows)}
            for variant, rows in pairs.items()}


def sized(measured: dict[str, float], validations: int) -> dict[str, float]:
    """The validation size (problems) at which the rule finds a true CLIFF_PP fall with POWER."""
    rule = FallRule(validations)
    wanted_se = CLIFF_PP / (rule.z + normal_quantile(POWER))
    out = {}
    for how in ("paired", "unpaired"):
        se = measured[f"se_{how}_pp"]
        problems = math.ceil(measured["problems"] * (se / wanted_se) ** 2)
        out[f"problems_{how}"] = problems
        out[f"detectable_at_{TODAY}_{how}_pp"] = rule.detectable_pp(se * math.sqrt(measured["problems"] / TODAY))
        out[f"extra_val_s_{how}"] = (problems - TODAY) * measured["val_s_per_problem"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the results folder of conf=val_sizing")
    parser.add_argument("--validations", type=int, default=11, help="planned validations per run (the rule's K)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {variant: {**m, **sized(m, args.validations)} for variant, m in measure(args.sweep).items()}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    rule = FallRule(args.validations)
    print(f"rule: {rule.describe()}; a true {CLIFF_PP:g}-point fall found with {POWER:.0%} power needs a fall SE "
          f"<= {CLIFF_PP / (rule.z + normal_quantile(POWER)):.2f} points")
    for variant, r in result.items():
        print(f"{variant}: {r['pairs']} pairs of validations of {r['problems']:.0f} problems, acc {100 * r['acc']:.1f}%, "
              f"rho {r['rho']:.3f}, fall SE {r['se_paired_pp']:.2f} pp paired / {r['se_unpaired_pp']:.2f} unpaired, "
              f"{1000 * r['val_s_per_problem']:.1f} ms per problem")
        for how in ("paired", "unpaired"):
            print(f"  {how}: {r[f'problems_{how}']} problems (detectable at {TODAY}: "
                  f"{r[f'detectable_at_{TODAY}_{how}_pp']:.1f} pp; +{r[f'extra_val_s_{how}']:.1f} s per validation)")


if __name__ == "__main__":
    main()
