"""The paper's tables from cells.parquet's frame, each written as .md, .csv and .tex.

    table1        peak validation accuracy (%) per (task, scale, workflow): base, SA-RL, IP,
                  SP and the residuals IP-SA, SP-SA (the ceiling); beside each of the four,
                  the peak's test accuracy (`<name>_test`: the checkpoint chosen on val,
                  measured once on the test split; "no test" for a run without one); its csv
                  adds where the SA-RL, IP and SP peaks' checkpoints are (`peak_checkpoint`)
    selection_bias  per cell with both, peak (val) - test at the same checkpoint (points),
                  and its mean over trained cells and over base cells (no choice: the two
                  splits' difference alone)
    table1_final  the same with each cell's final validation accuracy (the floor)
    table2        per-role peak-over-first-step ratios of chi2, perplexity and grad norm and
                  the chi2 peak step, on matched IP-vs-SP cells; under SP the shared adapter's
                  row (roles token-weighted) and every role's own row
    table3        single-agent transfer: each workflow with the SA-RL adapter on its generator
                  (`transfer` cells' validation accuracy) against its base control and SA-RL
    table4..6     per-role trajectory signatures (val/role/<role>/...) at the first, peak and
                  last validation of flagged cells: 4 `gradient_amplification` (IP), 5
                  `sp_role_capture` on Eval-Opt/Voting (token-distribution asymmetry), 6 on
                  Orch-Workers (per-episode frequency asymmetry)

With several seeds a value is the mean over finished seeds with `_n` and `_ci95` (Student t)
columns; only `done` cells give numbers, others show as their state. Tables 4-6 are per cell
(a seed is a cell) and so carry no intervals. What this leaves out: significance tests, and
flags other than the two mechanisms (`flags`: a mechanism's alert held at some step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from gridrun.analysis.stats import Entry
from gridrun.seam.cellstate import CellState
from gridrun.seam.mechanisms import MECHANISMS
from gridrun.seam.metric_keys import ADAPTER, ROLE, role_key, val_key
from gridrun.seam.registry import single_agent_workflow
from gridrun.seam.runconfig import TRAINED_KINDS, CellKind

HEADERS = {"base": "Base", "sa_rl": "SA-RL", "ip": "IP", "sp": "SP", "ip_minus_sa": "IP−SA", "sp_minus_sa": "SP−SA"}
# The reward controls' columns (`shuffled` cells: their twin's training with each step's rewards
# permuted across its episodes), added after the others when the sweep has such cells.
SHUFFLED_HEADERS = {"sa_rl_shuffled": "SA-RL shuffled", "ip_shuffled": "IP shuffled", "sp_shuffled": "SP shuffled"}
TABLE1_COLUMNS = ("task", "scale", "workflow", *HEADERS)
TRAIN_POLICIES = {"isolated": "ip", "shared": "sp"}
WORKFLOW_ORDER = ("eval_opt", "voting", "orch_workers")
# Table 1's columns that get a test column beside them (`<name>_test`), and the two-sided 95%
# normal quantile of one cell's test (its sampling SE; several seeds take the t-interval).
TESTED = ("base", "sa_rl", "ip", "sp")
Z95 = 1.96
# The paper's short names of the policies, as every table and figure labels them.
POLICY_LABELS = {"isolated": "IP", "shared": "SP"}


@dataclass
class Table:
    """A table as text: what md, csv and tex are written from."""

    name: str  # file stem: table1, table2, ...
    title: str
    caption: str
    columns: list[str]  # csv header (machine names)
    headers: list[str]  # md/tex header (reader's names)
    rows: list[list[str]]  # csv values, one list per row
    shown: list[list[str]] = field(default_factory=list)  # md/tex values (defaults to rows)
    left: int = 3  # leading columns aligned left
    notes: list[str] = field(default_factory=list)  # md lines after the table

    def display_rows(self) -> list[list[str]]:
        return self.shown or self.rows

    def csv(self) -> str:
        return str(pd.DataFrame(self.rows, columns=self.columns).to_csv(index=False))

    def markdown(self, heading: str = "#") -> str:
        lines = [f"{heading} {self.title}", "", self.caption, ""]
        if self.rows:
            lines += markdown_grid(self.headers, self.display_rows(), self.left)
        if self.notes:
            lines += ["", *self.notes] if self.rows else self.notes
        return "\n".join(lines) + "\n"

    def latex(self) -> str:
        def esc(text: str) -> str:
            text = text.replace("_", r"\_").replace("±", r"$\pm$").replace("−", "$-$").replace("%", r"\%")
            return r"\textit{" + text.strip("*") + "}" if text.startswith("*") and text.endswith("*") else text

        right = len(self.headers) - self.left
        lines = [r"\begin{tabular}{" + "l" * self.left + "r" * right + "}", r"\toprule",
                 " & ".join(esc(h) for h in self.headers) + r" \\", r"\midrule"]
        lines += [" & ".join(esc(str(v)) for v in row) + r" \\" for row in self.display_rows()]
        lines += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines) + "\n"


def markdown_grid(headers: Sequence[str], rows: Iterable[Sequence[str]], left: int) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] * left + ["---:"] * (len(headers) - left)) + "|"]
    return lines + ["| " + " | ".join(_cell(str(v)) for v in row) + " |" for row in rows]


def _cell(text: str) -> str:
    """A value kept inside its table cell: a pipe escaped, line breaks as spaces (an error
    message or a path may hold either)."""
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


# --- formatting ---------------------------------------------------------------------------------
def number(value: float | None, digits: int = 1, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def shown(entry: Entry, several: bool, digits: int = 1, scale: float = 1.0) -> str:
    """A value as a reader sees it: the mean (± CI, n with several seeds) or *state*."""
    if entry.mean is None:
        return f"*{entry.word()}*"
    text = number(entry.mean * scale, digits)
    if several and entry.n > 1:
        text += f" ± {number(entry.ci95 * scale, digits)}"
    return text + (f" (n={entry.n})" if several else "")


def entry(frame: pd.DataFrame, column: str, scale: float = 1.0) -> Entry:
    """The done cells' values of `column` (times `scale`) and every cell's state."""
    if column not in frame:
        return Entry([], list(frame["state"]))
    done = frame[(frame["state"] == CellState.DONE) & frame[column].notna()]
    return Entry([scale * float(v) for v in done[column]], list(frame["state"]))


def several_seeds(cells: pd.DataFrame) -> bool:
    seeded = cells[cells["kind"].isin([kind.value for kind in CellKind if kind.seeded])]
    keys = ["kind", "workflow", "task", "scale", "policy"]
    return bool(len(seeded)) and int(seeded.groupby(keys, dropna=False).size().max()) > 1


def ordered_workflows(values: Iterable[str]) -> list[str]:
    present = list(dict.fromkeys(values))
    return [w for w in WORKFLOW_ORDER if w in present] + sorted(set(present) - set(WORKFLOW_ORDER))


def blocks(cells: pd.DataFrame, kinds: Sequence[str]) -> list[tuple[str, str, str]]:
    """(task, scale, workflow) keys of the cells of these kinds, multi-agent workflows only."""
    keyed = cells[cells["kind"].isin(kinds) & (cells["workflow"] != single_agent_workflow())]
    keys = list(dict.fromkeys(zip(keyed["task"], keyed["scale"], keyed["workflow"])))
    rank = {w: i for i, w in enumerate(ordered_workflows(k[2] for k in keys))}
    task_scale = list(dict.fromkeys((t, s) for t, s, _ in keys))
    return sorted(keys, key=lambda k: (task_scale.index((k[0], k[1])), rank[k[2]]))


# --- Table 1 ------------------------------------------------------------------------------------
def shuffled_columns(cells: pd.DataFrame) -> list[str]:
    """Table 1's reward-control columns that the sweep has cells for (SA-RL's twin has workflow
    `single`; a workflow's twins keep its policy)."""
    shuffled = cells[cells["kind"] == "shuffled"]
    present = {"sa_rl_shuffled": bool((shuffled["workflow"] == single_agent_workflow()).any()),
               "ip_shuffled": bool((shuffled["policy"] == "isolated").any()),
               "sp_shuffled": bool((shuffled["policy"] == "shared").any())}
    return [name for name in SHUFFLED_HEADERS if present[name]]


