"""Mechanism alerts: the paper's two role-level failure mechanisms, named, from metric rows.

Pure functions over a cell's metrics.jsonl rows (train and val splits, as the trainer writes
them) and its coordinates (workflow, policy). The trainer feeds each row it writes to a
`MechanismWatch` (its alerts go to state.json, so `gridrun status` shows them, and to the
train row as `alert/<mechanism>` 0/1, so wandb plots them); `gridrun collect` replays the
finished rows through `alert_history` with any `Thresholds`, so the thresholds can be
re-calibrated on a results folder without retraining. A seam module (standard library and
the run schema only): both halves import it, and gridrun/grid must never pull in torch.

gradient_amplification (Isolated-Policy; a workflow with same-role multiplicity, whose
parallel role is Voting's generator or Orch-Workers' worker): the parallel role's
peak-over-first ratio of `role/<r>/chi2`, or of `role/<r>/ppl` (the largest value over the
training steps so far divided by the first step's, as Table 2), is at least
`chi2_factor` (`ppl_factor`) times every other role's. A ratio whose first value is not
positive is unknown, and an unknown ratio of any role keeps that metric silent.

sp_role_capture (Shared-Policy, several roles): the dominant role (the largest mean
`role/<r>/grad_share` over the last `share_window` training steps) has a share at least
`share_rise` above its mean over the first `share_window` steps (needs 2 windows of
steps, disjoint), while another role's validation signature drifts toward the dominant
role's since the first validation: its mean length (`val/role/<r>/len_mean`) moved toward
the dominant role's and closed at least `gap_close` of the gap, or its terse rate
(`val/role/aggregator/terse_rate`: terse is the aggregator's own idiom) fell by at least
`terse_drop`.

Leaves out: the trajectory-side drift alerts (alerts.py), smoothing beyond the windows, and
Eval-Opt's evaluator idioms (code fences: a drift alert already names them).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gridrun import registry

GRADIENT_AMPLIFICATION = "gradient_amplification"
SP_ROLE_CAPTURE = "sp_role_capture"
MECHANISMS = (GRADIENT_AMPLIFICATION, SP_ROLE_CAPTURE)


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the mechanism alerts, in one place.

    How the defaults were chosen (before any study; the findings study re-calibrates them):
    chi2_factor is Table 4's flag (2x the other role's chi2 ratio); ppl_factor is smaller
    because perplexity ratios sit near 1 (the toy world's smoke runs moved them 1.0-1.6);
    a 5-step window is the shortest that averages out one step's batch on 20-step toy runs;
    a 5-point share rise, a quarter of the length gap and a 20-point terse-rate fall are
    each about twice the step-to-step noise of those metrics on the toy smoke sweep.

    Checked on the findings study (sweeps/findings.yaml, 3 seeds, 30 steps; README "The
    findings study"), and left as they were: neither alert fired on any of the 21
    shuffled-reward twins (a reward with no signal); the parallel role's perplexity ratio
    reached at most 1.14 against the other roles' 1.00-1.05 (below 1.2x), while the
    aggregator's rose 3.4x and 24x in two Voting cells (the reverse of the mechanism: no
    alert); chi2 is exactly 0 for every role whose data fits one mini-batch per step (the
    first mini-batch is on-policy), so on the toy world only the perplexity test can fire;
    sp_role_capture fired in 2 of 3 Eval-Opt-SP seeds, 5 and 6 steps before their peak.
    """

    chi2_factor: float = 2.0
    ppl_factor: float = 1.2
    share_window: int = 5
    share_rise: float = 0.05
    gap_close: float = 0.25
    terse_drop: float = 0.2


THRESHOLDS = Thresholds()


def applies(mechanism: str, workflow: str, policy: str | None) -> bool:
    """Whether a cell of this workflow and policy can show the mechanism at all."""
    if mechanism == GRADIENT_AMPLIFICATION:
        return policy == "isolated" and registry.workflow(workflow).parallel_role is not None
    if mechanism == SP_ROLE_CAPTURE:
        return policy == "shared" and workflow != "single"
    raise ValueError(f"unknown mechanism '{mechanism}': expected one of {', '.join(MECHANISMS)}")


