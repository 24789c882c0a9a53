"""SLURM's warning while vLLM's engine core serves in its own process, as on a GPU
(VLLM_ENABLE_V1_MULTIPROCESSING=1, spawned): the engine core, which handles only SIGTERM/SIGINT,
inherits SIGUSR2 blocked and serves on with it pending; the trainer checkpoints after its step
and stops as preempted; the resumed run logs every step once (issue 30, item 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.cellrun import run_cell
from gridrun.seam.rundir import RunDir
from tests.conftest import make_cell, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _descendants(pid: int) -> list[int]:
    found = _children(pid)
    return found + [grandchild for child in found for grandchild in _descendants(child)]


def _engine_cores(pid: int) -> list[int]:
    """`pid`'s descendants started by multiprocessing's spawn: vLLM's engine core (the resource
    tracker, also a child, is started another way)."""
    found = []
    for child in _descendants(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            continue
    return found


def test_usr2_while_the_engine_serves_spares_it_and_requeues_cleanly(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, engine={"name": "vllm"},
                     train={"total_steps": 6, "val_every": 6, "save_every": 6})
    # Spawned, as on a GPU (vLLM spawns once CUDA is initialised): a forked engine core would
    # inherit the trainer's handler, a spawned one the default, fatal action.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
           "GRIDRUN_LOG": "INFO"}
    with open(tmp_path / "stderr.log", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gridrun.cli", "run", str(cell)], env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        # Sent as soon as the engine core exists, so that it is pending there through the
        # engine's start, validation and rollouts. A toy step takes a third of a second: a
        # signal timed to land mid-rollout raced the run's end on a loaded machine.
        engine = wait_until(lambda: _engine_cores(proc.pid), "vLLM's engine core process", 600, poll=0.05)
        # Every process of the step, as SLURM's cgroup-wide signal reaches them (vLLM may
        # move its engine core out of the trainer's process group).
        for pid in [proc.pid, *_descendants(proc.pid)]:
            os.kill(pid, signal.SIGUSR2)
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            for pid in [*_descendants(proc.pid), proc.pid]:
                os.kill(pid, signal.SIGKILL)
            proc.wait()
    log = (tmp_path / "stderr.log").read_text(errors="replace")
    state = RunDir(cell).read_state().to_json()
    assert code == 75 and state["state"] == "preempted", (code, state.get("error"), log[-3000:])
    assert "EngineDeadError" not in log, log[-3000:]
    assert engine, "the engine core ran in its own process"
    stopped = state["step"]
    assert 1 <= stopped < 6, stopped
    assert RunDir(cell).latest_checkpoint() is not None and RunDir(cell).latest_checkpoint()[0] == stopped
    assert run_cell(cell) == 0, RunDir(cell).read_state().to_json().get("error")
    assert [r["step"] for r in RunDir(cell).read_metrics() if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