def grouping_policies(cells: pd.DataFrame) -> list[str]:
    """The train cells' policies beyond the paper's two (groupings, policy grouped), in order."""
    train = cells[cells["kind"] == "train"]
    return [p for p in dict.fromkeys(train["policy"].dropna()) if p not in POLICY_LABELS]


def table1(cells: pd.DataFrame, value: str = "peak_val_acc") -> Table:
    """Table 1 of `value` (peak_val_acc: the ceiling; final_val_acc: the floor), with a column
    per kind of `shuffled` twin the sweep has, and one per grouping (`policy_<name>`, headed by
    the policy option's name) its train cells have."""
    several = several_seeds(cells)
    controls = shuffled_columns(cells)
    groupings = {f"policy_{p}": p for p in grouping_policies(cells)}
    headers = {**HEADERS, **{name: SHUFFLED_HEADERS[name] for name in controls}, **groupings}
    columns = [*TABLE1_COLUMNS, *controls, *groupings]
    if several:
        columns += [f"{name}_{suffix}" for name in headers for suffix in ("n", "ci95")]
    # The ceiling's adapters: where each peak's checkpoint is (csv only; `gridrun export`).
    trained = ("sa_rl", "ip", "sp") if value == "peak_val_acc" and "peak_checkpoint" in cells else ()
    columns += [f"{name}_peak_checkpoint" for name in trained]
    tested = TESTED if value == "peak_val_acc" else ()
    columns += [f"{name}_test{suffix}" for name in tested for suffix in ("", "_n", "_ci95")]
    rows, display = [], []
    for task, scale, workflow in blocks(cells, ("train", "base", "shuffled")):
        block = cells[(cells["task"] == task) & (cells["scale"] == scale)]
        train = block[(block["kind"] == "train") & (block["workflow"] == workflow)]
        frames = {
            # A base control evaluates once: its peak and final are the same number.
            "base": block[(block["kind"] == "base") & (block["workflow"] == workflow)],
            "sa_rl": block[block["kind"] == "sa_rl"],
            "ip": train[train["policy"] == "isolated"],
            "sp": train[train["policy"] == "shared"],
        }
        entries = {name: entry(frame, value, 100) for name, frame in frames.items()}
        shuffled = block[block["kind"] == "shuffled"]
        twins = {"sa_rl_shuffled": shuffled[shuffled["workflow"] == single_agent_workflow()],
                 "ip_shuffled": shuffled[(shuffled["workflow"] == workflow) & (shuffled["policy"] == "isolated")],
                 "sp_shuffled": shuffled[(shuffled["workflow"] == workflow) & (shuffled["policy"] == "shared")]}
        csv_row = {"task": task, "scale": scale, "workflow": workflow}
        shown_row = [task, scale, workflow]
        for name in trained:
            done = frames[name][frames[name]["state"] == CellState.DONE]
            csv_row[f"{name}_peak_checkpoint"] = " ".join(str(p) for p in done["peak_checkpoint"].dropna())
        for name, item in entries.items():
            csv_row[name] = number(item.mean) if item.mean is not None else item.word()
            csv_row[f"{name}_n"], csv_row[f"{name}_ci95"] = str(item.n), number(item.ci95)
            shown_row.append(shown(item, several))
            if name in tested:
                test, ci95 = test_entry(frames[name])
                csv_row[f"{name}_test"] = number(test.mean) if test.mean is not None else test_word(test)
                csv_row[f"{name}_test_n"], csv_row[f"{name}_test_ci95"] = str(test.n), number(ci95)
                shown_row.append(f"*{test_word(test)}*" if test.mean is None else number(test.mean)
                                 + (f" ± {number(ci95)}" if not math.isnan(ci95) else "")
                                 + (f" (n={test.n})" if several else ""))
        for policy in ("ip", "sp"):
            name = f"{policy}_minus_sa"
            diff = entries[policy].minus(entries["sa_rl"])
            if diff is None:
                csv_row[name], csv_row[f"{name}_n"], csv_row[f"{name}_ci95"] = "n/a", "0", ""
                shown_row.append("*n/a*")
                continue
            mean, n, ci95 = diff
            csv_row[name], csv_row[f"{name}_n"], csv_row[f"{name}_ci95"] = number(mean), str(n), number(ci95)
            text = number(mean, signed=True)
            if several:
                text += (f" ± {number(ci95)}" if n > 1 else "") + f" (n={n})"
            shown_row.append(text)
        columned = [*((name, twins[name]) for name in controls),
                    *((name, train[train["policy"] == policy]) for name, policy in groupings.items())]
        for name, frame in columned:
            item = entry(frame, value, 100)
            csv_row[name] = number(item.mean) if item.mean is not None else item.word()
            csv_row[f"{name}_n"], csv_row[f"{name}_ci95"] = str(item.n), number(item.ci95)
            shown_row.append(shown(item, several))
        rows.append([csv_row[c] for c in columns])
        display.append(shown_row)
    what = "Peak" if value == "peak_val_acc" else "Final"
    if tested:  # each tested column's val and test side by side, in the rows' order
        headers = {key: label for name, head in headers.items() for key, label in (
            ((name, f"{head} (val)"), (f"{name}_test", f"{head} (test)")) if name in tested else ((name, head),))}
    return Table(
        name="table1" if value == "peak_val_acc" else "table1_final",
        title=f"Table 1 — {what.lower()} validation accuracy" + ("" if value == "peak_val_acc" else " (the floor)"),
        caption=f"{what} validation accuracy (%); residuals are multi-agent minus SA-RL in points."
        + (" (val): the paper's peak, chosen on the validation it is reported on, so biased upward; (test): that "
           "checkpoint measured once on the held-out test split (± its sampling 95% CI with one seed)."
           + bias_sentence(cells) if tested else "")
        + (" Shuffled: the twin cell trained on each step's rewards permuted across its episodes (the reward "
           "control)." if controls else "")
        + (" Mean ± 95% CI over finished seeds (n)." if several else ""),
        columns=columns, headers=["Task", "Scale", "Workflow", *headers.values()], rows=rows, shown=display,
    )