@dataclass
class _Peak:
    first: float
    peak: float

    def ratio(self) -> float | None:
        return self.peak / self.first if self.first > 0 else None


@dataclass
class MechanismWatch:
    """Reads a cell's metric rows in order and says which mechanisms hold on the rows so far."""

    workflow: str
    policy: str | None
    thresholds: Thresholds = THRESHOLDS
    _parallel: str | None = field(init=False, default=None)
    _peaks: dict[tuple[str, str], _Peak] = field(init=False, default_factory=dict)  # (role, metric)
    _early: dict[str, list[float]] = field(init=False, default_factory=dict)  # role -> first shares
    _recent: dict[str, deque[float]] = field(init=False, default_factory=dict)  # role -> last shares
    _shares: dict[str, int] = field(init=False, default_factory=dict)  # role -> shares seen
    _first_val: dict[str, float] = field(init=False, default_factory=dict)
    _last_val: dict[str, float] = field(init=False, default_factory=dict)
    _val_rows: int = field(init=False, default=0)
    _applies: dict[str, bool] = field(init=False, default_factory=dict)
    # The (key, role, metric) a train row's keys hold, per key layout: rows of a run share
    # their keys, so each layout is parsed once (collect replays hundreds of thousands of rows).
    _layouts: dict[tuple[str, ...], list[tuple[str, str, str]]] = field(init=False, default_factory=dict)
    _amplified: str | None = field(init=False, default=None)  # the last verdict, until a peak moves

    def __post_init__(self) -> None:
        self._parallel = registry.workflow(self.workflow).parallel_role
        self._applies = {m: applies(m, self.workflow, self.policy) for m in MECHANISMS}

    def see(self, row: Mapping[str, Any]) -> list[str]:
        """Take one metrics row; return the alerts that hold now (one line per mechanism)."""
        if row.get("split") == "val":
            self._see_val(row)
        elif row.get("split", "train") == "train":
            self._see_train(row)
        return self.alerts()

    def _layout(self, row: Mapping[str, Any]) -> list[tuple[str, str, str]]:
        keys = tuple(row)
        layout = self._layouts.get(keys)
        if layout is None:
            parts = (key.split("/") for key in keys if key.startswith("role/"))
            layout = [("/".join(p), p[1], p[2]) for p in parts if len(p) == 3 and p[2] in ("chi2", "ppl", "grad_share")]
            self._layouts[keys] = layout
        return layout

    def _see_train(self, row: Mapping[str, Any]) -> None:
        window = self.thresholds.share_window
        for key, role, metric in self._layout(row):
            value = row[key]
            if not _number(value):
                continue
            if metric != "grad_share":
                seen = self._peaks.get((role, metric))
                if seen is None:
                    self._peaks[role, metric] = _Peak(float(value), float(value))
                    self._amplified = None
                elif value > seen.peak:
                    seen.peak = float(value)
                    self._amplified = None
            else:
                early = self._early.setdefault(role, [])
                if len(early) < window:
                    early.append(float(value))
                self._recent.setdefault(role, deque(maxlen=window)).append(float(value))
                self._shares[role] = self._shares.get(role, 0) + 1

    def _see_val(self, row: Mapping[str, Any]) -> None:
        self._val_rows += 1
        for key, value in row.items():
            if key.startswith("val/role/") and key.endswith(("/len_mean", "/terse_rate")) and _number(value):
                self._first_val.setdefault(key, float(value))
                self._last_val[key] = float(value)

    def alerts(self) -> list[str]:
        found = []
        if self._amplified is None:
            self._amplified = self._amplification() or ""
        amplified = self._amplified
        if amplified:
            found.append(f"{GRADIENT_AMPLIFICATION}: {amplified}")
        captured = self._capture()
        if captured:
            found.append(f"{SP_ROLE_CAPTURE}: {captured}")
        return found

    # --- gradient_amplification ---------------------------------------------------------------
    def _amplification(self) -> str | None:
        if not self._applies[GRADIENT_AMPLIFICATION] or self._parallel is None:
            return None
        t = self.thresholds
        parts = []
        for metric, factor in (("chi2", t.chi2_factor), ("ppl", t.ppl_factor)):
            ratios = {role: peak.ratio() for (role, m), peak in self._peaks.items() if m == metric}
            amplified = ratios.pop(self._parallel, None)
            if amplified is None or not ratios or any(r is None for r in ratios.values()):
                continue
            other, highest = max(ratios.items(), key=lambda item: item[1] or 0.0)
            if highest is not None and amplified >= factor * highest:
                parts.append(f"{self._parallel} {metric} peak/first {amplified:.2f} vs {other} {highest:.2f}")
        return "; ".join(parts) or None

    # --- sp_role_capture ------------------------------------------------------------------------
    def _capture(self) -> str | None:
        t = self.thresholds
        if not self._applies[SP_ROLE_CAPTURE] or len(self._recent) < 2 or self._val_rows < 2:
            return None
        dominant = max(self._recent, key=lambda role: _mean(self._recent[role]))
        early, recent = self._early[dominant], self._recent[dominant]
        if self._shares[dominant] < 2 * t.share_window:
            return None  # the first and last windows would share steps
        rise = _mean(recent) - _mean(early)
        if rise < t.share_rise:
            return None
        drifts = [d for role in self._recent if role != dominant and (d := self._drift(role, dominant))]
        if not drifts:
            return None
        return f"{dominant} grad share {_mean(early):.2f}->{_mean(recent):.2f}; " + "; ".join(drifts)

    def _drift(self, role: str, dominant: str) -> str | None:
        t = self.thresholds
        first, last = self._first_val, self._last_val
        found = []
        own, theirs = f"val/role/{role}/len_mean", f"val/role/{dominant}/len_mean"
        if own in first and theirs in first:
            gap_before = first[theirs] - first[own]
            gap_now = last[theirs] - last[own]
            moved = last[own] - first[own]
            if gap_before and moved * gap_before > 0 and abs(gap_now) <= (1 - t.gap_close) * abs(gap_before):
                found.append(f"{role} length {first[own]:.0f}->{last[own]:.0f} ({dominant} {last[theirs]:.0f})")
        terse = f"val/role/{role}/terse_rate"
        if terse in first and first[terse] - last[terse] >= t.terse_drop:
            found.append(f"{role} terse rate {first[terse]:.0%}->{last[terse]:.0%}")
        return ", ".join(found) or None


