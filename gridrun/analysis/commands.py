"""`gridrun collect`: the analysis of one sweep, or of every sweep under the results root.

Registered into gridrun/cli.py's parser beside the grid's commands (gridrun/grid/commands.py,
whose error handling and options it shares); pandas and the tables load only when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gridrun.grid.commands import conf_only, guarded, results_option, warn_skipped
from gridrun.grid.console import console as make_console
from gridrun.grid.errors import GridError


def _collect(args: argparse.Namespace) -> int:
    from gridrun.analysis.collect import collect
    from gridrun.grid.sweepdir import SweepDamaged, SweepDir, planned_sweeps, results_root

    results = results_root(args.results_dir)
    conf = conf_only(args.conf, "collect")
    names = [conf] if conf else planned_sweeps(results)
    if not names:
        raise GridError(f"no sweep is planned under {results}: plan one first (`gridrun sweep conf=smoke`)")
    console = make_console()
    skipped: list[str] = []
    for name in names:
        try:
            collect(SweepDir(results, name), console, tolerance_pp=args.base_tolerance,
                    export_to=Path(args.export_peaks) if args.export_peaks else None)
        except SweepDamaged as err:
            if conf:
                raise
            skipped.append(str(err))
    warn_skipped(skipped)
    return 2 if skipped else 0


def add_commands(sub: Any) -> None:
    """Add `gridrun collect` to gridrun's subparsers."""
    collect = sub.add_parser(
        "collect", help="the analysis: cells/metrics.parquet, Tables 1-6 (md, csv, tex), Figures 2-6, report.html")
    collect.add_argument("conf", nargs="*", metavar="conf=SWEEP", help="one sweep (default: every sweep)")
    collect.add_argument(
        "--base-tolerance", type=float, default=1.0, metavar="PP",
        help="flag a cell whose step-0 accuracy differs from its base control by more (points; default 1.0)",
    )
    collect.add_argument(
        "--export-peaks", metavar="DIR",
        help="also export every done cell's peak (`gridrun export`) into DIR/<sweep>/<cell>-step_XXXXXX",
    )
    results_option(collect)
    collect.set_defaults(func=guarded(_collect))