def test_entry(frame: pd.DataFrame) -> tuple[Entry, float]:
    """The done cells' peak test accuracy (%) and its 95% half-width: over seeds (t) with
    several, else the one cell's sampling SE."""
    item = entry(frame, "peak_test_acc", 100)
    if item.n != 1:
        return item, item.ci95
    done = frame[(frame["state"] == CellState.DONE) & frame["peak_test_acc"].notna()]
    se = done["peak_test_se"].iloc[0] if "peak_test_se" in done else None
    return item, math.nan if se is None or pd.isna(se) else Z95 * 100 * float(se)


def test_word(item: Entry) -> str:
    """What a test column says instead of a number: done cells without a test row have none."""
    return "no test" if item.states and set(item.states) == {CellState.DONE} else item.word()


def _biased(cells: pd.DataFrame) -> pd.DataFrame:
    """Done cells with a selection bias (a test row at their peak)."""
    if "selection_bias_pp" not in cells:
        return cells.iloc[0:0]
    return cells[(cells["state"] == CellState.DONE) & cells["selection_bias_pp"].notna()]


def bias_sentence(cells: pd.DataFrame) -> str:
    """Table 1's caption on the selection bias: its mean over trained cells, and how many done
    cells have no test (run before the test split, or on data without one)."""
    biased = _biased(cells)
    trained = biased[biased["kind"].isin(TRAINED_KINDS)]["selection_bias_pp"]
    untested = int(((cells["state"] == CellState.DONE) & cells.get("peak_val_acc", pd.Series(dtype=float)).notna()).sum()
                   - len(biased))
    text = (f" Selection bias (peak (val) − test at the same checkpoint): {number(float(trained.mean()), signed=True)} "
            f"points on average over {len(trained)} trained cells (table `selection_bias`)." if len(trained) else "")
    return text + (f" {untested} done cells have no test evaluation (*no test*: run before the test split, or on "
                   "data without one); their val peaks stand unpaired." if untested else "")


