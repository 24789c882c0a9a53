"""What is on disk is never lost or escaped: history is never reset silently (a cell that
lost its config.yaml is refused, then moved aside), sweep names stay inside the results
root, and a results root that is a file, read-only or full fails in one line, with every
cell resumable after a full disk.

The disk cases mount a real tmpfs (full) or a read-only bind mount in a private mount
namespace, so they need root and `unshare`; elsewhere they are skipped, saying why."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gridrun.grid.launchers.dispatch import runnable
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.rundir import RunDir
from tests.grid.conftest import Gridrun, tree
from tests.states import put_state

REPO = Path(__file__).resolve().parents[2]


# --- history is never reset silently ------------------------------------------------------------
def test_a_cell_that_lost_its_config_is_refused_then_moved_aside(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    sweep = SweepDir(results, "smoke")
    cell_id = sweep.cell_ids()[0]
    run_dir = sweep.cell(cell_id)
    put_state(run_dir, state="done", step=20, peak_val_acc=0.5)
    run_dir.append_metrics([{"step": 20, "split": "val", "val/acc": 0.5}])
    run_dir.config_yaml.unlink()
    before, state_json = tree(results), run_dir.state_json.read_bytes()
    refused = gridrun("plan", "conf=smoke")
    assert refused.code == 2
    assert f"{cell_id}: config.yaml is missing but the folder holds a run" in refused.err
    assert "re-plan with --replace to move their old runs to replaced/" in refused.err
    assert tree(results) == before and run_dir.state_json.read_bytes() == state_json
    assert run_dir.read_state().to_json()["state"] == "missing"
    # --replace moves the whole folder aside (never deletes it) and plans the cell afresh.
    replaced = gridrun("plan", "conf=smoke", "--replace")
    assert replaced.code == 0 and "0new,10unchanged,1replaced" in "".join(replaced.out.split())
    (aside,) = (results / "smoke" / "replaced").iterdir()
    assert aside.name.startswith(f"{cell_id}.")
    assert json.loads((aside / "state.json").read_text())["peak_val_acc"] == 0.5
    assert RunDir(aside).read_metrics()[0]["step"] == 20
    assert run_dir.read_state().to_json()["state"] == "planned" and run_dir.config_yaml.is_file()


def test_a_running_cell_that_lost_its_config_is_not_moved(gridrun: Gridrun, results: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    sweep = SweepDir(results, "smoke")
    run_dir = sweep.cell(sweep.cell_ids()[0])
    put_state(run_dir, state="running", pid=os.getpid(), node=socket.gethostname(), launcher="local",
                         job_id=f"{os.getpid()}@{socket.gethostname()}", started_at=time.time())
    run_dir.config_yaml.unlink()
    with run_dir.hold():  # the lock, not state.json, says a process still runs in the folder
        refused = gridrun("plan", "conf=smoke", "--replace")
    assert refused.code == 2 and "are queued or running" in refused.err and "cancel them first" in refused.err
    assert not (results / "smoke" / "replaced").exists()


# --- names and results roots ---------------------------------------------------------------------
def test_a_sweep_name_must_be_a_folder_name(gridrun: Gridrun, results: Path, tmp_path: Path) -> None:
    dots = tmp_path / "...yaml"
    shutil.copy(REPO / "gridrun" / "sweeps" / "smoke.yaml", dots)
    result = gridrun("plan", f"conf={dots}")
    assert result.code == 2
    assert result.err == (
        "gridrun: error: sweep name '..' is not a folder name: use letters, digits, '_', '.' and '-' "
        "(not '.' or '..'), e.g. rename the sweep file to sweeps/my_sweep.yaml\n"
    )
    for name in ("..", ".", "a/b", "../smoke", "sp ace"):
        result = gridrun("status", f"conf={name}")
        assert result.code == 2 and f"sweep name {name!r} is not a folder name" in result.err, result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["...yaml"]


def test_a_results_root_that_is_a_file(gridrun: Gridrun, tmp_path: Path) -> None:
    path = tmp_path / "results.txt"
    path.write_text("not a directory")
    for command in (["plan", "conf=smoke"], ["sweep", "conf=smoke"], ["status"], ["collect"], ["resubmit", "conf=smoke"]):
        result = gridrun(*command, "--results-dir", str(path))
        assert result.code == 2
        assert result.err == f"gridrun: error: results root {path} is a file, not a directory: pass --results-dir <a directory>\n"
    assert path.read_text() == "not a directory"


# --- read-only and full disks (a private mount namespace) ---------------------------------------------
def _unshare_works() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs in a private mount namespace"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"unshare -m fails here: {probe.stderr.strip()}"


needs_mounts = pytest.mark.skipif(_unshare_works() is not None, reason=str(_unshare_works()))


def in_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a shell script in a private mount namespace; `gridrun` there is this checkout's."""
    prelude = f"set -u\ngridrun() {{ {sys.executable} -m gridrun.cli \"$@\"; }}\ncd {tmp_path}\n"
    return subprocess.run(["unshare", "-m", "bash", "-c", prelude + textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)), check=False)


