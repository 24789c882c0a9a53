"""`gridrun collect`: cells.parquet and the paper's Table 1 from a sweep's run directories.

cells.parquet: one row per cell (coordinates, kind, state, step-0, peak and final
validation accuracy, the step of the peak, and the step-0 check against the base control).

Table 1: one row per (task, scale, workflow); columns base, SA-RL, IP, SP (peak validation
accuracy, %) and the residuals IP-SA and SP-SA (percentage points), written as table1.md,
table1.csv and table1.tex. With several seeds a value is the mean over the finished seeds,
with `_n` (finished seeds) and `_ci95` (t-interval half-width; for a residual, the two
means' standard errors combined with the smaller sample's t quantile, seeds not paired).
Only finished (`done`) cells give numbers: a value without any is written as the state of
its cells (`missing`, `running`, `failed`, ...), never as a number.

figures/: validation accuracy and per-role gradient share vs step, per (task, scale), drawn
from every cell's metrics so far (gridrun/grid/figures.py).

The base check: a training cell's step-0 validation evaluates the same base model on the
same problems as its `base` control (greedy), so the two should agree; a cell that differs
by more than `tolerance_pp` points is flagged, because then its gains are measured against
the wrong baseline (a different validation set, template or engine).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable
from typing import Any

import pandas as pd

from gridrun.grid.console import track
from gridrun.grid.figures import write_figures
from gridrun.grid.status import sweep_rows
from gridrun.grid.sweepdir import SweepDir
from gridrun.rundir import RunDir, atomic_write_text

COLUMNS = ("task", "scale", "workflow", "base", "sa_rl", "ip", "sp", "ip_minus_sa", "sp_minus_sa")
HEADERS = {"base": "Base", "sa_rl": "SA-RL", "ip": "IP", "sp": "SP", "ip_minus_sa": "IP−SA", "sp_minus_sa": "SP−SA"}
# Two-sided 95% Student t quantiles by degrees of freedom (a df between entries takes the
# lower entry's, slightly wider, value).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}


def t95(df: int) -> float:
    if df < 1:
        return math.nan
    return T95[max(k for k in T95 if k <= df)] if df <= 120 else 1.960


# --- one row per cell --------------------------------------------------------------------------
def validation_summary(run_dir: RunDir) -> dict[str, Any]:
    """Step-0, peak (first step reaching it) and final validation accuracy from metrics.jsonl."""
    rows = [row for row in run_dir.read_metrics() if row.get("split") == "val" and row.get("val/acc") is not None]
    if not rows:
        return {"val_acc_step0": None, "peak_val_acc": None, "peak_step": None, "final_val_acc": None, "final_step": None}
    peak = max(rows, key=lambda row: (row["val/acc"], -row["step"]))
    step0 = next((row["val/acc"] for row in rows if row["step"] == 0), None)
    return {
        "val_acc_step0": step0,
        "peak_val_acc": peak["val/acc"],
        "peak_step": peak["step"],
        "final_val_acc": rows[-1]["val/acc"],
        "final_step": rows[-1]["step"],
    }


def base_id(kind: str, coords: dict[str, Any]) -> str | None:
    """The id of the base control that a cell's step 0 must match."""
    if kind == "base":
        return None
    workflow = "single" if kind == "sa_rl" else coords["workflow"]
    return f"base-{workflow}-{coords['scale']}-{coords['task']}"


