"""Every command that takes conf=<sweep> takes the path to a sweep file as well, as `plan` does."""

from __future__ import annotations

import json

import pytest

from gridrun.grid.search import SHIPPED_SWEEPS as SWEEPS_DIR
from tests.grid.conftest import Gridrun

pytestmark = pytest.mark.usefixtures("recording_launcher")


def test_status_and_collect_accept_the_sweep_files_path(gridrun: Gridrun, results) -> None:
    path = str(SWEEPS_DIR / "smoke.yaml")
    assert gridrun("plan", f"conf={path}", "grid.launcher.name=record").code == 0
    status = gridrun("status", f"conf={path}", "--json")
    assert status.code == 0, status.err
    assert {row["sweep"] for row in json.loads(status.out)} == {"smoke"}
    collected = gridrun("collect", f"conf={path}")
    assert collected.code == 0, collected.err
    assert (results / "smoke" / "cells.parquet").exists()