def one_line_error(path: Path, expected: str) -> None:
    text = path.read_text()
    assert text.startswith("gridrun: error: ") and text.count("\n") == 1, text
    assert expected in text, text


@needs_mounts
def test_a_read_only_results_root_is_one_line(gridrun: Gridrun, results: Path, tmp_path: Path) -> None:
    assert gridrun("plan", "conf=smoke").code == 0
    sweep = SweepDir(results, "smoke")
    cell = sweep.cell(sweep.cell_ids()[0])
    put_state(cell, state="failed", attempt=1)
    before = tree(results)
    out = tmp_path / "out"
    out.mkdir()
    done = in_namespace(f"""
        mount --bind {results} {results} && mount -o remount,ro,bind {results}
        gridrun plan conf=smoke 2> out/plan; echo $? >> out/codes
        gridrun sweep conf=smoke 2> out/sweep; echo $? >> out/codes
        gridrun resubmit conf=smoke --failed 2> out/resubmit; echo $? >> out/codes
        gridrun collect conf=smoke > /dev/null 2> out/collect; echo $? >> out/codes
        gridrun run {cell.root} 2> out/run; echo $? >> out/codes
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "codes").read_text().split() == ["2"] * 5
    for name in ("plan", "sweep", "resubmit", "collect"):
        one_line_error(out / name, "Read-only file system: pass --results-dir <a writable directory>")
    # `gridrun run` takes no --results-dir (it did suggest it).
    one_line_error(out / "run", "Read-only file system: remount it read-write, or copy the cell's folder to a disk "
                   "you can write and run it there")
    assert tree(results) == before


@needs_mounts
def test_a_full_disk_is_one_line_and_every_cell_stays_resumable(gridrun: Gridrun, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    # 64 KiB: room for a few of the 11 cells' files (4 KiB pages), then ENOSPC mid-plan.
    done = in_namespace(f"""
        mount -t tmpfs -o size=64k tmpfs {disk}
        gridrun plan conf=smoke --results-dir {disk} > /dev/null 2> out/plan_full; echo $? >> out/codes
        find {disk} -name '*.tmp' > out/temp_files
        mount -o remount,size=8m {disk}
        gridrun plan conf=smoke --results-dir {disk} > out/plan_again 2>&1; echo $? >> out/codes
        # Fill the disk to the last page, then dispatch and run: both refused in one line.
        dd if=/dev/zero of={disk}/filler bs=4k > /dev/null 2>&1
        gridrun sweep conf=smoke --results-dir {disk} > /dev/null 2> out/sweep_full; echo $? >> out/codes
        gridrun run {disk}/smoke/cells/sa_rl-toy-arith-s0 2> out/run_full; echo $? >> out/codes
        rm {disk}/filler
        gridrun status conf=smoke --json --results-dir {disk} > out/status; echo $? >> out/codes
        cp -r {disk} {tmp_path}/copy
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "codes").read_text().split() == ["2", "0", "2", "2", "0"], (out / "plan_again").read_text()
    one_line_error(out / "plan_full", "No space left on device: free space there (or pass --results-dir on another "
                   "disk), then re-run the same command: every cell resumes from its newest checkpoint")
    for name in ("sweep_full", "run_full"):
        one_line_error(out / name, "No space left on device")
    assert (out / "temp_files").read_text() == ""  # no half-written file left behind
    assert "11 cells" in (out / "plan_again").read_text()
    # Every cell is listed, planned (none damaged) and dispatchable.
    rows = json.loads((out / "status").read_text())
    assert len(rows) == 11 and {row["state"] for row in rows} == {"planned"}
    sweep = SweepDir(tmp_path / "copy", "smoke")
    assert runnable(sweep, sweep.cell_ids()) == sweep.cell_ids()
    assert all(sweep.cell(cell_id).read_record() is not None for cell_id in sweep.cell_ids())


