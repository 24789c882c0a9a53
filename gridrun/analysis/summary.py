"""One cell's metrics as columns, and the per-cell statistics of cells.parquet.

`MetricColumns.from_rows` turns a cell's metrics.jsonl rows (as `RunDir.read_metrics`
returns them) into one (steps, values) column per metric and split, in one pass; the long
metrics.parquet, the per-cell summary and the figures' curves are all read off these
columns, so a cell's file is parsed once.

`cell_summary` computes, from those columns (the names are cells.parquet's):

    val_acc_step0, peak_val_acc, peak_step,   validation accuracy at step 0, its maximum
    final_val_acc, final_step                 (first step reaching it) and its last value
    drop_from_peak                            final - peak (<= 0; the floor under the ceiling)
    peak_test_acc, peak_test_se               the test evaluation of the peak's checkpoint (the
                                              row `split: test` at peak_step; None without one:
                                              a run from before the test split, or no test data)
    selection_bias_pp                         peak_val_acc - peak_test_acc in points: what
                                              choosing the peak on val added to its number
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
                                              (chi2: over its first value above the alerts'
                                              chi2_floor: under a warmup from 0 the first
                                              update is on-policy, chi2 0, where verl's
                                              carries the train-inference mismatch)
    role/<r>/chi2_peak_step                   the step of that role's largest chi2
    role/<r>/opt_steps                        the role's optimizer steps per training step (mean)
    adapter/<a>/{...same four}                the same for a cell's one adapter when it serves
                                              several roles (Shared-Policy): chi2 and ppl
                                              weighted by each role's tokens, the adapter's
                                              own grad norm
    val/role/<r>/{len_mean,terse_rate}_change last - first validation of the signature
                                              (the findings' claim d)

`alert_summary` replays a cell's rows through the alerts (gridrun/seam/mechanisms.py: the two
mechanisms, signature_drift, non_finite) and gives, per alert that can show in the cell
(else None):
alert/<m>/fired (training steps at which it held), alert/<m>/steps (steps replayed),
alert/<m>/first_step; and `mechanism_alerts`, those holding at the last step.

Metrics are read by name and may be missing (an older trainer, another workflow): a
statistic without its metric is None. A ratio whose first value is not positive is None
(a ratio to zero says nothing). What this leaves out: smoothing (every statistic is of the
logged values) and anything needing the samples/ files.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gridrun.seam.accuracy import first_peak
from gridrun.seam.cellstate import CellState, StateRecord
from gridrun.seam.mechanisms import ALERTS, THRESHOLDS, Groups, Thresholds, alert_history, applies, firings
from gridrun.seam.metric_keys import VAL_ROLE, adapter_key, adapter_prefix, parse_role_key, role_key, role_prefix
from gridrun.seam.routing import grouping
from gridrun.seam.runconfig import ConfigError, load_config
from gridrun.seam.rundir import RunDir

Column = tuple["np.ndarray", "np.ndarray"]  # steps (int64), values (float64), sorted by step
ADAPTER_KEY = re.compile(r"^adapter/([^/]+)/([^/]+)$")
RATIO_METRICS = ("chi2", "ppl", "grad_norm")
SIGNATURE_CHANGES = ("len_mean", "terse_rate")
NOT_METRICS = ("step", "split")


def _empty() -> Column:
    return np.zeros(0, dtype=np.int64), np.zeros(0)


@dataclass
class MetricColumns:
    """A cell's numeric metrics: split -> metric -> (steps, values). Missing and non-numeric
    values (None, strings, flags) are left out."""

    splits: dict[str, dict[str, Column]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> MetricColumns:
        # Rows of one split mostly share their keys (and metrics.jsonl sorts them): group rows
        # by key tuple and transpose each group with zip, so no per-value Python loop runs.
        groups: dict[tuple[str, tuple[str, ...]], list[tuple[Any, ...]]] = {}
        for row in rows:
            if type(row.get("step")) is int:
                groups.setdefault((str(row.get("split", "train")), tuple(row)), []).append(tuple(row.values()))
        parts: dict[str, dict[str, list[Column]]] = {}
        for (split, keys), values in groups.items():
            transposed = list(zip(*values, strict=True))
            steps = np.asarray(transposed[keys.index("step")], dtype=np.int64)
            for key, column in zip(keys, transposed, strict=True):
                if key in NOT_METRICS or isinstance(column[0], bool):
                    continue
                try:
                    numbers = np.asarray(column, dtype=np.float64)  # None -> nan
                except (TypeError, ValueError):
                    continue  # text
                kept = ~np.isnan(numbers)
                parts.setdefault(split, {}).setdefault(key, []).append((steps[kept], numbers[kept]))
        splits: dict[str, dict[str, Column]] = {}
        for split, by_metric in parts.items():
            for key, pieces in by_metric.items():
                if len(pieces) == 1:
                    splits.setdefault(split, {})[key] = pieces[0]
                    continue
                steps = np.concatenate([p[0] for p in pieces])
                order = np.argsort(steps, kind="stable")
                splits.setdefault(split, {})[key] = (steps[order], np.concatenate([p[1] for p in pieces])[order])
        return cls(splits)

    def column(self, split: str, metric: str) -> Column:
        return self.splits.get(split, {}).get(metric) or _empty()

    def metrics(self, split: str) -> list[str]:
        return list(self.splits.get(split, {}))

    def series(self, split: str, metric: str) -> dict[int, float]:
        """step -> value, finite values only (a later row for a step wins)."""
        steps, values = self.column(split, metric)
        kept = np.isfinite(values)
        return dict(zip(steps[kept].tolist(), values[kept].tolist(), strict=True))

    def roles(self) -> list[str]:
        """Roles with training metrics, in first-logged order."""
        return list(dict.fromkeys(m[0] for key in self.metrics("train") if (m := parse_role_key(key))))

    def adapters(self) -> list[str]:
        return list(dict.fromkeys(m.group(1) for key in self.metrics("train") if (m := ADAPTER_KEY.match(key))))


# --- validation accuracy -----------------------------------------------------------------------
def accuracy_summary(val_acc: Mapping[int, float]) -> dict[str, Any]:
    """Step-0, peak, final accuracy, drop from peak and the cliff of a step -> accuracy series."""
    peak = first_peak(val_acc)
    if peak is None:
        keys = ("val_acc_step0", "peak_val_acc", "peak_step", "final_val_acc", "final_step",
                "drop_from_peak", "cliff_drop", "cliff_step")
        return dict.fromkeys(keys)
    peak_step = peak[0]
    steps = sorted(val_acc)
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
def _finite(columns: MetricColumns, metric: str) -> Column:
    steps, values = columns.column("train", metric)
    kept = np.isfinite(values)
    return steps[kept], values[kept]


def _max(columns: MetricColumns, metrics: Iterable[str]) -> float | None:
    values = [v for m in metrics if len(v := _finite(columns, m)[1])]
    return float(max(v.max() for v in values)) if values else None


def token_weighted(columns: MetricColumns, roles: list[str], metric: str) -> Column:
    """(steps, the roles' `metric` averaged with their token counts as weights); the plain
    mean at a step where a present role's token count is missing or zero."""
    present = [(r, _finite(columns, role_key(r, metric))) for r in roles]
    present = [(r, c) for r, c in present if len(c[0])]
    if not present:
        return _empty()
    steps = np.unique(np.concatenate([c[0] for _, c in present]))
    values = np.full((len(present), len(steps)), np.nan)
    weights = np.full_like(values, np.nan)
    for i, (role, (role_steps, role_values)) in enumerate(present):
        values[i, np.searchsorted(steps, role_steps)] = role_values
        token_steps, tokens = _finite(columns, role_key(role, "tokens"))
        weights[i, np.searchsorted(steps, token_steps)] = tokens
    logged = ~np.isnan(values)
    weighted_ok = np.all(~logged | (weights > 0), axis=0)
    filled, mass = np.where(logged, values, 0.0), np.where(logged & weighted_ok, np.nan_to_num(weights), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        weighted = (filled * mass).sum(axis=0) / mass.sum(axis=0)
        plain = filled.sum(axis=0) / logged.sum(axis=0)
    return steps, np.where(weighted_ok, weighted, plain)


def peak_over_first(column: Column, floor: float | None = None) -> tuple[float | None, int | None]:
    """(max / value at the first step, step of the max); None ratio when the first is not > 0.
    With a `floor` (chi2's): the first value above it is the baseline and the max counts as at
    least the floor, as the gradient_amplification alert reads them; a column never above
    the floor (always on-policy) has ratio 1."""
    steps, values = column
    kept = np.isfinite(values)
    steps, values = steps[kept], values[kept]
    if not len(steps):
        return None, None
    peak = int(np.argmax(values))  # the first step reaching the max
    if floor is not None:
        above = np.flatnonzero(values > floor)
        return (max(float(values[peak]), floor) / float(values[above[0]]) if len(above) else 1.0), int(steps[peak])
    first = float(values[0])
    return (float(values[peak]) / first if first > 0 else None), int(steps[peak])


def ratio_columns(prefix: str, chi2: Column, ppl: Column, grad_norm: Column) -> dict[str, Any]:
    """Table 2's columns of a role or adapter (`prefix`: role_prefix or adapter_prefix)."""
    chi2_ratio, chi2_peak_step = peak_over_first(chi2, THRESHOLDS.chi2_floor)
    return {
        f"{prefix}chi2_ratio": chi2_ratio,
        f"{prefix}ppl_ratio": peak_over_first(ppl)[0],
        f"{prefix}grad_norm_ratio": peak_over_first(grad_norm)[0],
        f"{prefix}chi2_peak_step": chi2_peak_step,
    }


def training_summary(columns: MetricColumns) -> dict[str, Any]:
    """Training success rate, the Fig. 5 amplitudes and the Table 2 ratios of one cell."""
    roles, adapters = columns.roles(), columns.adapters()
    reward = _finite(columns, "reward/acc")[1]
    entropy = token_weighted(columns, roles, "entropy")[1]
    out: dict[str, Any] = {
        "train_acc_start": float(reward[0]) if len(reward) else None,
        "train_acc_peak": float(reward.max()) if len(reward) else None,
        "train_acc_end": float(reward[-1]) if len(reward) else None,
        "max_chi2": _max(columns, (role_key(r, "chi2") for r in roles)),
        "max_grad_norm": _max(columns, (adapter_key(a, "grad_norm") for a in adapters)),
        "entropy_collapse": float(entropy[0] - entropy.min()) if len(entropy) else None,
    }
    for role in roles:
        opt_steps = _finite(columns, role_key(role, "opt_steps"))[1]
        out[role_key(role, "opt_steps")] = float(opt_steps.mean()) if len(opt_steps) else None
        out.update(ratio_columns(role_prefix(role), *(_finite(columns, role_key(role, m)) for m in RATIO_METRICS)))
    if len(adapters) == 1 and len(roles) > 1:
        (adapter,) = adapters
        out.update(ratio_columns(
            adapter_prefix(adapter),
            token_weighted(columns, roles, "chi2"),
            token_weighted(columns, roles, "ppl"),
            _finite(columns, adapter_key(adapter, "grad_norm")),
        ))
    return out


def signature_changes(columns: MetricColumns) -> dict[str, float]:
    """Last minus first validation value of each role's SIGNATURE_CHANGES signatures."""
    out = {}
    for metric in columns.metrics("val"):
        if metric.startswith(VAL_ROLE) and metric.rsplit("/", 1)[1] in SIGNATURE_CHANGES:
            values = columns.column("val", metric)[1]
            values = values[np.isfinite(values)]
            if len(values):
                out[f"{metric}_change"] = float(values[-1] - values[0])
    return out


def test_summary(columns: MetricColumns, peak_step: int | None, peak_val_acc: float | None) -> dict[str, Any]:
    """The peak's test accuracy, its SE and the selection bias; None where the cell has no
    test row at its peak step."""
    test = columns.series("test", "test/acc")
    if peak_step is None or peak_val_acc is None or peak_step not in test:
        return dict.fromkeys(("peak_test_acc", "peak_test_se", "selection_bias_pp"))
    return {"peak_test_acc": test[peak_step], "peak_test_se": columns.series("test", "test/acc_se").get(peak_step),
            "selection_bias_pp": 100 * (peak_val_acc - test[peak_step])}


def cell_summary(columns: MetricColumns) -> dict[str, Any]:
    """Every per-cell statistic of cells.parquet (see the module docstring)."""
    accuracy = accuracy_summary(columns.series("val", "val/acc"))
    return {**accuracy, **test_summary(columns, accuracy["peak_step"], accuracy["peak_val_acc"]),
            **training_summary(columns), **signature_changes(columns)}


def cell_grouping(run_dir: RunDir, policy: str | None) -> dict[str, tuple[str, ...]] | None:
    """A grouped cell's adapters and their roles, from its config.yaml (the policy axis names
    the option, not the grouping); None for the paper's policies, or a config that does not
    read (its mechanism alerts then stay unknown, as a damaged cell's)."""
    if policy in (None, "shared", "isolated"):
        return None
    try:
        config = load_config(run_dir.config_yaml)
    except (ConfigError, OSError, UnicodeDecodeError):
        return None
    return grouping(config)


def planned_validations(run_dir: RunDir) -> int | None:
    """The run's planned validation count (the cliff rule's K), from its config.yaml; None
    where it does not read (the rule then counts the validations the run has)."""
    try:
        return load_config(run_dir.config_yaml).planned_validations
    except (ConfigError, OSError, UnicodeDecodeError):
        return None


def alert_summary(rows: Iterable[Mapping[str, Any]], workflow: str | None, policy: str | None,
                  thresholds: Thresholds = THRESHOLDS, groups: Groups | None = None) -> dict[str, Any]:
    """The alerts replayed on a cell's rows (see the module docstring); `groups`: a grouped
    cell's adapters and their roles."""
    out: dict[str, Any] = {"mechanism_alerts": ""}
    relevant = [m for m in ALERTS if workflow and applies(m, workflow, policy, groups)]
    history = alert_history(rows, workflow, policy, thresholds, groups) if relevant and workflow else []
    for mechanism in ALERTS:
        fired = firings(history, mechanism) if mechanism in relevant else []
        known = mechanism in relevant and bool(history)
        out[f"alert/{mechanism}/fired"] = len(fired) if known else None
        out[f"alert/{mechanism}/steps"] = len(history) if known else None
        out[f"alert/{mechanism}/first_step"] = fired[0] if fired else None
    if history:
        out["mechanism_alerts"] = "; ".join(history[-1][1])
    return out


# --- cost -----------------------------------------------------------------------------------------
def cell_hours(record: StateRecord, now: float) -> float:
    """Wall-clock hours over every attempt of a cell (a running one counts up to now)."""
    running = record.state == CellState.RUNNING
    spans = [(a.get("started_at"), a.get("finished_at"), a.get("updated_at")) for a in record.attempts]
    spans.append((record.started_at, now if record.finished_at is None and running else record.finished_at,
                  record.updated_at))
    seconds = 0.0
    for started, ended, updated in spans:
        if started is None:
            continue
        if ended is None:
            ended = started if updated is None else updated
        seconds += max(0.0, float(ended) - float(started))
    return seconds / 3600
