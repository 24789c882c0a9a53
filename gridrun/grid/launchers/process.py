"""One cell's process, as every launcher starts it (the local pool on this machine, each
task of a SLURM job on its node).

- The command: `python -P -u -m gridrun.cli run <run_dir>` with this venv's python, so the
  installed gridrun runs whatever the current directory holds (`cell_command`).
- Its environment: this process's, plus unbuffered output, the job id (named in the run's
  lock file, so a second run says who holds it) and thread pools sized to the cell's CPUs
  (torch's through the trainer's GRIDRUN_THREADS, OpenMP's, MKL's).
- Its GPU (`bind_gpu`): exactly one device in CUDA_VISIBLE_DEVICES, which the trainer and
  its rollout engine share. One visible GPU: the scheduler bound the task
  (`--gpus-per-task`), kept. One per rank on the node: the job was bound, not the task, and
  the rank takes the one at its local rank. Anything else is refused in one line: two ranks
  on one GPU, or an engine taking device 0 beside another rank's trainer, is never right.
- Its logs: stdout and stderr appended to the given files, each attempt opened by a header
  line naming what started it, the host and the time; `log_tail` reads a log's last lines.

Left out: what the launchers do around it (the local pool's slots and signals, a SLURM
job's requeue bookkeeping) and the node's own setup before Python starts
(gridrun/slurm/setup_node.sh: site modules, the Hugging Face cache).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Keep the current directory off the child's sys.path, so that a `gridrun/` folder where
# `gridrun sweep` was typed (another checkout) is never imported by the cells. -P (3.11+)
# drops only that entry and keeps PYTHONPATH, which a user sets on purpose; 3.10 lacks it
# and gets -I, which also ignores PYTHON* variables and the user's site-packages.
SAFE_PATH_FLAG = "-P" if sys.version_info >= (3, 11) else "-I"


def interpreter(python: str = sys.executable) -> list[str]:
    """The interpreter (this venv's by default) a cell or a job runs with: no current
    directory on sys.path."""
    return [python, SAFE_PATH_FLAG]


def interpreter_line(python: str = sys.executable) -> str:
    """`interpreter` as one shell line, for submitit's `python` (it appends `-u -m ...`)."""
    return shlex.join(interpreter(python))


def cell_command(run_dir: Path) -> list[str]:
    """What every launcher runs for one cell (one rank of it): `gridrun run <run_dir>`,
    unbuffered (-u: -I, on 3.10, ignores PYTHONUNBUFFERED)."""
    return [*interpreter(), "-u", "-m", "gridrun.cli", "run", str(run_dir)]


def cell_env(job_id: str, cpus: int | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a cell: unbuffered, its job id, its thread pools sized
    to `cpus` (left alone when None), then `extra` (a rank's torchrun variables)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", GRIDRUN_JOB_ID=job_id)
    if cpus:
        env.update(GRIDRUN_THREADS=str(cpus), OMP_NUM_THREADS=str(cpus), MKL_NUM_THREADS=str(cpus))
    env.update(extra or {})
    return env


class GpuBindingError(RuntimeError):
    """A rank would not see exactly its own GPU."""


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """The GPUs CUDA_VISIBLE_DEVICES lists (none when unset, empty or SLURM's NoDevFiles)."""
    listed = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return [] if listed == ["NoDevFiles"] else listed


def bind_gpu(env: Mapping[str, str], local_rank: int, local_ranks: int) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of rank `local_rank` of `local_ranks` on its node: exactly its
    own GPU, whatever the scheduler bound. One GPU visible: the task was bound (SLURM's
    --gpus-per-task); one per rank: the job was bound, not the task, and the rank takes its
    own by local rank; none: a CPU cell ({}). Anything else is refused: two ranks on one GPU,
    or an engine taking device 0 next to another rank's trainer, is never right."""
    gpus = visible_gpus(env)
    if len(gpus) <= 1:
        return {"CUDA_VISIBLE_DEVICES": gpus[0]} if gpus else {}
    if len(gpus) == local_ranks:
        return {"CUDA_VISIBLE_DEVICES": gpus[local_rank]}
    raise GpuBindingError(
        f"rank {local_rank} of {local_ranks} on this node sees GPUs {','.join(gpus)}: each rank needs exactly its own "
        "GPU; give the cell one task per GPU (tasks_per_cell: null in the cluster profile)"
    )


def start_cell(
    run_dir: Path, logs: tuple[Path, Path], started_by: str, env: Mapping[str, str], **popen: Any
) -> subprocess.Popen[bytes]:
    """Start `cell_command(run_dir)` with stdout and stderr appended to `logs`, each after a
    `--- gridrun <started_by> on <host> at <time> ---` line; `popen` adds Popen's options
    (a new session, a preexec function)."""
    out_path, err_path = logs
    out_path.parent.mkdir(parents=True, exist_ok=True)
    header = f"--- gridrun {started_by} on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n"
    with open(out_path, "ab") as out, open(err_path, "ab") as err:
        for stream in (out, err):
            stream.write(header.encode())
            stream.flush()
        return subprocess.Popen(
            cell_command(run_dir), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=dict(env), **popen
        )


def log_tail(path: Path, lines: int = 8) -> str:
    """The last `lines` lines of a log (read from its last 8 KiB), "" if it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 8192))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def last_own_line(path: Path) -> str:
    """The message of the newest line gridrun's logger wrote to a log ("" if none in its
    tail): third-party output there (transformers' "Loading weights" bar, warnings) is
    never a cell's status."""
    own = [line.split(" gridrun: ", 1)[1] for line in log_tail(path, 40).splitlines() if " gridrun: " in line]
    return own[-1].strip() if own else ""
