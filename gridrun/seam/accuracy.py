"""What a validation accuracy is, read from metric rows: which metric keys are accuracies
(fractions of problems right, so in [0, 1]), a run's step -> `val/acc`, and its peak.

The one definition of a cell's peak (Table 1's ceiling, the checkpoint kept by merit, the
adapter `gridrun export --step peak` finds): the trainer, `gridrun collect` and the adapter
lookup all take it from here. A seam module (standard library only): both halves import it.
Left out: reading and validating metrics.jsonl (gridrun/seam/rundir.py, which asks `is_accuracy`
whether a value must lie in [0, 1]) and every other metric's meaning (gridrun/seam/mechanisms.py,
gridrun/analysis/summary.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def is_accuracy(key: str) -> bool:
    """Whether a metric is a fraction of problems right: `val/acc`, `val/pass@3`, a role's
    `acc`, the evaluator's `verdict_acc`, the aggregator's `select_acc`."""
    name = key.rsplit("/", 1)[-1]
    return name == "acc" or name.endswith("_acc") or name.startswith("pass@")


def val_accuracy(rows: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """step -> validation accuracy (`val/acc`) of metrics rows, finite values only, a later
    row for a step winning (as `gridrun collect` reads them)."""
    return {
        row["step"]: float(row["val/acc"])
        for row in rows
        if row["split"] == "val" and row.get("val/acc") is not None and math.isfinite(row["val/acc"])
    }


def first_peak(val_acc: Mapping[int, float]) -> tuple[int, float] | None:
    """(step, accuracy) of the highest validation accuracy, at the first step reaching it;
    None without validations. The one definition of a cell's peak: metrics.jsonl is its one
    source (`gridrun collect` reads it there; state.json carries the trainer's copy, derived
    from the same rows, because `gridrun status` must not read every cell's metrics)."""
    if not val_acc:
        return None
    step = min(val_acc, key=lambda s: (-val_acc[s], s))
    return step, val_acc[step]
