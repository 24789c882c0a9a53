"""Fixtures for the grid's tests: a results root per test and `gridrun` run in-process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gridrun.cli import main
from gridrun.grid.launchers import base
from gridrun.grid.sweepdir import SweepDir


@dataclass
class Result:
    code: int
    out: str
    err: str


Gridrun = Callable[..., Result]


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty results root, also the default ($GRIDRUN_RESULTS) for the test."""
    root = tmp_path / "results"
    monkeypatch.setenv("GRIDRUN_RESULTS", str(root))
    return root


@pytest.fixture
def gridrun(capsys: pytest.CaptureFixture[str]) -> Gridrun:
    """`gridrun ARGS...` in this process; returns its exit code and output."""

    def run(*args: str) -> Result:
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def tree(root: Path) -> list[str]:
    """Every path under root, to check that a refused command wrote nothing."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def recording_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """`grid.launcher.name=record`: tests/grid/recording.py's launcher, which runs nothing."""
    monkeypatch.setitem(base.LAUNCHERS, "record", "tests.grid.recording:RecordingLauncher")


@pytest.fixture
def smoke(gridrun: Gridrun, results: Path, recording_launcher: None) -> SweepDir:
    """The smoke sweep planned for the recording launcher."""
    assert gridrun("plan", "conf=smoke", "grid.launcher.name=record").code == 0
    return SweepDir(results, "smoke")