def cell_frame(sweep: SweepDir, tolerance_pp: float) -> pd.DataFrame:
    """cells.parquet's rows: every cell of the sweep, finished or not."""
    cells = {cell["id"]: cell for cell in sweep.read()["cells"]}
    records = []
    for row in track(sweep_rows(sweep), f"reading {len(cells)} cells of {sweep.name}"):
        cell = cells[row["cell"]]
        # A damaged file (state.json, cell.json, metrics.jsonl) makes the cell `damaged`: its
        # numbers stay out of Table 1, and `damage` says which file and how to fix it.
        damage = row["error"] if row["state"] == "damaged" else sweep.cell(row["cell"]).metrics_damage()
        records.append(
            {
                "sweep": sweep.name,
                "cell": row["cell"],
                "kind": row["kind"],
                **cell["coords"],
                "state": "damaged" if damage else row["state"],
                "damage": damage,
                "step": row["step"],
                "total_steps": row["total_steps"],
                "attempt": row["attempt"],
                **validation_summary(sweep.cell(row["cell"])),
            }
        )
    frame = pd.DataFrame.from_records(records)
    base_acc = {
        r["cell"]: r["val_acc_step0"] for r in records if r["kind"] == "base" and r["state"] == "done"
    }
    frame["base_cell"] = [base_id(r["kind"], r) for r in records]
    frame["base_val_acc"] = [base_acc.get(b) if b else None for b in frame["base_cell"]]
    diffs = [
        100 * (r["val_acc_step0"] - b) if r["val_acc_step0"] is not None and b is not None else None
        for r, b in zip(records, frame["base_val_acc"])
    ]
    frame["step0_minus_base_pp"] = pd.array(diffs, dtype="Float64")
    frame["base_mismatch"] = [d is not None and abs(d) > tolerance_pp for d in diffs]
    for column in ("seed", "peak_step", "final_step"):
        frame[column] = pd.array(frame[column].tolist(), dtype="Int64")
    for column in ("val_acc_step0", "peak_val_acc", "final_val_acc", "base_val_acc"):
        frame[column] = pd.array(frame[column].tolist(), dtype="Float64")
    return frame


# --- Table 1 -----------------------------------------------------------------------------------
class Entry:
    """One table value: the finished cells' peak accuracies (%) and the others' states."""

    def __init__(self, values: list[float], states: list[str]) -> None:
        self.values, self.states = values, states

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / self.n if self.values else None

    @property
    def se(self) -> float:
        if self.n < 2:
            return math.nan
        mean = sum(self.values) / self.n
        return math.sqrt(sum((v - mean) ** 2 for v in self.values) / (self.n - 1) / self.n)

    @property
    def ci95(self) -> float:
        return t95(self.n - 1) * self.se

    def word(self) -> str:
        """What the table says instead of a number."""
        if not self.states:
            return "missing"
        unfinished = sorted(set(self.states) - {"done"})
        return "/".join(unfinished) if unfinished else "no val"


def _entry(frame: pd.DataFrame) -> Entry:
    done = frame[(frame["state"] == "done") & frame["peak_val_acc"].notna()]
    return Entry([100 * float(v) for v in done["peak_val_acc"]], list(frame["state"]))


def _ordered(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(v for v in values if v is not None))


def table1(cells: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """Table 1 as text cells (numbers formatted, words for missing ones); whether several
    seeds were found (then the _n and _ci95 columns are filled)."""
    keyed = cells[cells["kind"].isin(["train", "base"]) & (cells["workflow"] != "single")]
    rows_keys = _ordered(zip(keyed["task"], keyed["scale"], keyed["workflow"]))
    seeded = cells[cells["kind"].isin(["train", "sa_rl"])]
    several = bool(len(seeded)) and seeded.groupby(["kind", "workflow", "task", "scale", "policy"], dropna=False).size().max() > 1
    out = []
    for task, scale, workflow in rows_keys:
        block = cells[(cells["task"] == task) & (cells["scale"] == scale)]
        train = block[(block["kind"] == "train") & (block["workflow"] == workflow)]
        entries = {
            "base": _entry(block[(block["kind"] == "base") & (block["workflow"] == workflow)]),
            "sa_rl": _entry(block[block["kind"] == "sa_rl"]),
            "ip": _entry(train[train["policy"] == "isolated"]),
            "sp": _entry(train[train["policy"] == "shared"]),
        }
        row: dict[str, Any] = {"task": task, "scale": scale, "workflow": workflow}
        for name, entry in entries.items():
            row[name] = _number(entry.mean) if entry.mean is not None else entry.word()
            row[f"{name}_n"] = entry.n
            row[f"{name}_ci95"] = _number(entry.ci95)
        for policy in ("ip", "sp"):
            a, b = entries[policy], entries["sa_rl"]
            name = f"{policy}_minus_sa"
            if a.mean is None or b.mean is None:
                row[name], row[f"{name}_n"], row[f"{name}_ci95"] = "n/a", 0, ""
                continue
            row[name] = _number(a.mean - b.mean)
            row[f"{name}_n"] = min(a.n, b.n)
            combined = math.sqrt(a.se**2 + b.se**2) * t95(min(a.n, b.n) - 1)
            row[f"{name}_ci95"] = _number(combined)
        out.append(row)
    columns = list(COLUMNS)
    if several:
        columns += [f"{name}_{suffix}" for name in COLUMNS[3:] for suffix in ("n", "ci95")]
    return pd.DataFrame(out, columns=columns), several


def _number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.1f}"