@needs_mounts
@pytest.mark.slow
def test_a_disk_filling_up_while_cells_train_leaves_them_resumable(toy_world: Path, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    # 2 MiB: the config, state and metrics fit, a toy checkpoint (about 2.2 MB) does not.
    # Then the disk grows (space freed) and the same command finishes both cells.
    sweep = f"gridrun sweep conf=smoke kind=train,sa_rl workflow=voting policy=shared train.total_steps=4 --results-dir {disk}"
    done = in_namespace(f"""
        mount -t tmpfs -o size=2m tmpfs {disk}
        {sweep} > out/first.out 2> out/first.err; echo $? >> out/codes
        # Cells the launcher had started end on their own (they hit the full disk too).
        for i in $(seq 120); do
            gridrun status conf=smoke --json --results-dir {disk} | grep -q '"running"' || break; sleep 1
        done
        gridrun status conf=smoke --json --results-dir {disk} > out/between; echo $? >> out/codes
        mount -o remount,size=64m {disk}
        {sweep} > out/second.out 2> out/second.err; echo $? >> out/codes
        gridrun status conf=smoke --json --results-dir {disk} > out/after; echo $? >> out/codes
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    # The full disk is each cell's failure (its checkpoint write removes its temp folder and
    # names the checkpoint in one line), not the sweep's: the sweep ends, exit 1, naming them.
    assert (out / "codes").read_text().split() == ["1", "0", "0", "0"], (out / "second.err").read_text()
    assert (out / "first.err").read_text() == ""
    # Between the two: no cell is done, and none is shown as running or damaged.
    rows = json.loads((out / "between").read_text())
    between = {row["cell"]: row["state"] for row in rows}
    assert len(between) == 2 and set(between.values()) <= {"failed", "cancelled"}, between
    for row in rows:
        if row["state"] == "failed":
            assert "checkpoints/step_" in row["error"] and "No space left on device: free space there" in row["error"]
            assert "\n" not in row["error"]
    after = json.loads((out / "after").read_text())
    assert {row["cell"]: row["state"] for row in after} == dict.fromkeys(between, "done")
    assert all(row["step"] == 4 and row["attempt"] == 2 for row in after), after


@needs_mounts
def test_collect_on_a_full_disk_is_one_line_naming_the_file_and_leaves_no_temp_file(
    gridrun: Gridrun, results: Path, tmp_path: Path
) -> None:
    # Before: the error named no file, gave the cells' checkpoint advice, and left a 0-byte
    # figures/.fig2_delta.png.<pid>.tmp behind.
    assert gridrun("plan", "conf=smoke").code == 0
    sweep = SweepDir(results, "smoke")
    for cell_id in sweep.cell_ids():
        put_state(sweep.cell(cell_id), state="done", step=20, attempt=1)
        sweep.cell(cell_id).append_metrics([{"step": s, "split": "val", "val/acc": 0.25 + s / 100} for s in (0, 10, 20)])
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    done = in_namespace(f"""
        mount -t tmpfs -o size=4m tmpfs {disk}
        cp -r {results} {disk}/results
        dd if=/dev/zero of={disk}/filler bs=4k > /dev/null 2>&1
        gridrun collect conf=smoke --results-dir {disk}/results > /dev/null 2> out/collect_full; echo $? >> out/codes
        find {disk} -name '*.tmp' > out/temp_files
        rm {disk}/filler
        gridrun collect conf=smoke --results-dir {disk}/results > /dev/null 2> out/collect; echo $? >> out/codes
        stat -c '%a %n' {disk}/results/smoke/cells.parquet {disk}/results/smoke/metrics.parquet \\
            {disk}/results/smoke/table1.md > out/modes
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "codes").read_text().split() == ["2", "0"], (out / "collect").read_text()
    one_line_error(out / "collect_full", f"gridrun: error: cannot write {disk}/results/smoke/")
    one_line_error(out / "collect_full", "No space left on device: free space there (or pass --results-dir on "
                   "another disk), then re-run the same command\n")
    assert (out / "temp_files").read_text() == ""
    # Colleagues on shared storage read the parquet files as they read the tables (0600 before).
    modes = {line.split()[0] for line in (out / "modes").read_text().splitlines()}
    assert len(modes) == 1, (out / "modes").read_text()


@needs_mounts
@pytest.mark.slow
def test_a_checkpoint_on_a_full_disk_is_one_line_leaves_no_temp_and_a_rerun_resumes(
    gridrun: Gridrun, toy_world: Path, results: Path, tmp_path: Path
) -> None:
    # Before: a 20-line traceback (SafetensorError ... No space left on device) stored as the
    # cell's error, and checkpoints/.step_XXXXXX.tmp left behind until a rerun.
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    plan = ("gridrun plan conf=smoke kind=sa_rl train.total_steps=6 train.save_every=2 train.val_every=2 "
            "train.batch_problems=4 train.ppo_mini_batch=4 grpo.n=2 train.val_problems=16 train.val_samples=2")
    cell = disk / "smoke" / "cells" / "sa_rl-toy-arith-s0"
    # The run is frozen once its step-2 checkpoint is complete; the disk is then filled but
    # for 256 KiB (room for metric rows and state.json, not for a 2 MB checkpoint).
    done = in_namespace(f"""
        mount -t tmpfs -o size=64m tmpfs {disk}
        {plan} --results-dir {disk} > /dev/null
        gridrun run {cell} > /dev/null 2> out/run_full & pid=$!
        for i in $(seq 3000); do [ -e {cell}/checkpoints/step_000002/COMPLETE ] && break; sleep 0.05; done
        kill -STOP $pid
        dd if=/dev/zero of={disk}/reserve bs=4k count=64 > /dev/null 2>&1
        dd if=/dev/zero of={disk}/filler bs=4k > /dev/null 2>&1
        rm {disk}/reserve
        kill -CONT $pid; wait $pid; echo $? >> out/codes
        find {disk} -name '*.tmp' > out/temp_files
        cp {cell}/state.json out/state_full.json
        rm {disk}/filler
        gridrun run {cell} > /dev/null 2> out/run_again; echo $? >> out/codes
        cp {cell}/state.json out/state_after.json
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "codes").read_text().split() == ["1", "0"], (out / "run_again").read_text()[-3000:]
    full = json.loads((out / "state_full.json").read_text())
    assert full["state"] == "failed"
    assert full["error"] == (
        f"cannot write {cell}/checkpoints/step_000004: No space left on device: free space there, then run the "
        "cell again: it resumes from its newest complete checkpoint"
    )
    assert f"ERROR gridrun: run failed: {full['error']}\n" in (out / "run_full").read_text()
    assert (out / "temp_files").read_text() == ""
    after = json.loads((out / "state_after.json").read_text())
    assert (after["state"], after["step"]) == ("done", 6)
    assert f"resumed from {cell}/checkpoints/step_000002" in (out / "run_again").read_text()


@needs_mounts
def test_data_prepare_on_a_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path: Path) -> None:
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    fixture = REPO / "tests" / "fixtures" / "deepcoder_sample.jsonl"
    done = in_namespace(f"""
        mount -t tmpfs -o size=64k tmpfs {disk}
        mkdir {disk}/code
        dd if=/dev/zero of={disk}/filler bs=4k > /dev/null 2>&1
        GRIDRUN_LOG=WARNING gridrun data prepare code --from {fixture} --val-size 2 --out {disk}/code > /dev/null 2> out/prepare; echo $? >> out/codes
        find {disk} -name '*.tmp' > out/temp_files
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "codes").read_text().split() == ["2"]
    one_line_error(out / "prepare", f"gridrun: error: cannot write {disk}/code/train.jsonl: No space left on device: "
                   "free space there, or pass --out <a folder on another disk>, then run the command again\n")
    assert (out / "temp_files").read_text() == ""
