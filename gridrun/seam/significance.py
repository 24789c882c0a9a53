"""Whether a difference of accuracies can be told from noise: gridrun's tests, in one place.

Three questions, each with its test (docs/analysis.md says what a verdict can and cannot show):

- **A fall within a run** (a cliff): two evaluations of one cell see the same problems, so
  their difference is paired by problem (`Evaluations.difference`): the mean of the per-problem
  differences, with the standard error of that mean. Pairing leaves out the problems' own
  spread in difficulty, which is most of a validation's variance when an answer is sampled at
  a low temperature. Without records (an older run) the two validations' standard errors
  combine as if independent, which overstates the noise when they are correlated: such a
  verdict says "unpaired".
- **Which fall is a cliff**: a run of K validations offers K(K-1)/2 ordered pairs, and the
  largest fall among them is the one a reader looks at, so a per-pair 2-SE rule cries wolf
  far more often than its nominal 2.3% (a flat curve of 11 validations falls 10 points below
  its running peak in ~39% of runs at the toy world's noise). `FallRule` is a one-sided
  Bonferroni bound over all K(K-1)/2 pairs at family-wise rate `alpha`: a flat run is called a
  cliff with probability at most `alpha`, whatever the correlation between validations, and
  however many it has. K is the run's *planned* validation count (its config's), known
  before the first one, so the trainer can apply the same rule online as validations arrive
  and a stopped run is judged as it would have been. The price: a fall must be ~3.1 SE at
  K = 11 (1.6 for one pre-chosen pair). A sequential test would spend alpha more cleverly;
  this one needs no tuning and no assumption about how validations relate.
- **How small a difference a sweep can detect** (`detectable_difference`): the minimum
  detectable difference between two cells' seed means at a two-sided `alpha` and `power`,
  from a seed-to-seed standard deviation (measured on seeds that ran, or given before anything
  runs); with one seed per cell the spread is not measurable and a given one uses normal
  quantiles. `detectable_paired`: the same for differences matched by seed number (the
  findings' rows), from the spread of those differences.

Standard library only (a seam module): the trainer's collapse detector, `gridrun collect`
and the dry run share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist

from gridrun.seam.records import ValidationRecord

# The family-wise false-alarm rate of a cliff, and the power a detectable difference is quoted at.
FALSE_ALARM = 0.05
POWER = 0.8
# A fall worth calling a cliff: at least this many points below an earlier validation.
CLIFF_PP = 10.0
# The trainer's alert for a cliff found as validations arrive (train.fall_alert).
COLLAPSE = "collapse"

_NORMAL = NormalDist()


def normal_quantile(p: float) -> float:
    return _NORMAL.inv_cdf(p)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: exact for df 1 and 2 (closed forms), else a Cornish-Fisher
    expansion around the normal's (within 0.8% at df = 3, 0.1% from df = 5, at the 0.8-0.975
    quantiles used here)."""
    if df < 1:
        return math.nan
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        a = 2 * p - 1
        return a * math.sqrt(2 / (1 - a * a))
    z = normal_quantile(p)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass(frozen=True)
class Difference:
    """a - b (fractions of problems), its standard error, and how it was measured."""

    value: float
    se: float
    paired: bool
    problems: int | None = None  # paired: the problems both evaluations share

    @property
    def z(self) -> float:
        if self.se > 0:
            return self.value / self.se
        return math.copysign(math.inf, self.value) if self.value else 0.0


def paired_difference(a: ValidationRecord, b: ValidationRecord) -> Difference | None:
    """a - b over the problems both evaluated, with the SE of the mean per-problem difference
    (each problem's share of right samples); None with fewer than 2 shared problems."""
    rates_b = b.rates()
    diffs = [rate - rates_b[p] for p, rate in a.rates().items() if p in rates_b]
    n = len(diffs)
    if n < 2:
        return None
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return Difference(mean, math.sqrt(var / n), True, n)


@dataclass(frozen=True)
class Evaluations:
    """A cell's evaluations of one split: step -> accuracy, its standard error (`val/acc_se`)
    and its per-problem record, where kept. Records that do not match their step's accuracy
    (an earlier attempt's) are dropped on the way in (`of`)."""

    acc: Mapping[int, float]
    se: Mapping[int, float] = field(default_factory=dict)
    records: Mapping[int, ValidationRecord] = field(default_factory=dict)

    @classmethod
    def of(cls, acc: Mapping[int, float], se: Mapping[int, float] | None = None,
           records: Mapping[int, ValidationRecord] | None = None) -> Evaluations:
        kept = {s: r for s, r in (records or {}).items() if s in acc and r.matches(acc[s])}
        return cls(dict(acc), dict(se or {}), kept)

    @property
    def paired(self) -> bool:
        """Every evaluation has its record (a cell's comparisons are all paired)."""
        return bool(self.acc) and set(self.records) >= set(self.acc)

    def difference(self, a: int, b: int) -> Difference | None:
        """Evaluation `a` minus evaluation `b`: paired by problem where both have records,
        else from their standard errors as independent draws; None with neither."""
        if a in self.records and b in self.records:
            paired = paired_difference(self.records[a], self.records[b])
            if paired is not None:
                return paired
        if a in self.se and b in self.se:
            return Difference(self.acc[a] - self.acc[b], math.hypot(self.se[a], self.se[b]), False)
        return None


