"""A sweep's results as pandas DataFrames, for notebooks and scripts:

    >>> from gridrun import results
    >>> r = results.load("results/full_matrix")
    >>> r.cells        # one row per cell: coordinates, state, cost, per-cell statistics
    >>> r.metrics      # every logged metric in long form: cell, split, step, metric, value
    >>> r.tables["table2"]                     # any table collect wrote, as its csv reads
    >>> r.curve("voting-ip-1.7b-math-s0", "val/acc")   # one metric of one cell by step

`load` reads what `gridrun collect` wrote (cells.parquet, metrics.parquet, table*.csv);
`load(..., fresh=True)` reads the run dirs instead and writes nothing, for a sweep still
running or never collected. Column meanings: gridrun/analysis/summary.py and the
docs/analysis.md. Never imports torch (a test checks), so it runs on any laptop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

__all__ = ["Results", "load"]


@dataclass
class Results:
    """A sweep's cells, metrics and tables."""

    sweep: str
    cells: pd.DataFrame
    metrics: pd.DataFrame
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    def curve(self, cell: str, metric: str, split: str | None = None) -> pd.Series:
        """One metric of one cell, indexed by step (`split` picks train or val when both log it)."""
        rows = self.metrics[(self.metrics["cell"] == cell) & (self.metrics["metric"] == metric)]
        if split is not None:
            rows = rows[rows["split"] == split]
        if not len(rows):
            known = sorted(set(self.metrics.loc[self.metrics["cell"] == cell, "metric"]))
            raise KeyError(
                f"no metric '{metric}' for cell '{cell}'"
                + (f" (it logs {len(known)} metrics, e.g. {', '.join(known[:5])})" if known else " (no such cell or no metrics)")
            )
        return rows.set_index("step")["value"].rename(metric)


def load(sweep_dir: str | Path, fresh: bool = False) -> Results:
    """The sweep in `sweep_dir` (results/<sweep>): from collect's files, or with `fresh`
    from its run dirs."""
    from gridrun.grid.errors import GridError
    from gridrun.grid.sweepdir import SweepDir

    root = Path(sweep_dir)
    sweep = SweepDir(root.parent, root.name)
    if not sweep.exists():
        raise GridError(f"{root} is not a sweep's directory (no sweep.json): pass results/<sweep>")
    if fresh:
        from gridrun.analysis.collect import metrics_frame, read_sweep

        data = read_sweep(sweep)
        return Results(sweep.name, data.cells, metrics_frame(data.columns))
    if not sweep.cells_parquet.is_file() or not sweep.metrics_parquet.is_file():
        raise GridError(
            f"{root} has not been collected yet: run `gridrun collect conf={sweep.name} --results-dir {root.parent}` "
            "or load(..., fresh=True)"
        )
    tables = {path.stem: pd.read_csv(path, dtype=str, keep_default_na=False) for path in sorted(root.glob("table*.csv"))}
    return Results(sweep.name, pd.read_parquet(sweep.cells_parquet), pd.read_parquet(sweep.metrics_parquet), tables)
