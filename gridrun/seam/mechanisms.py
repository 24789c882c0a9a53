"""Every alert of a run, from its metric rows: the paper's two role-level failure mechanisms,
the trajectory-side drift of a role's signature, non-finite updates, and the candidate
collapse signals (entropy, length, truncation, gradient norm, zero-variance groups).

Pure functions over a cell's metrics.jsonl rows (train and val splits, as the trainer writes
them) and its coordinates (workflow, policy, response cap). The trainer feeds each row it
writes to a `MechanismWatch` running its `train.alert_signals` (its alerts go to state.json,
so `gridrun status` shows them, and to the train row as `alert/<name>` 0/1 for the
mechanisms and the listed candidates, so wandb plots them); `gridrun collect` replays the
finished rows through `alert_history` with any `Thresholds`, so every threshold can be
re-calibrated on a results folder without retraining. A seam module (standard library
and the registry only): both halves import it, and gridrun/grid must never pull in torch.
Each alert is one line "<name>: <why>", its name one of `ALERTS`.

gradient_amplification (Isolated-Policy; a workflow with same-role multiplicity, whose
parallel role is Voting's generator or Orch-Workers' worker): the parallel role's
peak-over-first ratio of `role/<r>/chi2`, or of `role/<r>/ppl`, is at least `chi2_factor`
(`ppl_factor`) times every other role's. "First" is the mean of the first `ratio_window`
training steps' values (for chi2: the first values above `chi2_floor`, below), "peak" the largest mean of `ratio_window` consecutive steps so far
(with a window of 1: the largest value over the first, as Table 2). A chi2 value below
`chi2_floor` counts as the floor: chi2 = E[rho^2] - 1 of a role whose data fits one
mini-batch is float rounding (1e-7, of either sign: its old log-probs are the update's own
forward), and a ratio of rounding noise neither silences the alert (it used to be unknown
at a first value <= 0) nor triggers it (2.67 of noise against a real 1.00): such a role's
ratio is 1. Nor is a value at the floor a baseline: under a warmup from 0 (the released
schedule) the first update has LR 0, so every role's first chi2 is at the floor, and a
parallel role's ordinary off-policy chi2 (2e-3 on the toy world) would read 20x; its
baseline is its first off-policy value. A ratio whose first value is not positive (perplexity never is) is unknown, and
an unknown ratio of any role keeps that metric silent.

sp_role_capture (Shared-Policy, several roles): the dominant role (the largest mean
`role/<r>/grad_share` over the last `share_window` training steps) took at least
`share_shrink` of the other roles' share over the first `share_window` steps (needs 2
windows of steps, disjoint; relative, as Voting's generator owns ~99% of the shared
gradient on the toy world from the first step), while another role's validation signature drifts toward the dominant
role's since the first validation: its mean length (`val/role/<r>/len_mean`) moved toward
the dominant role's and closed at least `gap_close` of the gap, or its terse rate
(`val/role/aggregator/terse_rate`: terse is the aggregator's own idiom) fell by at least
`terse_drop`.

signature_drift (any cell; validation rows): a role's signature moved far from the first
validation's: its terse or box rate halved from at least `rate_floor`; its code-fence rate
or truncation rate rose above `fence_rate` / `trunc_rate` from at most that; its p95 length
reached the response cap (the row's `val/response_cap`, which the trainer logs) from below;
its slots' 3-gram Jaccard rose above `jaccard_high` from below `jaccard_low`. Each
validation's drift replaces the last one's.

Under a grouping (policy grouped: `groups`, adapter -> its roles) each mechanism is read per
adapter: gradient_amplification where the parallel role has an adapter of its own (as under
IP), sp_role_capture within each adapter serving several roles (as under SP; the dominant
role's share is then its part of that adapter's roles' summed mean shares).

non_finite (any cell; train rows): optimizer steps skipped because the loss or the gradient
was not finite (`train/skipped_nonfinite`, summed over the steps so far).

The candidate collapse signals (`CANDIDATES`; any cell, train rows; indicative until a study
supports them): each compares a series' last `signal_window` training steps' mean ("now")
with its first `signal_window` steps' mean ("first"), once the two windows are disjoint, and
holds while the comparison does (a later window can clear it). A role or adapter whose rows
lack the metric (a run from before it was logged) gives no series: the signal stays silent.

entropy_collapse: a role's training entropy (`role/<r>/entropy`) now is at most
`entropy_fall` of its first (Cui et al. 2025: RL on LLMs trades entropy for reward, and the
trade ends when entropy is spent).

length_blowup / length_collapse: a role's mean response length (`role/<r>/len_mean`) now is
at least `length_rise` times (at most `length_fall` of) its first.

truncation_spike: a role's truncation rate (`role/<r>/trunc_rate`) now is above
`trunc_level`, its first at most that.

grad_norm_spike: a role's (`role/<r>/grad_norm`) or an adapter's (`adapter/<a>/grad_norm`)
gradient norm now is at least `grad_norm_factor` times the median of all its values before
the last window (a running baseline: a spike stands out of the run's own history, whatever
its first steps did); an adapter named after a role (Isolated-Policy's) is that role's.

zero_variance: a role's share of zero-variance groups (`role/<r>/zero_var_share`: its
groups whose rewards are all equal, so no advantage to learn from) now is at least
`zero_var_level`, its first below that.

The trainer's live watch runs the alerts its run's `train.alert_signals` lists (default
`LIVE_ALERTS`: all but the candidates); `alert_history` replays every alert.

Leaves out: smoothing beyond the windows, Eval-Opt's evaluator idioms (code fences:
signature_drift names them), a signal on the trainer/engine log-prob mismatch
(`role/<r>/rollout_logp_absdiff`: meaningful with vLLM only), and per-adapter entropy,
length and truncation (the rows log those per role).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gridrun.seam import registry
from gridrun.seam.metric_keys import ADAPTER, ROLE, VAL_ROLE, parse_adapter_key, parse_role_key, role_key, val_key

GRADIENT_AMPLIFICATION = "gradient_amplification"
SP_ROLE_CAPTURE = "sp_role_capture"
MECHANISMS = (GRADIENT_AMPLIFICATION, SP_ROLE_CAPTURE)
SIGNATURE_DRIFT = "signature_drift"
NON_FINITE = "non_finite"
ENTROPY_COLLAPSE = "entropy_collapse"
LENGTH_BLOWUP = "length_blowup"
LENGTH_COLLAPSE = "length_collapse"
TRUNCATION_SPIKE = "truncation_spike"
GRAD_NORM_SPIKE = "grad_norm_spike"
ZERO_VARIANCE = "zero_variance"
# The candidate collapse signals: replayed by collect, live only where a run lists them.
CANDIDATES = (ENTROPY_COLLAPSE, LENGTH_BLOWUP, LENGTH_COLLAPSE, TRUNCATION_SPIKE, GRAD_NORM_SPIKE, ZERO_VARIANCE)
# The trainer's live alerts by default (train.alert_signals): the mechanisms, then the general ones.
LIVE_ALERTS = (*MECHANISMS, SIGNATURE_DRIFT, NON_FINITE)
# Every alert's name.
ALERTS = (*LIVE_ALERTS, *CANDIDATES)
# The training metric each candidate reads, and whether it reads adapters' too.
SIGNAL_METRICS = {ENTROPY_COLLAPSE: "entropy", LENGTH_BLOWUP: "len_mean", LENGTH_COLLAPSE: "len_mean",
                  TRUNCATION_SPIKE: "trunc_rate", GRAD_NORM_SPIKE: "grad_norm", ZERO_VARIANCE: "zero_var_share"}
PER_ADAPTER = (GRAD_NORM_SPIKE,)
# A validation row's key holding the cell's lengths.max_response_tokens.
RESPONSE_CAP = "val/response_cap"


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the mechanism alerts, in one place.

    How the defaults were chosen (before any study; the findings study re-calibrates them):
    chi2_factor is Table 4's flag (2x the other role's chi2 ratio); ppl_factor is smaller
    because perplexity ratios sit near 1 (the toy world's smoke runs moved them 1.0-1.6);
    a 5-step window is the shortest that averages out one step's batch on 20-step toy runs;
    a 5-point share rise, a quarter of the length gap and a 20-point terse-rate fall are
    each about twice the step-to-step noise of those metrics on the toy smoke sweep.

    Checked on the findings study (sweeps/findings.yaml, 3 seeds, 30 steps; docs/studies.md,
    bench/measured/findings-study.md), and left as they were: neither alert fired on any of
    the 21 shuffled-reward twins (a reward with no signal); the parallel role's perplexity ratio
    reached at most 1.14 against the other roles' 1.00-1.05 (below 1.2x), while the
    aggregator's rose 3.4x and 24x in two Voting cells (the reverse of the mechanism: no
    alert); chi2 is exactly 0 for every role whose data fits one mini-batch per step (the
    first mini-batch is on-policy), so on the toy world only the perplexity test can fire;
    sp_role_capture fired in 2 of 3 Eval-Opt-SP seeds, 5 and 6 steps before their peak.

    Still provisional: the mechanisms study (sweeps/mechanisms.yaml, docs/studies.md,
    bench/measured/mechanisms-study.md) chose chi2_factor 10 on its seeds 0-1 (recall 3/5,
    1/11 false alarms), which on the held-out seed 2 warned 0 of 3 cliffs against the default 2x's 1 of 3 (1 of 5
    false alarms): the defaults stay, and collect writes the calibration beside them. chi2_floor 1e-4 sits 1000x above
    the float rounding of a one-mini-batch role's chi2 (1e-7) and ~30x below an
    off-policy mini-batch's on the toy world (3e-3 for Voting-IP's generator in a 3-step
    sizing run); ratio_window 1 is Table 2's peak-over-first. The drift thresholds are the
    trainer's former fixed ones, now defined here only: a rate halving from at
    least 50%, code fences or truncation above 20%, slots' Jaccard above 0.9 from below 0.7.

    The candidate signals' thresholds are round numbers set before any study: a 3-step
    window (two disjoint ones fit in the first 6 steps of a 30-step toy run), entropy
    halved, length doubled or halved, a fifth of the answers truncated (signature_drift's
    level), a gradient norm 5x the run's median (an order past the step-to-step spread of
    a clipped update), half of a role's groups without reward variance. signal_window is
    shared by the candidates: calibration chooses it per signal, which one Thresholds holds
    for one signal at a time.
    """

    chi2_factor: float = 2.0
    ppl_factor: float = 1.2
    chi2_floor: float = 1e-4
    ratio_window: int = 1
    share_window: int = 5
    share_shrink: float = 0.25
    gap_close: float = 0.25
    terse_drop: float = 0.2
    rate_floor: float = 0.5
    fence_rate: float = 0.2
    trunc_rate: float = 0.2
    jaccard_high: float = 0.9
    jaccard_low: float = 0.7
    signal_window: int = 3
    entropy_fall: float = 0.5
    length_rise: float = 2.0
    length_fall: float = 0.5
    trunc_level: float = 0.2
    grad_norm_factor: float = 5.0
    zero_var_level: float = 0.5