@dataclass(frozen=True)
class FallRule:
    """A cliff: a fall of at least `min_pp` points between two of a run's `validations`
    (earlier minus later) whose z clears the one-sided Bonferroni bound over all their pairs."""

    validations: int
    alpha: float = FALSE_ALARM
    min_pp: float = CLIFF_PP

    @property
    def pairs(self) -> int:
        return max(1, self.validations * (self.validations - 1) // 2)

    @property
    def z(self) -> float:
        return normal_quantile(1 - self.alpha / self.pairs)

    def detectable_pp(self, se_pp: float, power: float = POWER) -> float:
        """The smallest true fall found with `power`, at a fall's standard error of `se_pp`
        points (and at least the points threshold)."""
        return max(self.min_pp, (self.z + normal_quantile(power)) * se_pp)

    def describe(self) -> str:
        return (f"a fall of {self.min_pp:g}+ points at z >= {self.z:.2f} (one-sided, Bonferroni over the "
                f"{self.pairs} pairs of {self.validations} validations: {100 * self.alpha:g}% family-wise)")


@dataclass(frozen=True)
class Fall:
    """A run's fall judged by a FallRule: the pair it rests on and its test."""

    drop_pp: float  # earlier minus later, points (0.0: never fell)
    peak_step: int | None
    step: int | None
    se_pp: float | None  # None: no standard error known (rows without val/acc_se or records)
    paired: bool
    rule: FallRule

    @property
    def z(self) -> float | None:
        if self.se_pp is None:
            return None
        return self.drop_pp / self.se_pp if self.se_pp > 0 else (math.inf if self.drop_pp > 0 else 0.0)

    @property
    def significant(self) -> bool | None:
        """Whether the fall clears the rule's z (None: its noise is unknown)."""
        return None if self.z is None else self.z >= self.rule.z

    @property
    def cliff(self) -> bool:
        """Large and significant (large alone where the noise is unknown: an older run)."""
        return self.drop_pp >= self.rule.min_pp and self.significant is not False

    def test(self) -> str:
        """Which test judged it, in words."""
        if self.se_pp is None:
            return "points alone (no standard error recorded)"
        how = "paired by problem" if self.paired else "unpaired (no per-problem records)"
        return f"{how}: z = {self.z:.2f} against {self.rule.z:.2f}"


def largest_fall(evals: Evaluations, rule: FallRule) -> Fall | None:
    """The fall a run is judged by: among the pairs (earlier, later) falling at least the
    rule's points, the one with the largest z (a cliff if any clears the rule); None without
    such a pair (no cliff). Ties keep the earlier steps."""
    steps = sorted(evals.acc)
    best: Fall | None = None
    for j, later in enumerate(steps):
        for earlier in steps[:j]:
            drop = 100 * (evals.acc[earlier] - evals.acc[later])
            if drop < rule.min_pp - 1e-9:
                continue
            diff = evals.difference(earlier, later)
            fall = Fall(drop, earlier, later, None if diff is None else 100 * diff.se,
                        diff is not None and diff.paired, rule)
            if best is None or _stronger(fall, best):
                best = fall
    return best


def first_cliff(evals: Evaluations, rule: FallRule) -> tuple[int, Fall] | None:
    """The validation at which the rule first finds a cliff among the validations so far
    (the step a detector watching them would act at, and the fall it found); None when the
    run never holds one. The trainer's train.fall_alert and collect's replay both ask this."""
    steps = sorted(evals.acc)
    for end in range(2, len(steps) + 1):
        seen = set(steps[:end])
        prefix = Evaluations({s: a for s, a in evals.acc.items() if s in seen},
                             {s: v for s, v in evals.se.items() if s in seen},
                             {s: r for s, r in evals.records.items() if s in seen})
        fall = largest_fall(prefix, rule)
        if fall is not None and fall.cliff:
            return steps[end - 1], fall
    return None


def _stronger(a: Fall, b: Fall) -> bool:
    """Whether fall `a` is better evidence than `b`: a larger z, else (no SE) a larger drop."""
    if a.z is not None and b.z is not None and a.z != b.z:
        return a.z > b.z
    return a.drop_pp > b.drop_pp


def detectable_difference(sd_pp: float, seeds: int, measured: bool, alpha: float = FALSE_ALARM,
                          power: float = POWER) -> float | None:
    """The smallest true difference between two cells' means over `seeds` seeds each found at
    a two-sided `alpha` with `power`, for a seed-to-seed standard deviation of `sd_pp` points.
    `measured`: sd comes from the seeds themselves (Student t, 2(seeds-1) degrees of freedom;
    None below 2 seeds); else it was given (normal quantiles)."""
    if seeds < 1 or not math.isfinite(sd_pp):
        return None
    if measured:
        df = 2 * (seeds - 1)
        if df < 1:
            return None
        q = t_quantile(1 - alpha / 2, df) + t_quantile(power, df)
    else:
        q = normal_quantile(1 - alpha / 2) + normal_quantile(power)
    return q * sd_pp * math.sqrt(2 / seeds)


def detectable_paired(sd_pp: float, pairs: int, alpha: float = FALSE_ALARM, power: float = POWER) -> float | None:
    """The smallest true mean of paired differences (per seed, matched by seed number) that
    a t test over `pairs` differences with SD `sd_pp` finds at a two-sided `alpha` with
    `power`; None below 2 pairs (no spread to measure)."""
    if pairs < 2 or not math.isfinite(sd_pp):
        return None
    return (t_quantile(1 - alpha / 2, pairs - 1) + t_quantile(power, pairs - 1)) * sd_pp / math.sqrt(pairs)
