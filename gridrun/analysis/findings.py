"""The findings table: the paper's four claims, measured on a sweep, each holding or not.

    findings         per claim: the paper's statement, then one row per block of cells with
                     gridrun's measurement (mean ± 95% CI over seeds: a Student t interval over
                     the per-seed values of a paired difference, stats.mean_ci95) and a verdict
    findings_alerts  per cell that can show a mechanism: how many training steps its alert held,
                     the step it first fired and that step minus the cell's validation peak step
                     (negative: it fired before the peak)

The claims: (a) multi-agent RL beats the base model in most cells, and beats its shuffled-
reward control (plus SA-RL against its own shuffled control, the control's calibration);
(b) IP peaks higher than SP on most matched cells and falls further from its peak by the
end; (c) Voting-IP `gradient_amplification`: the generator's chi2 and perplexity
peak-over-first ratios exceed the aggregator's; (d) Voting-SP `sp_role_capture`: the
aggregator's terse rate falls and its mean length rises (first to last validation); (e), in a
sweep with variants (gridrun/grid/spec.py): each remedy against `natural` on paired seeds, per
(task, scale, workflow, policy) block: does it keep the ceiling (its peak minus natural's,
claimed above -PEAK_MARGIN_PP: not lower by more than that) and shrink the late drop
(natural's peak - final minus the remedy's, claimed above 0)? The variant named `natural` is
the reference and one named `injected` the positive control (not a remedy); every other
variant is a remedy, and one named `injected_<remedy>` (the remedy on top of the positive
control's injection) is measured the same way against `injected`: does it keep the injected
cells' ceiling and shrink the injected mechanism's late drop? With variants, (a)-(d) are measured on the `natural` cells and the
controls (the paper's setting).

A row's verdict, for a difference claimed positive: holds when its 95% interval lies above 0,
does not hold when the interval lies at or below 0, inconclusive otherwise (one seed gives no
interval: inconclusive). A "most cells" claim holds when more than half its rows hold, does not
hold when even every inconclusive row holding would not make a majority, else inconclusive;
an "every block" claim (c, d) holds when all its rows hold and does not hold when one does not.
A claim whose cells the sweep lacks says "not measured" and what it needs. Only `done` cells
count; seeds pair by seed number (a train cell and its shuffled twin share data order and
initialisation). Leaves out: multiple-comparison corrections and effect sizes beyond the mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from gridrun.analysis.stats import mean_ci95
from gridrun.analysis.tables import POLICY_LABELS, Table, blocks, number
from gridrun.seam.cellstate import CellState
from gridrun.seam.mechanisms import MECHANISMS
from gridrun.seam.metric_keys import role_key, val_key
from gridrun.seam.registry import single_agent_workflow
from gridrun.seam.significance import detectable_paired

HOLDS, FAILS, UNSURE = "holds", "does not hold", "inconclusive"
STATEMENTS = {
    "a": "Multi-agent RL beats the base model in most cells, and beats its shuffled-reward control.",
    "b": "IP peaks higher than SP on most matched cells, and falls further from its peak by the end.",
    "c": "Voting-IP gradient_amplification: the generator's χ² and perplexity peak-over-first ratios "
         "exceed the aggregator's.",
    "d": "Voting-SP sp_role_capture: the aggregator's terse rate falls and its length rises.",
    "e": "Each remedy keeps the ceiling (peak) and shrinks the late drop (peak − final) against `natural` "
         "(an `injected_<remedy>` against `injected`).",
}
REFERENCE_VARIANT, POSITIVE_CONTROL = "natural", "injected"
# Keeping the ceiling: a remedy's peak may sit at most this many points under natural's.
PEAK_MARGIN_PP = 2.0
FINDINGS_COLUMNS = ["claim", "measurement", "task", "scale", "workflow", "policy", "n", "mean", "ci95", "unit", "verdict",
                    "test", "detectable"]


@dataclass
class Measured:
    """One row of a claim: per-seed values of a difference claimed to have `sign`."""

    measurement: str
    where: tuple[str, str, str, str]  # task, scale, workflow, policy ("" where it does not apply)
    values: list[float]
    unit: str
    sign: int = 1
    needs: str = ""  # when set, the row was not measured and this says what it needs

    @property
    def verdict(self) -> str:
        if self.needs:
            return f"not measured (needs {self.needs})"
        return verdict(self.values, self.sign)

    def test(self) -> str:
        """Which test the verdict rests on."""
        if self.needs:
            return ""
        n = len(self.values)
        return f"t over {n} seeds paired by number" if n > 1 else "none: one seed measures no spread"

    def detectable(self) -> float | None:
        """The smallest true mean difference the row's test finds with 80% power, at the spread
        of its per-seed differences (None: fewer than 2 seeds)."""
        if len(self.values) < 2:
            return None
        mean = sum(self.values) / len(self.values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in self.values) / (len(self.values) - 1))
        return detectable_paired(sd, len(self.values))


@dataclass
class Part:
    """One statement of a claim, its rows, and how they combine ("most" or "every" row)."""

    name: str
    rows: list[Measured]
    rule: str
    counts: bool = True  # False: shown beside the claim, not part of its verdict

    def measured(self) -> list[str]:
        return [row.verdict for row in self.rows if not row.needs]

    @property
    def verdict(self) -> str:
        held = self.measured()
        return combine(held, self.rule) if held else f"not measured (needs {self.rows[0].needs})"


@dataclass
class Claim:
    key: str
    parts: list[Part] = field(default_factory=list)
    needs: str = ""


def verdict(values: Sequence[float], sign: int = 1) -> str:
    """holds / does not hold / inconclusive for per-seed values claimed to have `sign` (see module)."""
    if len(values) < 2:
        return UNSURE
    mean, ci = mean_ci95([sign * v for v in values])
    if mean - ci > 0:
        return HOLDS
    return FAILS if mean + ci <= 0 else UNSURE


def combine(verdicts: list[str], rule: str) -> str:
    """A claim part's verdict from its rows' (rule: "most" or "every")."""
    held, failed = verdicts.count(HOLDS), verdicts.count(FAILS)
    if rule == "most":
        if held > len(verdicts) / 2:
            return HOLDS
        return FAILS if len(verdicts) - failed <= len(verdicts) / 2 else UNSURE
    if failed:
        return FAILS
    return HOLDS if held == len(verdicts) else UNSURE


# --- pairing seeds ---------------------------------------------------------------------------------
def _done(cells: pd.DataFrame, column: str) -> dict[int, float]:
    """seed -> value of the done cells with a value (a base control's seed is None: key -1)."""
    if column not in cells:
        return {}
    done = cells[(cells["state"] == CellState.DONE) & cells[column].notna()]
    return {(-1 if pd.isna(seed) else int(seed)): float(value) for seed, value in zip(done["seed"], done[column])}


def _paired(a: dict[int, float], b: dict[int, float], scale: float = 1.0,
            value: Callable[[float, float], float] = lambda x, y: x - y) -> list[float]:
    return [scale * value(a[seed], b[seed]) for seed in sorted(a) if seed in b]


def _select(cells: pd.DataFrame, kind: str, task: str, scale: str, workflow: str, policy: str | None = None) -> pd.DataFrame:
    picked = cells[(cells["kind"] == kind) & (cells["task"] == task) & (cells["scale"] == scale)
                   & (cells["workflow"] == workflow)]
    return picked if policy is None else picked[picked["policy"] == policy]


def _measured(name: str, where: tuple[str, str, str, str], values: list[float], unit: str, sign: int,
              needs: str) -> Measured:
    return Measured(name, where, values, unit, sign, "" if values else needs)


# --- the claims ------------------------------------------------------------------------------------
def claim_a(cells: pd.DataFrame) -> Claim:
    claim = Claim("a")
    over_base, over_shuffled = [], []
    for task, scale, workflow in blocks(cells, ("train",)):
        base = _done(_select(cells, "base", task, scale, workflow), "peak_val_acc").get(-1)
        for policy in ("isolated", "shared"):
            train = _select(cells, "train", task, scale, workflow, policy)
            if not len(train):
                continue
            where = (task, scale, workflow, POLICY_LABELS[policy])
            peaks = _done(train, "peak_val_acc")
            values = [100 * (peak - base) for _, peak in sorted(peaks.items())] if base is not None else []
            over_base.append(_measured("peak − base", where, values, "pp", 1,
                                       f"done `train` cells and `base-{workflow}-{scale}-{task}`"))
            # Against its control at the end, both after the same updates: a shuffled twin's
            # peak is mostly its step 0 (the base model: an uninformative reward only degrades).
            shuffled = _select(cells, "shuffled", task, scale, workflow, policy)
            if len(shuffled):
                over_shuffled.append(_measured("final − shuffled twin's final", where,
                                               _paired(_done(train, "final_val_acc"), _done(shuffled, "final_val_acc"), 100),
                                               "pp", 1, "done train cells and shuffled twins of the same seeds"))
    if not over_base:
        claim.needs = "done multi-agent `train` cells and their `base` controls"
        return claim
    claim.parts.append(Part("beats base in most cells", over_base, "most"))
    claim.parts.append(Part("beats its shuffled control in most cells", over_shuffled or [Measured(
        "final − shuffled twin's final", ("", "", "", ""), [], "pp",
        needs="`shuffled` cells: add `shuffled` to the sweep's `kind` axis")], "most"))
    sa_rl = []
    for task, scale in dict.fromkeys(zip(cells["task"], cells["scale"])):
        single = single_agent_workflow()
        shuffled = _select(cells, "shuffled", task, scale, single)
        if len(shuffled):
            rl = _done(_select(cells, "sa_rl", task, scale, single), "final_val_acc")
            sa_rl.append(_measured("SA-RL final − shuffled SA-RL final", (task, scale, single, ""),
                                   _paired(rl, _done(shuffled, "final_val_acc"), 100), "pp", 1,
                                   "done sa_rl cells and shuffled twins of the same seeds"))
    if sa_rl:
        claim.parts.append(Part("SA-RL beats its shuffled control (a check of the control, not of the claim)",
                                sa_rl, "every", counts=False))
    return claim


def claim_b(cells: pd.DataFrame) -> Claim:
    claim = Claim("b")
    higher, drops = [], []
    for task, scale, workflow in blocks(cells, ("train",)):
        ip = _select(cells, "train", task, scale, workflow, "isolated")
        sp = _select(cells, "train", task, scale, workflow, "shared")
        if not (len(ip) and len(sp)):
            continue
        where = (task, scale, workflow, "IP − SP")
        needs = "done IP and SP cells of the same seeds"
        higher.append(_measured("peak", where, _paired(_done(ip, "peak_val_acc"), _done(sp, "peak_val_acc"), 100),
                                "pp", 1, needs))
        # drop_from_peak is final - peak (<= 0): falling further is the more negative one.
        drops.append(_measured("fall from peak to the end", where,
                               _paired(_done(ip, "drop_from_peak"), _done(sp, "drop_from_peak"), -100), "pp", 1, needs))
    if not higher:
        claim.needs = "IP and SP `train` cells of the same workflow, task and scale"
        return claim
    claim.parts += [Part("IP peaks higher in most matched cells", higher, "most"),
                    Part("IP falls further from its peak in most matched cells", drops, "most")]
    return claim


def _voting_blocks(cells: pd.DataFrame, policy: str) -> list[tuple[str, str, pd.DataFrame]]:
    voting = cells[(cells["kind"] == "train") & (cells["workflow"] == "voting") & (cells["policy"] == policy)]
    return [(task, scale, group) for (task, scale), group in voting.groupby(["task", "scale"], sort=False)]


def claim_c(cells: pd.DataFrame) -> Claim:
    claim = Claim("c")
    rows = []
    for task, scale, group in _voting_blocks(cells, "isolated"):
        for metric, label in (("chi2", "χ²"), ("ppl", "perplexity")):
            rows.append(_measured(
                f"generator − aggregator {label} peak/first", (task, scale, "voting", "IP"),
                _paired(_done(group, role_key("generator", f"{metric}_ratio")), _done(group, role_key("aggregator", f"{metric}_ratio"))),
                "ratio", 1, f"done cells with both roles' {label} ratios (a first value > 0)"))
    if not rows:
        claim.needs = "Voting-IP `train` cells"
        return claim
    claim.parts.append(Part("in every block, on both ratios", rows, "every"))
    return claim


def claim_d(cells: pd.DataFrame) -> Claim:
    claim = Claim("d")
    rows = []
    for task, scale, group in _voting_blocks(cells, "shared"):
        where = (task, scale, "voting", "SP")
        rows.append(_measured("aggregator terse rate, last − first validation", where,
                              [100 * v for v in _done(group, val_key(role_key("aggregator", "terse_rate_change"))).values()],
                              "pp", -1, "done cells with the aggregator's terse rate at two validations"))
        rows.append(_measured("aggregator mean length, last − first validation", where,
                              list(_done(group, val_key(role_key("aggregator", "len_mean_change"))).values()),
                              "tokens", 1, "done cells with the aggregator's length at two validations"))
    if not rows:
        claim.needs = "Voting-SP `train` cells"
        return claim
    claim.parts.append(Part("in every block, both signatures", rows, "every"))
    return claim


def claim_e(cells: pd.DataFrame) -> Claim:
    claim = Claim("e")
    variants = list(dict.fromkeys(cells["variant"].dropna())) if "variant" in cells else []
    remedies = [v for v in variants if v not in (REFERENCE_VARIANT, POSITIVE_CONTROL)]
    if REFERENCE_VARIANT not in variants or not remedies:
        claim.needs = f"a sweep with variants: `{REFERENCE_VARIANT}` and at least one remedy"
        return claim
    train = cells[cells["kind"] == "train"]
    for remedy in remedies:
        kept, shrunk = [], []
        against = POSITIVE_CONTROL if remedy.startswith(f"{POSITIVE_CONTROL}_") else REFERENCE_VARIANT
        for (task, scale, workflow, policy), block in train.groupby(["task", "scale", "workflow", "policy"], sort=False):
            natural, treated = block[block["variant"] == against], block[block["variant"] == remedy]
            if not (len(natural) and len(treated)):
                continue
            where = (task, scale, workflow, POLICY_LABELS.get(policy, policy))
            needs = f"done `{against}` and `{remedy}` cells of the same seeds"
            kept.append(_measured(f"{remedy} peak − {against} peak (+{PEAK_MARGIN_PP:g} pt margin)", where,
                                  _paired(_done(treated, "peak_val_acc"), _done(natural, "peak_val_acc"), 100,
                                          lambda x, y: x - y + PEAK_MARGIN_PP / 100), "pp", 1, needs))
            # drop_from_peak = final - peak (<= 0): the remedy's minus the reference's is the
            # reference's late drop minus the remedy's, positive when the remedy shrank it.
            shrunk.append(_measured(f"{against} late drop − {remedy}'s", where,
                                    _paired(_done(treated, "drop_from_peak"), _done(natural, "drop_from_peak"), 100),
                                    "pp", 1, needs))
        if kept:
            claim.parts += [Part(f"{remedy} keeps the peak in most blocks", kept, "most"),
                            Part(f"{remedy} shrinks the late drop in most blocks", shrunk, "most")]
    if not claim.parts:
        claim.needs = f"`train` cells of `{REFERENCE_VARIANT}` and a remedy in one block"
    return claim


def claims(cells: pd.DataFrame) -> list[Claim]:
    """(a)-(d) on the reference variant's cells and the controls (all cells without
    variants), (e) across the variants."""
    reference = cells
    if "variant" in cells and cells["variant"].notna().any():
        reference = cells[cells["variant"].isna() | (cells["variant"] == REFERENCE_VARIANT)]
    return [claim_a(reference), claim_b(reference), claim_c(reference), claim_d(reference), claim_e(cells)]


def claim_verdict(claim: Claim) -> str:
    if claim.needs:
        return f"not measured (needs {claim.needs})"
    parts = [part for part in claim.parts if part.counts]
    measured = [part.verdict for part in parts if part.measured()]
    if FAILS in measured:
        return FAILS
    if not measured:
        return "not measured"
    if all(v == HOLDS for v in measured):
        return HOLDS if len(measured) == len(parts) else f"{HOLDS} where measured (a part is not measured)"
    return UNSURE


# --- the tables ------------------------------------------------------------------------------------
def findings_table(cells: pd.DataFrame) -> Table:
    """The findings table (see the module docstring)."""
    rows, shown = [], []
    for claim in claims(cells):
        overall = claim_verdict(claim)
        rows.append([claim.key, STATEMENTS[claim.key], "", "", "", "", "", "", "", "", overall, "", ""])
        shown.append([f"**({claim.key})**", STATEMENTS[claim.key], "", "", f"**{overall}**", ""])
        for part in claim.parts:
            held = part.measured()
            summary = f"{held.count(HOLDS)}/{len(held)} rows hold" if held else ""
            rows.append([claim.key, part.name, "", "", "", "", str(len(held)), "", "", "", part.verdict, "", ""])
            shown.append(["", f"*{part.name}*", "", summary, f"*{part.verdict}*", ""])
            for m in part.rows:
                if m.needs and not held and len(part.rows) == 1:
                    continue  # the part's line already says what it needs
                mean, ci = mean_ci95(m.values) if m.values else (math.nan, math.nan)
                rows.append([claim.key, m.measurement, *m.where, str(len(m.values)), number(mean, 2), number(ci, 2),
                             m.unit, m.verdict, m.test(), number(m.detectable(), 2)])
                cell = " ".join(p for p in m.where if p)
                value = "" if not m.values else (number(mean, 2, signed=True)
                                                 + (f" ± {number(ci, 2)}" if len(m.values) > 1 else "")
                                                 + f" {m.unit} (n={len(m.values)})")
                detectable = m.detectable()
                test = m.test() + (f"; detects {number(detectable, 2)} {m.unit}" if detectable is not None else "")
                shown.append(["", m.measurement, cell, value, m.verdict, test])
    return Table(
        name="findings", title="Findings — the paper's claims on this sweep",
        caption="Each claim, then each part's verdict, then one row per block of cells: mean ± 95% CI over seeds "
        "(Student t interval over the per-seed values of the difference; seeds paired by number). A row holds "
        "when its interval excludes 0 on the claimed side, does not hold when it excludes the claimed side, and is "
        "inconclusive otherwise (one seed: no interval). Only done cells count. Test: what the verdict rests on, "
        "and the smallest true difference it finds with 80% power at the spread its seeds show (a difference "
        "under it is not evidence of no effect).",
        columns=FINDINGS_COLUMNS, headers=["Claim", "Measurement", "Cells", "gridrun (mean ± 95% CI)", "Verdict",
                                           "Test (detects)"],
        rows=rows, shown=shown, left=3,
    )


def alerts_table(cells: pd.DataFrame) -> Table:
    """Per cell that can show a mechanism: steps it held, first step, first step - peak step."""
    columns = ["cell", "state", "mechanism", "fired_steps", "steps", "first_step", "peak_step", "first_minus_peak"]
    rows = []
    for mechanism in MECHANISMS:
        fired_column = f"alert/{mechanism}/fired"
        if fired_column not in cells:
            continue
        for _, row in cells[cells[fired_column].notna()].iterrows():
            first, peak = row[f"alert/{mechanism}/first_step"], row["peak_step"]
            lead = "" if pd.isna(first) or pd.isna(peak) else f"{int(first) - int(peak):+d}"
            rows.append([row["cell"], row["state"], mechanism, str(int(row[fired_column])),
                         str(int(row[f"alert/{mechanism}/steps"])), "" if pd.isna(first) else str(int(first)),
                         "" if pd.isna(peak) else str(int(peak)), lead])
    notes = [] if rows else [("No cell of this sweep can show a mechanism alert (IP Voting or Orch-Workers cells for "
                             "gradient_amplification, multi-agent SP cells for sp_role_capture).")]
    return Table(
        name="findings_alerts", title="Mechanism alerts — how often each fired, and when against the peak",
        caption="The alerts of gridrun/seam/mechanisms.py replayed on each cell's metrics.jsonl with the current "
        "thresholds: training steps at which the alert held (of the steps replayed), its first step, and that "
        "step minus the cell's validation peak step (negative: it fired before the peak).",
        columns=columns, headers=["Cell", "State", "Mechanism", "Fired (steps)", "Steps", "First step", "Peak step",
                                  "First − peak"],
        rows=rows, left=3, notes=notes,
    )
