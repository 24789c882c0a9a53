"""What every figure of `gridrun collect` draws with: the palette, matplotlib
figures on the Agg canvas, seeds as thin lines, legends, PNG bytes, and the rendering of a
sweep's figures (in forked workers for large sweeps) into files.

The figures themselves: gridrun/analysis/curves.py (learning curves, gradient shares),
paper_figures.py (Figures 2-6) and warning.py (the early-warning figure). matplotlib is
imported only inside the functions that draw, so collecting a sweep that has not run yet
stays fast. Left out: what any figure shows.
"""

from __future__ import annotations

import io
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gridrun.seam.rundir import atomic_write_bytes

# Okabe-Ito, a palette that colour-blind readers tell apart; fixed per series, so IP, SP and
# SA-RL look the same in every panel and figure.
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
SERIES_COLORS = {"IP": OKABE_ITO[0], "SP": OKABE_ITO[1], "SA-RL": OKABE_ITO[2]}

Series = dict[int, float]  # step -> value
THIN_POINTS = 150  # points per seed's thin line


def thin_runs(ax: Any, runs: list[Series], color: str, **style: Any) -> None:
    """Seeds as thin lines in one artist (a LineCollection: a thousand Line2D objects take
    matplotlib seconds), each thinned to at most THIN_POINTS points (a panel is a few hundred
    pixels wide; the mean keeps every step); a run of one point as a dot."""
    from matplotlib.collections import LineCollection

    curves = []
    for run in (run for run in runs if run):
        steps = sorted(run)
        if len(steps) > THIN_POINTS:
            steps = steps[:: -(-len(steps) // THIN_POINTS)] + steps[-1:]
        curves.append([(s, run[s]) for s in steps])
    if any(len(c) > 1 for c in curves):
        ax.add_collection(LineCollection([c for c in curves if len(c) > 1], colors=color, **style))
        ax.autoscale_view()
    dots = [c[0] for c in curves if len(c) == 1]
    if dots:
        ax.scatter(*zip(*dots, strict=True), color=color, s=8, alpha=style.get("alpha"))


def legend(ax: Any, **options: Any) -> None:
    """A legend where it hides least, unless the axes hold so many points that matplotlib's
    search for that place ('best' tests every point) would take seconds."""
    points = sum(len(line.get_xdata()) for line in ax.get_lines())
    ax.legend(fontsize="small", loc="best" if points <= 2000 else "upper left", **options)


def new_figure(width: float, height: float) -> Any:
    """A matplotlib Figure on the Agg canvas (inches), laid out to fit its labels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The Figure API, not pyplot: no global backend or figure registry.
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def to_png(figure: Any) -> bytes:
    engine = figure.get_layout_engine()
    if engine is not None:
        # Lay out once, then freeze: savefig would otherwise draw every artist twice (once,
        # not rendered, to lay out), which on a 1000-cell sweep is a quarter of collect's time.
        engine.execute(figure)
        figure.set_layout_engine(None)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def save_png(path: Path, png: bytes) -> None:
    atomic_write_bytes(path, png)  # a reader never sees half a PNG, a full disk leaves no temp file



# --- rendering, in worker processes for large sweeps ---------------------------------------------
Job = tuple[Path, Callable[[], "bytes | None"]]  # where, and how to draw it (None: nothing to draw)
_PENDING: list[Job] = []  # the jobs forked workers inherit (closures over large frames do not pickle cheaply)


def _draw_pending(index: int) -> bytes | None:
    return _PENDING[index][1]()


def render(jobs: list[Job], workers: int = 1) -> list[Path]:
    """Draw every job, in `workers` forked processes when more than one, and write the PNGs;
    a job that draws nothing removes its file (an earlier collect's figure of cells since
    replaced would mislead). Returns the paths written."""
    global _PENDING
    if workers > 1 and len(jobs) > 1 and "fork" in multiprocessing.get_all_start_methods():
        import matplotlib.figure  # noqa: F401  (loaded once here, inherited by the workers)

        _PENDING = jobs
        try:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                pngs = list(pool.map(_draw_pending, range(len(jobs))))
        finally:
            _PENDING = []
    else:
        pngs = [draw() for _, draw in jobs]
    written = []
    for (path, _), png in zip(jobs, pngs, strict=True):
        if png is None:
            path.unlink(missing_ok=True)
        else:
            save_png(path, png)
            written.append(path)
    return written