def _cell_text(row: pd.Series, name: str, several: bool, signed: bool = False) -> str:
    value = row[name]
    if not _is_number(value):
        return f"*{value}*"
    text = f"{float(value):+.1f}" if signed else value
    if several and row.get(f"{name}_ci95"):
        text += f" ± {row[f'{name}_ci95']}"
    if several:
        text += f" (n={row[f'{name}_n']})"
    return text


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def to_markdown(table: pd.DataFrame, several: bool, flagged: pd.DataFrame, sweep: str) -> str:
    head = ["Task", "Scale", "Workflow", *HEADERS.values()]
    lines = [
        f"# Table 1 — sweep `{sweep}`",
        "",
        "Peak validation accuracy (%); residuals are multi-agent minus SA-RL in points."
        + (" Mean ± 95% CI over finished seeds (n)." if several else ""),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 6) + "|",
    ]
    for _, row in table.iterrows():
        values = [row["task"], row["scale"], row["workflow"]]
        values += [_cell_text(row, name, several) for name in ("base", "sa_rl", "ip", "sp")]
        values += [_cell_text(row, name, several, signed=True) for name in ("ip_minus_sa", "sp_minus_sa")]
        lines.append("| " + " | ".join(str(v) for v in values) + " |")
    if len(flagged):
        note = (
            "**Step 0 disagrees with the base control.** Both evaluate the same base model on the same "
            "problems; check that they used the same validation split, chat template and engine:"
        )
        lines += ["", note, ""]
        for _, row in flagged.iterrows():
            lines.append(
                f"- `{row['cell']}`: step 0 {100 * row['val_acc_step0']:.1f}% vs `{row['base_cell']}` "
                f"{100 * row['base_val_acc']:.1f}% ({row['step0_minus_base_pp']:+.1f} pp)"
            )
    return "\n".join(lines) + "\n"


def to_latex(table: pd.DataFrame, several: bool) -> str:
    def esc(text: Any) -> str:
        return str(text).replace("_", r"\_").replace("±", r"$\pm$").replace("−", "$-$")

    def cell(row: pd.Series, name: str, signed: bool = False) -> str:
        text = _cell_text(row, name, several, signed)
        return r"\textit{" + esc(text.strip("*")) + "}" if text.startswith("*") else esc(text)

    lines = [
        r"\begin{tabular}{lll" + "r" * 6 + "}",
        r"\toprule",
        " & ".join(["Task", "Scale", "Workflow", *(esc(h) for h in HEADERS.values())]) + r" \\",
        r"\midrule",
    ]
    for _, row in table.iterrows():
        values = [esc(row["task"]), esc(row["scale"]), esc(row["workflow"])]
        values += [cell(row, name) for name in ("base", "sa_rl", "ip", "sp")]
        values += [cell(row, name, signed=True) for name in ("ip_minus_sa", "sp_minus_sa")]
        lines.append(" & ".join(values) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _write_parquet(frame: pd.DataFrame, path: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def collect(sweep: SweepDir, console: Any, tolerance_pp: float = 1.0) -> pd.DataFrame:
    """Write cells.parquet, table1.{md,csv,tex} and figures/; print Table 1 (with any base mismatch)."""
    cells = cell_frame(sweep, tolerance_pp)
    table, several = table1(cells)
    flagged = cells[cells["base_mismatch"]]
    _write_parquet(cells, sweep.cells_parquet)
    atomic_write_text(sweep.table1("csv"), table.to_csv(index=False))
    atomic_write_text(sweep.table1("md"), to_markdown(table, several, flagged, sweep.name))
    atomic_write_text(sweep.table1("tex"), to_latex(table, several))
    figures = write_figures(sweep, cells)

    from rich.markdown import Markdown

    console.print(Markdown(sweep.table1("md").read_text()))
    for damage in cells["damage"].dropna():
        console.print(f"[red]damaged:[/] {damage}", highlight=False)
    counts = cells["state"].value_counts().to_dict()
    console.print(
        f"{len(cells)} cells ({', '.join(f'{n} {s}' for s, n in counts.items())}) -> "
        f"{sweep.cells_parquet}, {sweep.table1('md')}, .csv, .tex, "
        + (f"{sweep.figures_dir}/ ({len(figures)} figures)" if figures else "no figures (no cell has metrics yet)")
    )
    return table