def selection_bias_table(cells: pd.DataFrame) -> Table:
    """Per done cell with a test row at its peak: peak (val), test, and their difference."""
    columns = ["cell", "kind", "workflow", "policy", "seed", "peak_step", "peak_val", "peak_test", "test_ci95",
               "selection_bias_pp"]
    biased = _biased(cells)
    def text(value: object) -> str:
        return "" if value is None or pd.isna(value) else str(value)  # type: ignore[call-overload]

    rows = [[str(r["cell"]), str(r["kind"]), text(r.get("workflow")), text(r.get("policy")), text(r.get("seed")),
             str(r["peak_step"]),
             number(100 * r["peak_val_acc"]), number(100 * r["peak_test_acc"]),
             number(Z95 * 100 * r["peak_test_se"]) if not pd.isna(r.get("peak_test_se")) else "",
             number(r["selection_bias_pp"], signed=True)] for _, r in biased.iterrows()]
    trains = biased["kind"].isin(TRAINED_KINDS)
    groups = {"trained cells (the peak chosen among their validations)": biased[trains],
              "base cells (one validation, nothing chosen: the splits' difference alone)":
                  biased[biased["kind"] == CellKind.BASE]}
    notes = [f"- mean over {label}: {number(float(part['selection_bias_pp'].mean()), signed=True)} points "
             f"(n={len(part)})" for label, part in groups.items() if len(part)]
    if not rows:
        notes = [("No done cell has a test evaluation at its peak (a results folder from before the test split, or "
                  "data without one): nothing to measure.")]
    return Table(
        name="selection_bias", title="Selection bias of the peak",
        caption="Peak validation accuracy (%), the same checkpoint's test accuracy (%, ± its sampling 95% CI) and "
        "their difference in points: what choosing the checkpoint on val added to the number reported on val.",
        columns=columns, headers=columns, rows=rows, left=5, notes=notes,
    )


