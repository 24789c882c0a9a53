"""One cell's metrics as columns, and the per-cell statistics of cells.parquet.

`MetricColumns.from_rows` turns a cell's metrics.jsonl rows (as `RunDir.read_metrics`
returns them) into one (steps, values) column per metric and split, in one pass; the long
metrics.parquet, the per-cell summary and the figures' curves are all read off these
columns, so a cell's file is parsed once.

`cell_summary` computes, from those columns (the names are cells.parquet's):

    val_acc_step0, peak_val_acc, peak_step,   validation accuracy at step 0, its maximum
    final_val_acc, final_step                 (first step reaching it) and its last value
    drop_from_peak                            final - peak (<= 0; the floor under the ceiling)
    cliff_drop, cliff_step                    the most negative change between consecutive
                                              validations and the step after it (0.0 and no
                                              step when accuracy never fell)
    train_acc_start, train_acc_peak,          training success rate (`reward/acc`): first,
    train_acc_end                             highest and last training step
    max_chi2                                  max over steps and roles of `role/<r>/chi2`
    max_grad_norm                             max over steps and adapters of `adapter/<a>/grad_norm`
    entropy_collapse                          first - minimum of the step's entropy (roles'
                                              `role/<r>/entropy` weighted by their tokens)
    role/<r>/{chi2,ppl,grad_norm}_ratio       Table 2: peak over the first training step's value
    role/<r>/chi2_peak_step                   the step of that role's largest chi2
    role/<r>/opt_steps                        the role's optimizer steps per training step (mean)
    adapter/<a>/{...same four}                the same for a cell's one adapter when it serves
                                              several roles (Shared-Policy): chi2 and ppl
                                              weighted by each role's tokens, the adapter's
                                              own grad norm

Metrics are read by name and may be missing (an older trainer, another workflow): a
statistic without its metric is None. A ratio whose first value is not positive is None
(a ratio to zero says nothing). What this leaves out: smoothing (every statistic is of the
logged values) and anything needing the samples/ files.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Column = tuple[list[int], list[float]]  # steps, values (in logging order)
ROLE_KEY = re.compile(r"^role/([^/]+)/([^/]+)$")
ADAPTER_KEY = re.compile(r"^adapter/([^/]+)/([^/]+)$")
RATIO_METRICS = ("chi2", "ppl", "grad_norm")


@dataclass
class MetricColumns:
    """A cell's numeric metrics: split -> metric -> (steps, values)."""

    splits: dict[str, dict[str, Column]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> MetricColumns:
        splits: dict[str, dict[str, Column]] = {}
        for row in rows:
            step = row.get("step")
            if not isinstance(step, int):
                continue
            columns = splits.setdefault(str(row.get("split", "train")), {})
            for key, value in row.items():
                # bool is an int: a flag would become 0/1, which no statistic here wants.
                if type(value) is float or (type(value) is int and key != "step"):
                    column = columns.get(key)
                    if column is None:
                        column = columns[key] = ([], [])
                    column[0].append(step)
                    column[1].append(float(value))
        return cls(splits)

    def column(self, split: str, metric: str) -> Column:
        return self.splits.get(split, {}).get(metric, ([], []))

    def metrics(self, split: str) -> list[str]:
        return list(self.splits.get(split, {}))

    def series(self, split: str, metric: str) -> dict[int, float]:
        """step -> value, finite values only (a later row for a step wins)."""
        steps, values = self.column(split, metric)
        return {s: v for s, v in zip(steps, values) if math.isfinite(v)}

    def roles(self) -> list[str]:
        """Roles with training metrics, in first-logged order."""
        return list(dict.fromkeys(m.group(1) for key in self.metrics("train") if (m := ROLE_KEY.match(key))))

    def adapters(self) -> list[str]:
        return list(dict.fromkeys(m.group(1) for key in self.metrics("train") if (m := ADAPTER_KEY.match(key))))


# --- validation accuracy -----------------------------------------------------------------------
def accuracy_summary(val_acc: Mapping[int, float]) -> dict[str, Any]:
    """Step-0, peak, final accuracy, drop from peak and the cliff of a step -> accuracy series."""
    if not val_acc:
        keys = ("val_acc_step0", "peak_val_acc", "peak_step", "final_val_acc", "final_step",
                "drop_from_peak", "cliff_drop", "cliff_step")
        return dict.fromkeys(keys)
    steps = sorted(val_acc)
    peak_step = min(steps, key=lambda s: (-val_acc[s], s))  # the first step reaching the peak
    final_step = steps[-1]
    cliff_drop, cliff_step = cliff(val_acc)
    return {
        "val_acc_step0": val_acc.get(0),
        "peak_val_acc": val_acc[peak_step],
        "peak_step": peak_step,
        "final_val_acc": val_acc[final_step],
        "final_step": final_step,
        "drop_from_peak": val_acc[final_step] - val_acc[peak_step],
        "cliff_drop": cliff_drop,
        "cliff_step": cliff_step,
    }


def cliff(val_acc: Mapping[int, float]) -> tuple[float | None, int | None]:
    """The most negative change between consecutive validations and the step it lands on;
    (0.0, None) when accuracy never fell, (None, None) with fewer than two validations."""
    steps = sorted(val_acc)
    if len(steps) < 2:
        return None, None
    change, step = min(((val_acc[b] - val_acc[a], b) for a, b in itertools.pairwise(steps)), key=lambda c: (c[0], c[1]))
    return (change, step) if change < 0 else (0.0, None)


# --- training-side amplitudes (Fig. 5) and Table 2 ratios ---------------------------------------
def _max(values: Iterable[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) if finite else None


def token_weighted(columns: MetricColumns, roles: list[str], metric: str) -> dict[int, float]:
    """step -> the roles' `metric` averaged with their token counts as weights (plain mean
    at a step where a role's token count is missing)."""
    per_role = [(columns.series("train", f"role/{r}/{metric}"), columns.series("train", f"role/{r}/tokens")) for r in roles]
    steps = sorted({s for values, _ in per_role for s in values})
    out = {}
    for step in steps:
        pairs = [(values[step], tokens.get(step)) for values, tokens in per_role if step in values]
        if all(t is not None and t > 0 for _, t in pairs):
            total = sum(t for _, t in pairs)  # type: ignore[misc]
            out[step] = sum(v * t for v, t in pairs) / total  # type: ignore[operator]
        else:
            out[step] = sum(v for v, _ in pairs) / len(pairs)
    return out


def peak_over_first(series: Mapping[int, float]) -> tuple[float | None, int | None]:
    """(max / value at the first step, step of the max); None ratio when the first is not > 0."""
    if not series:
        return None, None
    steps = sorted(series)
    peak_step = min(steps, key=lambda s: (-series[s], s))
    first = series[steps[0]]
    return (series[peak_step] / first if first > 0 else None), peak_step


def ratio_columns(prefix: str, chi2: Mapping[int, float], ppl: Mapping[int, float], grad_norm: Mapping[int, float]) -> dict[str, Any]:
    chi2_ratio, chi2_peak_step = peak_over_first(chi2)
    return {
        f"{prefix}/chi2_ratio": chi2_ratio,
        f"{prefix}/ppl_ratio": peak_over_first(ppl)[0],
        f"{prefix}/grad_norm_ratio": peak_over_first(grad_norm)[0],
        f"{prefix}/chi2_peak_step": chi2_peak_step,
    }


def training_summary(columns: MetricColumns) -> dict[str, Any]:
    """Training success rate, the Fig. 5 amplitudes and the Table 2 ratios of one cell."""
    roles, adapters = columns.roles(), columns.adapters()
    reward = columns.series("train", "reward/acc")
    steps = sorted(reward)
    entropy = token_weighted(columns, roles, "entropy")
    entropy_steps = sorted(entropy)
    out: dict[str, Any] = {
        "train_acc_start": reward[steps[0]] if steps else None,
        "train_acc_peak": max(reward.values()) if reward else None,
        "train_acc_end": reward[steps[-1]] if steps else None,
        "max_chi2": _max(v for r in roles for v in columns.series("train", f"role/{r}/chi2").values()),
        "max_grad_norm": _max(v for a in adapters for v in columns.series("train", f"adapter/{a}/grad_norm").values()),
        "entropy_collapse": entropy[entropy_steps[0]] - min(entropy.values()) if entropy else None,
    }
    for role in roles:
        opt_steps = columns.series("train", f"role/{role}/opt_steps")
        out[f"role/{role}/opt_steps"] = sum(opt_steps.values()) / len(opt_steps) if opt_steps else None
        out.update(ratio_columns(
            f"role/{role}",
            *(columns.series("train", f"role/{role}/{metric}") for metric in RATIO_METRICS),
        ))
    if len(adapters) == 1 and len(roles) > 1:
        (adapter,) = adapters
        out.update(ratio_columns(
            f"adapter/{adapter}",
            token_weighted(columns, roles, "chi2"),
            token_weighted(columns, roles, "ppl"),
            columns.series("train", f"adapter/{adapter}/grad_norm"),
        ))
    return out


def cell_summary(columns: MetricColumns) -> dict[str, Any]:
    """Every per-cell statistic of cells.parquet (see the module docstring)."""
    return {**accuracy_summary(columns.series("val", "val/acc")), **training_summary(columns)}


# --- cost -----------------------------------------------------------------------------------------
def cell_hours(state: Mapping[str, Any], now: float) -> float:
    """Wall-clock hours over every attempt of a cell (a running one counts up to now)."""
    attempts = [*(state.get("attempts") or []), state]
    seconds = 0.0
    for attempt in attempts:
        started = attempt.get("started_at")
        if started is None:
            continue
        ended = attempt.get("finished_at")
        if ended is None:
            ended = now if attempt is state and state.get("state") == "running" else attempt.get("updated_at", started)
        seconds += max(0.0, float(ended) - float(started))
    return seconds / 3600
