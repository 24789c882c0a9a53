"""The paper's analysis of a sweep, written by `gridrun collect`. Reads a results folder and
never launches; imports gridrun.grid for the sweep's folder and status rows, never the reverse.

    commands.py       the `gridrun collect` subcommand
    collect.py        reads the run dirs once and calls the modules below; cells/metrics.parquet

    stats.py          seed statistics: means, counts, 95% t half-widths, a missing value's state
    summary.py        a cell's metrics as columns; per-cell statistics (cells.parquet's columns)
    tables.py         Tables 1 (peak and final), 2, 3 and 4-6, each as md, csv and tex
    findings.py       the paper's claims measured (holds / does not hold / inconclusive) and the
                      mechanism alerts per cell
    warning.py        the alerts as an early warning: recall on cliff cells, false alarms, lead
                      time, and its figure
    calibration.py    the early warning's thresholds chosen on fit seeds, scored on held-out ones
    curves.py         learning curves and per-role gradient shares per (task, scale) (PNG)
    paper_figures.py  Figures 2-6 (PNG), and one cell's Figure 6 for `gridrun plot`
    plotting.py       what every figure draws with: palette, thin seed lines,
                      legends, PNG bytes, rendering in forked workers
    report.py         report.md and the self-contained report.html

Torch-free like gridrun/grid/; matplotlib is imported only to draw.
"""
