"""A cell's run on a shared machine: one process per cell (the run lock, released by the OS
when its holder dies), the installed gridrun whatever the current directory holds (local
and SLURM), and the local launcher's default parallelism."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gridrun.grid.launchers.local import LocalLauncher, _Pool
from gridrun.grid.launchers.process import SAFE_PATH_FLAG, cell_command
from gridrun.grid.launchers.slurm import sbatch_script
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.cellstate import StateRecord
from gridrun.seam.rundir import RunDir, RunLocked
from tests.conftest import make_cell
from tests.grid.conftest import Gridrun

REPO = Path(__file__).resolve().parents[2]


# --- one process per cell ------------------------------------------------------------------
def test_a_second_run_of_a_cell_is_refused_naming_the_holder(gridrun: Gridrun, tmp_path: Path) -> None:
    cell = RunDir(make_cell(tmp_path))
    with cell.hold(job_id="4242_1"):
        result = gridrun("run", str(cell.root))
    assert result.code == 2
    assert result.err == (
        f"gridrun: error: {cell.root} is already being run by process {os.getpid()} on {socket.gethostname()} "
        f"(job 4242_1): wait for it to end, or stop it (`gridrun cancel conf=<sweep> --cells <id>`) before "
        "running the cell again\n"
    )
    # The refused run wrote nothing: no state.json (the holder's to write).
    assert not cell.state_json.exists()


def test_the_os_releases_the_lock_when_its_holder_is_killed(tmp_path: Path) -> None:
    cell = RunDir(make_cell(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from gridrun.seam.rundir import RunDir
            with RunDir({str(cell.root)!r}).hold(job_id="7"):
                print("held", flush=True)
                time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunLocked, match=f"process {holder.pid} on .* \\(job 7\\)"), cell.hold():
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # kill -9 leaves the lock file behind, but not the lock.
    assert cell.run_lock.exists()
    with cell.hold(job_id="8"):
        assert json.loads(cell.run_lock.read_text())["job_id"] == "8"


def test_a_running_cell_holds_its_lock_until_it_ends(toy_world: Path, tmp_path: Path) -> None:
    cell = RunDir(make_cell(tmp_path, train={"total_steps": 200, "save_every": 100, "val_every": 100}))
    first = subprocess.Popen(cell_command(cell.root), cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, GRIDRUN_JOB_ID="first"))
    try:
        from tests.conftest import wait_until

        wait_until(lambda: cell.read_state().to_json().get("state") == "running", "the first run to start", 300)
        second = subprocess.run(cell_command(cell.root), cwd=tmp_path, capture_output=True, text=True, timeout=300,
                                check=False)
        assert second.returncode == 2, second.stderr
        assert f"already being run by process {first.pid} on {socket.gethostname()} (job first)" in second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert cell.read_state().to_json()["pid"] == first.pid  # the refused run recorded nothing
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(120)
    assert cell.read_state().to_json()["state"] == "cancelled"


# --- the installed gridrun -------------------------------------------------------------------
@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """A directory holding another `gridrun` package that leaves a mark when imported."""
    checkout = tmp_path / "checkout"
    (checkout / "gridrun").mkdir(parents=True)
    mark = checkout / "DECOY_IMPORTED"
    (checkout / "gridrun" / "__init__.py").write_text(f"open({str(mark)!r}, 'w').write('yes')\n")
    (checkout / "gridrun" / "cli.py").write_text("raise SystemExit(97)\n")
    return checkout


def test_cells_import_the_installed_gridrun_not_the_cwds(decoy: Path, gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    sweep = SweepDir(results, "smoke")
    run_dir = sweep.cell(sweep.cell_ids()[0])
    # Without config.yaml, `gridrun run` (the installed one) exits at once with its one line.
    run_dir.config_yaml.unlink()
    # What the old command did: `python -m` puts the cwd first on sys.path, so the decoy runs.
    old = subprocess.run([sys.executable, "-m", "gridrun.cli", "run", str(run_dir.root)], cwd=decoy,
                         capture_output=True, text=True, timeout=60, check=False)
    assert old.returncode == 97 and (decoy / "DECOY_IMPORTED").exists()
    (decoy / "DECOY_IMPORTED").unlink()
    # The local launcher's spawn, from the decoy's directory, runs the installed gridrun.
    launcher = LocalLauncher({"name": "local"})
    cwd = Path.cwd()
    os.chdir(decoy)
    try:
        proc = _Pool(launcher, sweep, [], 1)._spawn(run_dir, StateRecord.from_json({"state": "queued", "attempt": 1}))
        assert proc.wait(60) == 2
    finally:
        os.chdir(cwd)
    assert not (decoy / "DECOY_IMPORTED").exists()
    assert "is not a run dir (no config.yaml)" in run_dir.stderr_log.read_text()


def test_slurm_jobs_start_python_without_the_cwd(tmp_path: Path) -> None:
    # submitit's job command (the same line goes to SlurmExecutor's `python`).
    script = sbatch_script({"job_name": "x", "time": 10}, tmp_path, python="/venv/bin/python")
    assert f"/venv/bin/python {SAFE_PATH_FLAG} -u -m submitit.core._submit {tmp_path}" in script
    assert cell_command(tmp_path)[:3] == [sys.executable, SAFE_PATH_FLAG, "-u"]


# --- the local launcher's parallelism ---------------------------------------------------------------
def test_local_parallelism_fits_the_cores(monkeypatch: pytest.MonkeyPatch, gridrun: Gridrun, results: Path) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    launcher = LocalLauncher({"name": "local", "max_parallel": None})
    # 8 cores: 8 one-thread cells; cells of 3 and 2 threads: 8 // 3 = 2; one 16-thread cell: 1.
    assert launcher.parallelism([1, 1]) == 8
    assert launcher.parallelism([3, 2]) == 2
    assert launcher.parallelism([16]) == 1
    assert launcher.parallelism([None]) == 8  # no record: one thread, as the trainer defaults
    assert LocalLauncher({"name": "local", "max_parallel": 3}).parallelism([1]) == 3
    # The conf's default is to fit the machine; --max-parallel sets it.
    assert gridrun("plan", "conf=smoke").code == 0
    assert SweepDir(results, "smoke").read().launcher["max_parallel"] is None