def base_mismatch_notes(flagged: pd.DataFrame) -> list[str]:
    if not len(flagged):
        return []
    notes = [
        ("**Step 0 disagrees with the base control.** Both evaluate the same base model on the same "
        "problems; check that they used the same validation split, chat template and engine:"),
        "",
    ]
    for _, row in flagged.iterrows():
        notes.append(
            f"- `{row['cell']}`: step 0 {100 * row['val_acc_step0']:.1f}% vs `{row['base_cell']}` "
            f"{100 * row['base_val_acc']:.1f}% ({row['step0_minus_base_pp']:+.1f} pp)"
        )
    return notes


# --- Table 2 ------------------------------------------------------------------------------------
RATIO_COLUMNS = (("chi2_ratio", "χ² ratio", 2), ("ppl_ratio", "PPL ratio", 2), ("grad_norm_ratio", "grad-norm ratio", 2),
                 ("chi2_peak_step", "χ² peak step", 0))


def _prefixes(cells: pd.DataFrame, pattern: str) -> list[str]:
    """`role/<r>` or `adapter/<a>` prefixes with a Table 2 column in cells' rows that have values."""
    found = []
    for column in cells.columns:
        if column.startswith(pattern) and column.endswith("/chi2_ratio") and cells[column].notna().any():
            found.append(column[: -len("/chi2_ratio")])
    if not found:  # a role without any chi2 still has its other ratios
        for column in cells.columns:
            if column.startswith(pattern) and column.endswith("/ppl_ratio") and cells[column].notna().any():
                found.append(column[: -len("/ppl_ratio")])
    return list(dict.fromkeys(found))


