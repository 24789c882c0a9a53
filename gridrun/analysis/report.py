"""report.md and report.html: a sweep's whole analysis on one page.

Order: the sweep's coordinates (axes, plan, code version), cell states per kind, cost
(wall-clock and GPU-hours from the run dirs' attempts, next to the plan's estimate), the
findings (the paper's claims measured, and the mechanism alerts), the early warning (each
alert's recall and false alarms, and the validation curves with its firings), then Tables 1-3, Figures 2-6 each with a one-line caption saying what to look for, and an
appendix with Tables 4-6 and the learning curves. report.md links the PNGs under figures/;
report.html is the same text rendered (markdown-it, already installed with rich) with every
figure embedded as base64, so it can be mailed or opened anywhere on its own. The renderer
takes no raw HTML: whatever a setting, an id or an error message holds reaches the page as
text, and a value shown as code goes through `code`, whose fence outlasts any backticks in it. What this
leaves out: interactivity and any number not already in a table or cells.parquet.
"""

from __future__ import annotations

import base64
import html
import re
import time
from pathlib import Path

import pandas as pd

from gridrun.analysis.tables import Table
from gridrun.grid.sweepdir import SweepDir, SweepPlan
from gridrun.seam.rundir import atomic_write_text

AXES = ("workflow", "task", "scale", "policy", "seed", "kind", "variant")
# figure file stem (before any -<task>-<scale>) -> (title, what to look for)
CAPTIONS = {
    "fig2_delta": ("Figure 2 — accuracy gain over the base model and over SA-RL",
                   "Points above zero are gains; look for the workflows and scales where IP and SP fall below SA-RL."),
    "fig3_ip_vs_sp": ("Figure 3 — IP vs SP on matched cells",
                      "Markers above the diagonal favour IP; a cloud above it means IP reaches the higher ceiling."),
    "fig4_dynamics": ("Figure 4 — training success rate and validation accuracy",
                      "Look for IP rising higher then bending down late while SP plateaus: the ceiling-vs-floor trade."),
    "fig5_amplitude": ("Figure 5 — training-side instability amplitude",
                       "IP markers above SP on max χ² and grad norm mean isolated adapters move further per run."),
    "fig6": ("Figure 6 — per-role diagnostics of one cell",
             "A role whose χ² or perplexity climbs while the others stay near 1, ahead of a drop in validation accuracy."),
    "val_acc": ("Validation accuracy per workflow", "Each policy against SA-RL and the dashed base control."),
    "grad_share": ("Gradient share per role", "Which role's tokens dominate each update; under SP, the capturing role."),
    "early_warning": ("Validation curves with the alerts' first firings",
                      ("A marker well left of a cross (a cliff of 10+ points) is a warning in time; a marker on a "
                       "curve without a cross is a false alarm.")),
}
MAIN_FIGURES = ("fig2_delta", "fig3_ip_vs_sp", "fig4_dynamics", "fig5_amplitude", "fig6")
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 0.2em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.table-wrap { overflow-x: auto; }
"""


def code(text: str) -> str:
    """`text` as one markdown code span whatever it holds: the fence is one backtick longer
    than its longest run of backticks, padded with a space where the text starts or ends with
    one (CommonMark's rule)."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _stem(path: Path) -> str:
    for stem in sorted(CAPTIONS, key=len, reverse=True):
        if path.stem == stem or path.stem.startswith(stem + "-"):
            return stem
    return path.stem


def _coordinates(plan: SweepPlan, cells: pd.DataFrame) -> list[str]:
    last = (plan.plans or ({},))[-1]
    lines = ["| axis | values |", "|---|---|"]
    for axis in AXES:
        if axis in cells:
            values = [str(v) for v in dict.fromkeys(cells[axis]) if v is not None and not pd.isna(v)]
            lines.append(f"| {axis} | {', '.join(values) or '—'} |")
    git = last.get("git") or {}
    commit = (git.get("commit") or "unknown")[:10] + (" (dirty)" if git.get("dirty") else "")
    planned = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(last["at"])) if last.get("at") else "unknown"
    settings = " ".join(last.get("argv") or []) or "none"
    return [*lines, "", f"Last planned {planned} at commit {code(commit)}; command-line settings: {code(settings)}."]


def _states(cells: pd.DataFrame) -> list[str]:
    counts = cells.groupby(["kind", "state"]).size().unstack(fill_value=0)
    states = list(counts.columns)
    lines = ["| kind | " + " | ".join(states) + " | total |", "|---|" + "---:|" * (len(states) + 1)]
    for kind, row in counts.iterrows():
        lines.append(f"| {kind} | " + " | ".join(str(int(row[s])) for s in states) + f" | {int(row.sum())} |")
    return lines