def alert_history(
    rows: Iterable[Mapping[str, Any]], workflow: str, policy: str | None, thresholds: Thresholds = THRESHOLDS
) -> list[tuple[int, list[str]]]:
    """(step, alerts holding after that step's last row) for every step from the first
    training row on, replaying the rows in order: what the trainer saw, under `thresholds`."""
    watch = MechanismWatch(workflow, policy, thresholds)
    history: list[tuple[int, list[str]]] = []
    trained = False
    for row in rows:
        step = row.get("step")
        if type(step) is not int:
            continue
        alerts = watch.see(row)
        trained = trained or row.get("split", "train") == "train"
        if not trained:
            continue
        if history and history[-1][0] == step:
            history[-1] = (step, alerts)
        else:
            history.append((step, alerts))
    return history


def firings(history: list[tuple[int, list[str]]], mechanism: str) -> list[int]:
    """The steps of a history at which `mechanism` held."""
    return [step for step, alerts in history if _names(alerts, mechanism)]


def alert_flags(alerts: list[str]) -> dict[str, int]:
    """`alert/<mechanism>`: 1 where one of `alerts` names it, else 0 (a train row's, for wandb)."""
    return {f"alert/{m}": int(_names(alerts, m)) for m in MECHANISMS}


def _names(alerts: list[str], mechanism: str) -> bool:
    """Whether one of `alerts` (each "<mechanism>: <why>") is `mechanism`'s."""
    return any(a.startswith(mechanism + ":") for a in alerts)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)