THRESHOLDS = Thresholds()


# A grouping: adapter name -> the roles it serves (RunConfig.adapter_groups).
Groups = Mapping[str, Sequence[str]]


def applies(mechanism: str, workflow: str, policy: str | None, groups: Groups | None = None) -> bool:
    """Whether a cell of this workflow and policy (or, given, grouping) can show the mechanism."""
    if groups is not None and mechanism in MECHANISMS:
        if mechanism == GRADIENT_AMPLIFICATION:
            parallel = registry.workflow(workflow).parallel_role
            return any(list(members) == [parallel] for members in groups.values()) and len(groups) > 1
        return bool(_shared_groups(groups))
    if mechanism == GRADIENT_AMPLIFICATION:
        return policy == "isolated" and registry.workflow(workflow).parallel_role is not None
    if mechanism == SP_ROLE_CAPTURE:
        return policy == "shared" and not registry.workflow(workflow).single_agent
    if mechanism in (SIGNATURE_DRIFT, NON_FINITE, *CANDIDATES):
        return True
    raise ValueError(f"unknown alert '{mechanism}': expected one of {', '.join(ALERTS)}")


@dataclass
class _Peak:
    """A role's metric: the mean of its first `window` values above `floor` and the largest
    mean of `window` consecutive values so far."""

    window: int
    floor: float | None = None
    first: list[float] = field(default_factory=list)
    recent: deque[float] = field(default_factory=deque)
    peak: float | None = None

    def add(self, value: float) -> bool:
        """Take the next value; whether the ratio may have changed."""
        if len(self.first) < self.window and (self.floor is None or value > self.floor):
            self.first.append(value)
        self.recent.append(value)
        if len(self.recent) > self.window:
            self.recent.popleft()
        if len(self.recent) < self.window:
            return False
        mean = _mean(self.recent)
        if self.peak is None or mean > self.peak:
            self.peak = mean
            return True
        return False

    def ratio(self) -> float | None:
        if self.peak is None:
            return None
        if not self.first:
            # Every value at the floor (a role never off-policy): no change to measure.
            return 1.0 if self.floor is not None else None
        first = _mean(self.first)
        return self.peak / first if first > 0 else None