def table2(cells: pd.DataFrame) -> Table:
    """Per-role ratios on matched IP-vs-SP cells: under SP the shared adapter's row first."""
    several = several_seeds(cells)
    columns = ["task", "scale", "workflow", "policy", "row"]
    for name, _, _ in RATIO_COLUMNS:
        columns += [name] + ([f"{name}_n", f"{name}_ci95"] if several else [])
    rows, display = [], []
    for task, scale, workflow in blocks(cells, ("train",)):
        train = cells[(cells["kind"] == "train") & (cells["task"] == task) & (cells["scale"] == scale)
                      & (cells["workflow"] == workflow)]
        if set(train["policy"]) < {"isolated", "shared"}:
            continue  # not matched
        for policy in ("isolated", "shared"):
            group = train[train["policy"] == policy]
            prefixes = _prefixes(group, f"{ROLE}/")
            if policy == "shared":
                prefixes = _prefixes(group, f"{ADAPTER}/") + prefixes
            if not prefixes:
                prefixes = [""]  # no training metrics yet: one row carrying the cells' state
            for prefix in prefixes:
                label = "(no metrics)" if not prefix else (
                    f"all roles ({prefix.split('/', 1)[1]} adapter)" if prefix.startswith(f"{ADAPTER}/") else prefix.split("/", 1)[1])
                csv_row = [task, scale, workflow, TRAIN_POLICIES[policy].upper(), label]
                shown_row = list(csv_row)
                for name, _, digits in RATIO_COLUMNS:
                    item = entry(group, f"{prefix}/{name}")
                    csv_row.append(number(item.mean, digits) if item.mean is not None else item.word())
                    if several:
                        csv_row += [str(item.n), number(item.ci95, digits)]
                    shown_row.append(shown(item, several, digits))
                rows.append(csv_row)
                display.append(shown_row)
    return Table(
        name="table2", title="Table 2 — per-role training-dynamics ratios on matched IP-vs-SP cells",
        caption="Peak over first-training-step value of token-level χ², training perplexity and gradient norm, and "
        "the step of the χ² peak. IP: one row per role. SP: the shared adapter (roles weighted by their tokens), "
        "then each role as it shares that adapter." + (" Mean ± 95% CI over finished seeds (n)." if several else ""),
        columns=columns, headers=["Task", "Scale", "Workflow", "Policy", "Role", *(h for _, h, _ in RATIO_COLUMNS)],
        rows=rows, shown=display, left=5,
    )


# --- Table 3 ------------------------------------------------------------------------------------
def table3(cells: pd.DataFrame) -> Table:
    """Transfer cells' accuracy against the workflow's base control and the SA-RL cells."""
    several = several_seeds(cells)
    names = ("base", "sa_rl", "transfer", "transfer_minus_base", "transfer_minus_sa")
    columns = ["task", "scale", "workflow", *names]
    rows, display = [], []
    for task, scale, workflow in blocks(cells, ("transfer",)):
        block = cells[(cells["task"] == task) & (cells["scale"] == scale)]
        entries = {
            "base": entry(block[(block["kind"] == "base") & (block["workflow"] == workflow)], "final_val_acc", 100),
            # Table 1's SA-RL value (its peak), as the paper reproduces it.
            "sa_rl": entry(block[block["kind"] == "sa_rl"], "peak_val_acc", 100),
            "transfer": entry(block[(block["kind"] == "transfer") & (block["workflow"] == workflow)], "final_val_acc", 100),
        }
        csv_row = [task, scale, workflow]
        shown_row = list(csv_row)
        for item in entries.values():
            csv_row.append(number(item.mean) if item.mean is not None else item.word())
            shown_row.append(shown(item, several))
        for other in ("base", "sa_rl"):
            diff = entries["transfer"].minus(entries[other])
            csv_row.append("n/a" if diff is None else number(diff[0]))
            shown_row.append("*n/a*" if diff is None else number(diff[0], signed=True)
                             + (f" ± {number(diff[2])}" if several and diff[1] > 1 else ""))
        rows.append(csv_row)
        display.append(shown_row)
    notes = [] if rows else [
        ("No `transfer` cells in this sweep: add `transfer` to the sweep's `kind` axis to plan them "
        "(each waits for the SA-RL cell of its task, scale and seed).")
    ]
    return Table(
        name="table3", title="Table 3 — single-agent generator transfer",
        caption="Validation accuracy (%) of each workflow with the finished SA-RL adapter on its generator and "
        "the base model in every other role, against the workflow's base control and SA-RL's peak (Table 1)."
        + (" Mean ± 95% CI over finished seeds (n)." if several else ""),
        columns=columns, headers=["Task", "Scale", "Workflow", "Base", "SA-RL", "Transfer", "Transfer−Base", "Transfer−SA"],
        rows=rows, shown=display, notes=notes,
    )


