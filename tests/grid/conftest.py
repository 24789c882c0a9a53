"""Fixtures for the grid's tests: a results root per test and `gridrun` run in-process."""

from __future__ import annotations

import shutil
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
RECORDING_LAUNCHER = "tests.grid.recording:RecordingLauncher"


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
    monkeypatch.setitem(base.LAUNCHERS, "record", RECORDING_LAUNCHER)


@pytest.fixture(scope="session")
def planned_smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke sweep as `gridrun plan conf=smoke grid.launcher.name=record` writes it, planned
    once: composing its 11 cells takes half a second and some 60 tests start from it."""
    root = tmp_path_factory.mktemp("planned") / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRIDRUN_RESULTS", str(root))
        patch.setitem(base.LAUNCHERS, "record", RECORDING_LAUNCHER)
        assert main(["plan", "conf=smoke", "grid.launcher.name=record"]) == 0
    return root / "smoke"


@pytest.fixture
def smoke(planned_smoke: Path, results: Path, recording_launcher: None) -> SweepDir:
    """The smoke sweep planned for the recording launcher (a copy of the one plan; nothing in
    it names the results root)."""
    shutil.copytree(planned_smoke, results / "smoke")
    return SweepDir(results, "smoke")
