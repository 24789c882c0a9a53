"""Print a planned sweep as one JSON document: everything two installs of the same gridrun
must plan alike (scripts/check_wheel_install.sh compares a wheel's with the checkout's).

Each cell's id, coordinates, fingerprint, resources, predicted GPU memory, hours and its
`config.yaml` as written, and the sweep's cells, cluster and launcher. Left out, because they
differ between two installs by design: timestamps (`created_at`, `updated_at`, a plan's `at`,
a cell's `planned_at`), provenance (`git`: the checkout's commit, none in a wheel; `versions`:
the wheel's venv may lack the training stack), and the folder gridrun is installed in (the
shipped sweep file's path reads `<gridrun>/...`). The results folder reads `<results>`.

    python scripts/plan_digest.py RESULTS_DIR SWEEP     with the python of the install that planned it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gridrun

TIMES_AND_PROVENANCE = ("created_at", "updated_at", "at", "planned_at", "git", "versions")


def _strip(record: Any) -> Any:
    if isinstance(record, dict):
        return {key: _strip(value) for key, value in record.items() if key not in TIMES_AND_PROVENANCE}
    if isinstance(record, list):
        return [_strip(value) for value in record]
    return record


def digest(results: Path, sweep: str) -> str:
    root = results / sweep
    cells = {cell.name: {"cell.json": _strip(json.loads((cell / "cell.json").read_text())),
                         "config.yaml": (cell / "config.yaml").read_text()}
             for cell in sorted((root / "cells").iterdir())}
    planned = _strip(json.loads((root / "sweep.json").read_text()))
    # A shipped sweep is read from the package, wherever it is installed.
    planned["source"] = planned["source"].replace(str(Path(gridrun.__file__).resolve().parent), "<gridrun>")
    text = json.dumps({"sweep.json": planned, "cells": cells}, indent=1, sort_keys=True)
    return text.replace(str(results.resolve()), "<results>")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    print(digest(Path(sys.argv[1]), sys.argv[2]))
