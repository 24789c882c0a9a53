"""One cell's process as every launcher starts it: environment, appended logs, their tail."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gridrun.grid.launchers.process import cell_env, last_own_line, log_tail, start_cell


def test_cell_env_sizes_every_thread_pool_and_names_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    env = cell_env("12_3", 4, {"RANK": "1"})
    assert {k: env[k] for k in ("PYTHONUNBUFFERED", "GRIDRUN_JOB_ID", "RANK")} == {
        "PYTHONUNBUFFERED": "1", "GRIDRUN_JOB_ID": "12_3", "RANK": "1"}
    # torch's pool (through the trainer's GRIDRUN_THREADS), OpenMP's and MKL's: the cell's 4.
    assert [env[k] for k in ("GRIDRUN_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")] == ["4", "4", "4"]
    # No CPU count planned: the pools stay as this process has them.
    assert cell_env("12_3", None)["OMP_NUM_THREADS"] == "5"


def test_start_cell_appends_a_header_then_the_cells_output(tmp_path: Path) -> None:
    # A folder that is no run dir: `gridrun run` exits 2 with its one-line error, which must
    # land in stderr.log after the header, the earlier attempt's lines kept above it.
    out, err = tmp_path / "logs" / "stdout.log", tmp_path / "logs" / "stderr.log"
    out.parent.mkdir()
    out.write_text("attempt 1\n")
    err.write_text("attempt 1\n")
    child = start_cell(tmp_path / "nowhere", (out, err), "attempt 2", cell_env("7@here", 1))
    assert child.wait(timeout=120) == 2
    header = f"--- gridrun attempt 2 on {socket.gethostname()} at "
    for log in (out, err):
        first, second = log.read_text().splitlines()[:2]
        assert first == "attempt 1" and second.startswith(header) and second.endswith(" ---")
    assert "gridrun: error: " in log_tail(err, 1) and "nowhere" in log_tail(err, 1)


def test_log_tail_reads_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    assert log_tail(log, 3) == "line 17\nline 18\nline 19"
    assert log_tail(log).splitlines()[0] == "line 12"  # 8 lines by default
    assert log_tail(tmp_path / "missing.log") == ""


def test_a_cells_status_note_is_gridruns_own_line_never_a_third_party_bar(tmp_path: Path) -> None:
    # What a cell's stderr holds while it loads its model: gridrun's line, then transformers'
    # progress bar (carriage returns between its redraws) and a library warning after it.
    log = tmp_path / "stderr.log"
    log.write_text(
        "2026-11-25 03:40:01,000 INFO gridrun: building the toy world (first use)\n"
        "Loading weights:   0%|          | 0/46 [00:00<?, ?it/s]\rLoading weights: 100%|##########| 46/46\n"
        "UserWarning: something a library says\n"
    )
    assert last_own_line(log) == "building the toy world (first use)"
    log.write_text("Loading weights: 100%|##########| 46/46\n")
    assert last_own_line(log) == ""
    assert last_own_line(tmp_path / "absent.log") == ""