@dataclass
class _Series:
    """A candidate signal's series: the first `window` values, the last `window`, and every
    value before those (sorted: the running median's)."""

    window: int
    first: list[float] = field(default_factory=list)
    recent: deque[float] = field(default_factory=deque)
    earlier: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        if len(self.first) < self.window:
            self.first.append(value)
        self.recent.append(value)
        if len(self.recent) > self.window:
            bisect.insort(self.earlier, self.recent.popleft())

    def windows(self) -> tuple[float, float] | None:
        """(first mean, now mean) once the two windows are disjoint; None before."""
        if len(self.earlier) < self.window:
            return None
        return _mean(self.first), _mean(self.recent)

    def median(self) -> float:
        """The median of the values before the last window (`windows` is not None)."""
        n = len(self.earlier)
        return self.earlier[n // 2] if n % 2 else (self.earlier[n // 2 - 1] + self.earlier[n // 2]) / 2


@dataclass
class MechanismWatch:
    """Reads a cell's metric rows in order and says which mechanisms hold on the rows so far."""

    workflow: str
    policy: str | None
    thresholds: Thresholds = THRESHOLDS
    # A grouping's adapters and their roles (policy grouped); None: read `policy`.
    groups: Groups | None = None
    # The alerts it runs (the trainer's: train.alert_signals); replay runs every one.
    signals: Sequence[str] = ALERTS
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
    _first_signature: dict[str, float] | None = field(init=False, default=None)  # the first validation's
    _drifted: list[str] = field(init=False, default_factory=list)  # the latest validation's drift
    _skipped: int = field(init=False, default=0)  # non-finite optimizer steps so far
    _series: dict[tuple[str, str, str], _Series] = field(init=False, default_factory=dict)  # (scope, name, metric)
    _read: frozenset[tuple[str, str]] = field(init=False, default=frozenset())  # (scope, metric) a signal reads
    _by_metric: dict[str, list[tuple[str, str, _Series]]] = field(init=False, default_factory=dict)  # metric -> series

    def __post_init__(self) -> None:
        unknown = [s for s in self.signals if s not in ALERTS]
        if unknown:
            raise ValueError(f"unknown alert '{unknown[0]}': expected one of {', '.join(ALERTS)}")
        self._parallel = registry.workflow(self.workflow).parallel_role
        self._applies = {m: applies(m, self.workflow, self.policy, self.groups) for m in MECHANISMS}
        on = [c for c in CANDIDATES if c in self.signals]
        self._read = frozenset({(ROLE, SIGNAL_METRICS[c]) for c in on}
                               | {(ADAPTER, SIGNAL_METRICS[c]) for c in on if c in PER_ADAPTER})

    @property
    def flagged(self) -> tuple[str, ...]:
        """The alerts a train row flags (`alert_flags`): the mechanisms and the candidates it runs."""
        return (*MECHANISMS, *(c for c in CANDIDATES if c in self.signals))

    def see(self, row: Mapping[str, Any]) -> list[str]:
        """Take one metrics row; return the alerts that hold now (one line per mechanism)."""
        if row.get("split") == "val":
            self._see_val(row)
        elif row.get("split", "train") == "train":
            self._see_train(row)
        return self.alerts()

    def _layout(self, row: Mapping[str, Any]) -> list[tuple[str, str, str]]:
        """(key, role, metric) of the row's mechanism metrics, then (key, "adapter/<a>", metric)
        of its adapter metrics a candidate reads."""
        keys = tuple(row)
        layout = self._layouts.get(keys)
        if layout is None:
            layout = []
            for key in keys:
                if (part := parse_role_key(key)) is not None:
                    if part[1] in ("chi2", "ppl", "grad_share") or (ROLE, part[1]) in self._read:
                        layout.append((key, *part))
                elif (part := parse_adapter_key(key)) is not None and (ADAPTER, part[1]) in self._read:
                    layout.append((key, f"{ADAPTER}/{part[0]}", part[1]))
            self._layouts[keys] = layout
        return layout

    def _see_train(self, row: Mapping[str, Any]) -> None:
        t = self.thresholds
        window = t.share_window
        skipped = row.get("train/skipped_nonfinite")
        if skipped is not None and _number(skipped):
            self._skipped += int(skipped)
        for key, role, metric in self._layout(row):
            value = row[key]
            if not _number(value):
                continue
            scope = ADAPTER if role.startswith(f"{ADAPTER}/") else ROLE
            if (scope, metric) in self._read:
                name = role.partition("/")[2] if scope == ADAPTER else role
                series = self._series.get((scope, name, metric))
                if series is None:
                    series = self._series[(scope, name, metric)] = _Series(t.signal_window)
                    # Roles then adapters, by name (a row's key order is the writer's).
                    self._by_metric[metric] = sorted([*self._by_metric.get(metric, []), (scope, name, series)],
                                                     key=lambda item: (item[0] != ROLE, item[1]))
                series.add(float(value))
            if scope == ADAPTER or metric not in ("chi2", "ppl", "grad_share"):
                continue
            if metric != "grad_share":
                floor = t.chi2_floor if metric == "chi2" else None
                if floor is not None:
                    value = max(float(value), floor)
                seen = self._peaks.setdefault((role, metric), _Peak(t.ratio_window, floor))
                if seen.add(float(value)):
                    self._amplified = None
            else:
                early = self._early.setdefault(role, [])
                if len(early) < window:
                    early.append(float(value))
                self._recent.setdefault(role, deque(maxlen=window)).append(float(value))
                self._shares[role] = self._shares.get(role, 0) + 1

    def _see_val(self, row: Mapping[str, Any]) -> None:
        self._val_rows += 1
        signature = {key: float(value) for key, value in row.items() if key.startswith(VAL_ROLE) and _number(value)}
        for key, value in signature.items():
            if key.endswith(("/len_mean", "/terse_rate")):
                self._first_val.setdefault(key, value)
                self._last_val[key] = value
        # The trainer logs the response cap with each validation (a p95 length at it is drift).
        cap = row.get(RESPONSE_CAP)
        if self._first_signature is None:
            self._first_signature = signature
        else:
            self._drifted = drift_alerts(self._first_signature, signature, int(cap) if cap is not None and _number(cap) else None,
                                         self.thresholds)

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
        found += [f"{SIGNATURE_DRIFT}: {line}" for line in self._drifted]
        if self._skipped:
            found.append(f"{NON_FINITE}: {self._skipped} optimizer step{'s' if self._skipped != 1 else ''} skipped")
        found = [a for a in found if a.split(":", 1)[0] in self.signals]
        for signal in CANDIDATES:
            if signal in self.signals and (parts := self._candidate(signal)):
                found.append(f"{signal}: {'; '.join(parts)}")
        return found

    # --- the candidate signals -------------------------------------------------------------------
    def _candidate(self, signal: str) -> list[str]:
        """Each role's (or adapter's) reason `signal` holds now."""
        t = self.thresholds
        metric = SIGNAL_METRICS[signal]
        parts = []
        for scope, name, series in self._by_metric.get(metric, []):
            # An adapter named after a role (Isolated-Policy's) is that role's series again.
            if scope == ADAPTER and (signal not in PER_ADAPTER or (ROLE, name, metric) in self._series):
                continue
            seen = series.windows()
            if seen is None:
                continue
            first, now = seen
            who = f"adapter {name}" if scope == ADAPTER else name
            if signal == ENTROPY_COLLAPSE and first > 0 and now <= t.entropy_fall * first:
                parts.append(f"{who} entropy {first:.3g}->{now:.3g}")
            elif signal in (LENGTH_BLOWUP, LENGTH_COLLAPSE) and first > 0 and (
                    now >= t.length_rise * first if signal == LENGTH_BLOWUP else now <= t.length_fall * first):
                parts.append(f"{who} length {first:.0f}->{now:.0f}")
            elif signal == TRUNCATION_SPIKE and first <= t.trunc_level < now:
                parts.append(f"{who} truncated {first:.0%}->{now:.0%}")
            elif signal == GRAD_NORM_SPIKE and (median := series.median()) > 0 and now >= t.grad_norm_factor * median:
                parts.append(f"{who} grad norm {now:.3g} vs median {median:.3g}")
            elif signal == ZERO_VARIANCE and first < t.zero_var_level <= now:
                parts.append(f"{who} zero-variance groups {first:.0%}->{now:.0%}")
        return parts

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
        if not self._applies[SP_ROLE_CAPTURE] or self._val_rows < 2:
            return None
        if self.groups is None:
            return self._capture_within(list(self._recent), normalise=False)
        found = [c for members in _shared_groups(self.groups)
                 if (c := self._capture_within([r for r in members if r in self._recent], normalise=True))]
        return "; ".join(found) or None

    def _capture_within(self, roles: list[str], normalise: bool) -> str | None:
        """Capture of one adapter by one of its `roles`; `normalise`: their shares as parts
        of the roles' summed mean shares (an adapter that trains only some of the roles)."""
        t = self.thresholds
        if len(roles) < 2:
            return None
        dominant = max(roles, key=lambda role: _mean(self._recent[role]))
        if self._shares[dominant] < 2 * t.share_window:
            return None  # the first and last windows would share steps
        early, recent = _mean(self._early[dominant]), _mean(self._recent[dominant])
        if normalise:
            early /= sum(_mean(self._early[r]) for r in roles) or 1.0
            recent /= sum(_mean(self._recent[r]) for r in roles) or 1.0
        # The other roles' part of the gradient shrank: a relative test, so a role that owns
        # 99% of it from the start (Voting's generator) can still be seen taking the rest.
        if 1 - recent > (1 - t.share_shrink) * (1 - early):
            return None
        drifts = [d for role in roles if role != dominant and (d := self._drift(role, dominant))]
        if not drifts:
            return None
        return f"{dominant} grad share {early:.2f}->{recent:.2f}; " + "; ".join(drifts)

    def captured_roles(self) -> str | None:
        """sp_role_capture's signature alone, without its gradient-share test: another role's
        validation signature moved toward the dominant role's since the first validation
        (the SP positive control's check: is the paper's signature there?). None before two
        validations, without a shared adapter or without gradient shares."""
        if not self._applies[SP_ROLE_CAPTURE] or self._val_rows < 2 or len(self._recent) < 2:
            return None
        dominant = max(self._recent, key=lambda role: _mean(self._recent[role]))
        drifts = [d for role in self._recent if role != dominant and (d := self._drift(role, dominant))]
        return "; ".join(drifts) or None

    def _drift(self, role: str, dominant: str) -> str | None:
        t = self.thresholds
        first, last = self._first_val, self._last_val
        found = []
        own, theirs = val_key(role_key(role, "len_mean")), val_key(role_key(dominant, "len_mean"))
        if own in first and theirs in first:
            gap_before = first[theirs] - first[own]
            gap_now = last[theirs] - last[own]
            moved = last[own] - first[own]
            if gap_before and moved * gap_before > 0 and abs(gap_now) <= (1 - t.gap_close) * abs(gap_before):
                found.append(f"{role} length {first[own]:.0f}->{last[own]:.0f} ({dominant} {last[theirs]:.0f})")
        terse = val_key(role_key(role, "terse_rate"))
        if terse in first and first[terse] - last[terse] >= t.terse_drop:
            found.append(f"{role} terse rate {first[terse]:.0%}->{last[terse]:.0%}")
        return ", ".join(found) or None


_SIGNATURE_KEY = re.compile(r"^val/role/([^/]+)/(.+)$")


def drift_alerts(
    first: Mapping[str, float], now: Mapping[str, float], response_cap: int | None, t: Thresholds = THRESHOLDS
) -> list[str]:
    """signature_drift's lines (without the name): each role signature of the validation
    `now` (val/role/<r>/<metric>) that moved past its threshold from the first validation's."""
    alerts: list[str] = []
    for key, value in now.items():
        match = _SIGNATURE_KEY.match(key)
        if not match:
            continue
        role, metric = match.groups()
        before = first.get(key)
        if metric in ("terse_rate", "box_rate") and before is not None and before >= t.rate_floor and value < before / 2:
            alerts.append(f"{role} {metric.replace('_', ' ')} {before:.0%}->{value:.0%}")
        elif metric == "code_fence_rate" and value > t.fence_rate and (before or 0.0) <= t.fence_rate:
            alerts.append(f"{role} writes code {value:.0%}")
        elif metric == "trunc_rate" and value > t.trunc_rate and (before or 0.0) <= t.trunc_rate:
            alerts.append(f"{role} truncated {value:.0%}")
        elif metric == "len_p95" and response_cap is not None and value >= response_cap and (before or 0.0) < response_cap:
            alerts.append(f"{role} p95 length at cap")
        elif metric == "slot_jaccard3" and value > t.jaccard_high and (before or 0.0) < t.jaccard_low:
            alerts.append(f"{role} slots collapsed (jaccard {value:.2f})")
    return sorted(alerts)


def alert_history(
    rows: Iterable[Mapping[str, Any]], workflow: str, policy: str | None, thresholds: Thresholds = THRESHOLDS,
    groups: Groups | None = None, signals: Sequence[str] = ALERTS,
) -> list[tuple[int, list[str]]]:
    """(step, alerts holding after that step's last row) for every step from the first
    training row on, replaying the rows in order: what the trainer saw, under `thresholds`
    (`signals`: the alerts replayed; each alert's history is the same whichever others run)."""
    watch = MechanismWatch(workflow, policy, thresholds, groups, signals)
    history: list[tuple[int, list[str]]] = []
    trained = False
    for row in rows:
        step = row.get("step")
        # The test row comes after training, at the peak's step: nothing the trainer watched.
        if type(step) is not int or row.get("split") == "test":
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


def signature_steps(rows: Iterable[Mapping[str, Any]], workflow: str, policy: str | None, thresholds: Thresholds = THRESHOLDS,
                    groups: Groups | None = None) -> list[int]:
    """The validation steps at which sp_role_capture's signature held (`captured_roles`)."""
    watch = MechanismWatch(workflow, policy, thresholds, groups)
    held = []
    for row in rows:
        watch.see(row)
        if row.get("split") == "val" and type(row.get("step")) is int and watch.captured_roles():
            held.append(row["step"])
    return held


def firings(history: list[tuple[int, list[str]]], mechanism: str) -> list[int]:
    """The steps of a history at which `mechanism` held."""
    return [step for step, alerts in history if _names(alerts, mechanism)]


def alert_flags(alerts: list[str], names: Sequence[str] = MECHANISMS) -> dict[str, int]:
    """`alert/<name>` for each of `names`: 1 where one of `alerts` names it, else 0 (a train
    row's, for wandb; the trainer's names: its watch's `flagged`)."""
    return {f"alert/{m}": int(_names(alerts, m)) for m in names}


def _names(alerts: list[str], mechanism: str) -> bool:
    """Whether one of `alerts` (each "<mechanism>: <why>") is `mechanism`'s."""
    return any(a.startswith(mechanism + ":") for a in alerts)


def _shared_groups(groups: Groups) -> list[list[str]]:
    """The roles of each adapter that serves several."""
    return [list(members) for members in groups.values() if len(members) > 1]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)
