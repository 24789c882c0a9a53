"""Write gridrun/grid/detector_savings.json, the collapse detector's measured stops that the dry
run offers as an option, from a collected collapse study (cells.parquet's detector columns:
gridrun/analysis/warning.py's detector_table replays train.fall_alert on every done cell).

    .venv/bin/python scripts/ship_detector_savings.py results/collapse_study bench/measured/<file>.md [VARIANT]

VARIANT (e.g. natural) keeps that variant's cells only: a study's positive controls collapse
on purpose, and their stops say nothing of what a sweep of the paper's settings saves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's analysis, whatever gridrun the venv holds

from gridrun.seam.cellstate import CellState
from gridrun.seam.runconfig import TRAINED_KINDS


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    sweep, source = Path(sys.argv[1]), sys.argv[2]
    cells = pd.read_parquet(sweep / "cells.parquet")
    if len(sys.argv) == 4:
        cells = cells[cells["variant"] == sys.argv[3]]
        source = f"{source}, its {sys.argv[3]} cells"
    done = cells[cells["kind"].isin(TRAINED_KINDS) & (cells["state"] == CellState.DONE) & cells["peak_drop_pp"].notna()]
    stopped = done[done["detector_step"].notna()]
    savings = {
        "steps_saved": int((stopped["total_steps"] - stopped["detector_step"]).sum()),
        "steps": int(done["total_steps"].sum()),
        "cells": len(done),
        "stopped": len(stopped),
        "peaks_kept": int(stopped["detector_peak_kept"].astype(bool).sum()),
        "source": source,
    }
    out = REPO / "gridrun" / "grid" / "detector_savings.json"
    out.write_text(json.dumps(savings, indent=1) + "\n")
    print(f"{savings}\nwrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