# --- Tables 4-6: flagged cells' trajectory signatures --------------------------------------------
def flags(row: pd.Series) -> list[str]:
    """The mechanisms flagged in a cell: those whose alert (gridrun/seam/mechanisms.py, replayed by
    collect on the cell's rows) held at one training step or more. One definition serves the
    trainer's live alerts, the findings and Tables 4-6."""
    found = []
    for mechanism in MECHANISMS:
        fired = row.get(f"alert/{mechanism}/fired")
        if fired is None or pd.isna(fired) or int(fired) == 0:
            continue
        found.append(f"{mechanism} (held at {int(fired)} of {int(row[f'alert/{mechanism}/steps'])} steps, "
                     f"from step {int(row[f'alert/{mechanism}/first_step'])})")
    return found


SIGNATURE_TABLES: tuple[tuple[str, str, Callable[[pd.Series], bool]], ...] = (
    ("table4", "Table 4 — gradient amplification: trajectory signatures of flagged IP cells",
     lambda row: row["policy"] == "isolated" and "gradient_amplification" in row["flags"]),
    ("table5", "Table 5 — SP role capture (token-distribution asymmetry): Eval-Opt and Voting",
     lambda row: row["policy"] == "shared" and "sp_role_capture" in row["flags"] and row["workflow"] != "orch_workers"),
    ("table6", "Table 6 — SP role capture (per-episode frequency asymmetry): Orch-Workers",
     lambda row: row["policy"] == "shared" and "sp_role_capture" in row["flags"] and row["workflow"] == "orch_workers"),
)


def signature_tables(cells: pd.DataFrame, signatures: Callable[[str], dict[str, dict[int, float]]]) -> list[Table]:
    """Tables 4-6. `signatures(cell)` gives a cell's val/role/<role>/<metric> series (step -> value)."""
    out = []
    for name, title, chosen in SIGNATURE_TABLES:
        picked = [row for _, row in cells[cells["kind"] == "train"].iterrows() if row["flags"] and chosen(row)]
        metrics = sorted({key.split("/", 3)[3] for row in picked for key in signatures(row["cell"])})
        columns = ["cell", "checkpoint", "step", "role", *metrics]
        rows, notes = [], []
        for row in picked:
            series = signatures(row["cell"])
            steps = sorted({s for values in series.values() for s in values})
            if not steps:
                continue
            peak = row["peak_step"] if not pd.isna(row["peak_step"]) and int(row["peak_step"]) in steps else steps[0]
            checkpoints = {"first": steps[0], "peak": int(peak), "last": steps[-1]}
            roles = list(dict.fromkeys(key.split("/")[2] for key in series))
            notes.append(f"- `{row['cell']}`: {row['flags']}")
            for role in roles:
                for checkpoint, step in checkpoints.items():
                    values = [series.get(val_key(role_key(role, m)), {}).get(step) for m in metrics]
                    rows.append([row["cell"], checkpoint, str(step), role,
                                 *("" if v is None else number(v, 3 if abs(v) < 10 else 1) for v in values)])
        caption = ("Per-role trajectory signatures (validation samples) at the first, peak-accuracy and last "
                   "validation of each flagged cell; blank where the role does not log that signature.")
        if not picked:
            notes = ["No cell of this sweep is flagged for this mechanism (see `flags` in cells.parquet)."]
        out.append(Table(name=name, title=title, caption=caption, columns=columns, headers=columns, rows=rows,
                         left=4, notes=notes))
    return out