def _cost(plan: SweepPlan, cells: pd.DataFrame) -> list[str]:
    estimate = {cell.id: cell.est_hours for cell in plan.cells}
    lines = ["| kind | cells | wall-clock hours | GPU-hours | planned estimate (wall h) |", "|---|---:|---:|---:|---:|"]
    for kind, group in cells.groupby("kind", sort=False):
        est = sum(float(estimate.get(c) or 0) for c in group["cell"])
        lines.append(f"| {kind} | {len(group)} | {group['wall_h'].sum():.2f} | {group['gpu_h'].sum():.2f} | {est:.2f} |")
    lines.append(f"| **all** | {len(cells)} | {cells['wall_h'].sum():.2f} | {cells['gpu_h'].sum():.2f} | "
                 f"{sum(float(v or 0) for v in estimate.values()):.2f} |")
    lines += ["", ("Hours are summed over every attempt of every cell (a running cell counts up to now); "
              "GPU-hours multiply them by the cell's GPUs (0 on the CPU toy world).")]
    return lines


def _figure_lines(path: Path, root: Path) -> list[str]:
    title, look_for = CAPTIONS.get(_stem(path), (path.stem, ""))
    where = path.stem[len(_stem(path)) + 1:]
    return [f"### {title}" + (f" ({where})" if where else ""), "", look_for, "",
            f"![{title}]({path.relative_to(root).as_posix()})", ""]


def report_markdown(sweep: SweepDir, plan: SweepPlan, cells: pd.DataFrame, tables: list[Table], figures: list[Path],
                    no_figures: str = "no cell has metrics yet") -> str:
    """The report of the sweep planned as `plan` (its sweep.json as collect read it);
    `no_figures` says why, when there is no figure."""
    by_name: dict[str, list[Table]] = {}
    for t in tables:  # a sweep with variants has one table per variant: <name>-<variant>
        by_name.setdefault(t.name.split("-", 1)[0], []).append(t)
    lines = [f"# gridrun report — sweep {code(sweep.name)}", "",
             (f"Written by `gridrun collect` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
             "Numbers come from finished (`done`) cells only; other cells show as their state."), "",
             "## Sweep", "", *_coordinates(plan, cells), "", "## Cell states", "", *_states(cells), "",
             "## Cost", "", *_cost(plan, cells), ""]
    lines += ["## Findings", ""]
    for name in ("findings", "findings_alerts"):
        lines += [line for t in by_name.get(name, []) for line in (t.markdown(heading="###"), "")]
    lines += ["## Early warning", ""]
    for name in ("early_warning", "early_warning_calibration", "mechanism_shown", "alert_actions", "noise_floor",
                 "early_warning_search"):
        lines += [line for t in by_name.get(name, []) for line in (t.markdown(heading="###"), "")]
    for path in (p for p in figures if _stem(p) == "early_warning"):
        lines += _figure_lines(path, sweep.root)
    lines += ["## Tables", ""]
    for name in ("table1", "table1_final", "table2", "table3"):
        lines += [line for t in by_name.get(name, []) for line in (t.markdown(heading="###"), "")]
    lines += ["## Figures", ""]
    main = [p for stem in MAIN_FIGURES for p in figures if _stem(p) == stem]
    for path in main:
        lines += _figure_lines(path, sweep.root)
    if not main:
        lines += [f"No figure: {no_figures}.", ""]
    lines += ["## Appendix", ""]
    for name in ("table4", "table5", "table6"):
        lines += [line for t in by_name.get(name, []) for line in (t.markdown(heading="###"), "")]
    for path in (p for p in figures if p not in main and _stem(p) != "early_warning"):
        lines += _figure_lines(path, sweep.root)
    return "\n".join(lines)


def report_html(markdown: str, root: Path, title: str) -> str:
    """The markdown rendered, each figure inlined as a data URI."""
    from markdown_it import MarkdownIt

    # html off: raw HTML in the text (a setting's value, an error message) is escaped, never run.
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    body = body.replace("<table>", '<div class="table-wrap"><table>').replace("</table>", "</table></div>")
    for path in sorted((root / "figures").glob("*.png")) if (root / "figures").is_dir() else []:
        source = f'src="{path.relative_to(root).as_posix()}"'
        if source in body:
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            body = body.replace(source, f'src="data:image/png;base64,{data}"')
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n{body}</body></html>\n")


def write_report(sweep: SweepDir, plan: SweepPlan, cells: pd.DataFrame, tables: list[Table], figures: list[Path],
                 no_figures: str = "no cell has metrics yet") -> tuple[Path, Path]:
    markdown = report_markdown(sweep, plan, cells, tables, figures, no_figures)
    atomic_write_text(sweep.report("md"), markdown)
    atomic_write_text(sweep.report("html"), report_html(markdown, sweep.root, f"gridrun report — {sweep.name}"))
    return sweep.report("md"), sweep.report("html")

