"""The run directory: the seam between the grid and the trainer.

`RunDir` is the one owner of every path inside a cell's directory; no other code formats
those paths. Both halves import it, so it imports only the standard library.

    cells/<cell_id>/
      config.yaml  cell.json  state.json  metrics.jsonl
      checkpoints/step_XXXXXX/  (COMPLETE marker last)
      samples/step_XXXXXX.jsonl  logs/  wandb/
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

STATES = ("planned", "queued", "running", "done", "failed", "preempted", "cancelled", "blocked")
# `blocked` is never written: the grid reads a queued cell as blocked while a cell it needs
# (a transfer cell's sa_rl) has failed, been cancelled or preempted (gridrun/grid/dispatch.py).
ACTIVE_STATES = ("queued", "running")
COMPLETE_MARKER = "COMPLETE"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates 0600 files; run dirs are read by colleagues on shared clusters.
_FILE_MODE = 0o666 & ~_umask()


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory, fsync, rename: readers see old or new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


class NotARunDir(ValueError):
    """Raised for a directory that holds no planned cell."""


class RunDir:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    # --- paths -------------------------------------------------------------------------
    @property
    def config_yaml(self) -> Path:
        return self.root / "config.yaml"

    @property
    def cell_json(self) -> Path:
        return self.root / "cell.json"

    @property
    def state_json(self) -> Path:
        return self.root / "state.json"

    @property
    def metrics_jsonl(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step:06d}"

    @property
    def samples_dir(self) -> Path:
        return self.root / "samples"

    def samples(self, step: int) -> Path:
        return self.samples_dir / f"step_{step:06d}.jsonl"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def stdout_log(self) -> Path:
        return self.logs_dir / "stdout.log"

    @property
    def stderr_log(self) -> Path:
        return self.logs_dir / "stderr.log"

    def rank_logs(self, rank: int) -> tuple[Path, Path]:
        """stdout and stderr of one rank of a multi-task job (rank 0 writes the two above)."""
        if rank == 0:
            return self.stdout_log, self.stderr_log
        return self.logs_dir / f"rank{rank}.stdout.log", self.logs_dir / f"rank{rank}.stderr.log"

    @property
    def wandb_dir(self) -> Path:
        return self.root / "wandb"

    # --- validation --------------------------------------------------------------------
    def require(self) -> RunDir:
        """Fail with the fix when this is not a planned cell's directory."""
        if not self.root.is_dir():
            raise NotARunDir(f"{self.root} does not exist: plan it with `gridrun plan conf=<sweep>`")
        if not self.config_yaml.is_file():
            raise NotARunDir(
                f"{self.root} is not a run dir (no config.yaml): pass a cell directory "
                "such as results/<sweep>/cells/<cell_id>"
            )
        return self

    # --- state -------------------------------------------------------------------------
    def read_state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_json.read_text())
        except FileNotFoundError:
            return {"state": "planned", "step": 0, "attempt": 0}
        except json.JSONDecodeError:
            # Atomic writes make this unreachable unless someone edited the file by hand.
            return {"state": "failed", "step": 0, "attempt": 0, "error": "state.json is corrupt"}

    def update_state(self, **fields: Any) -> dict[str, Any]:
        """Read-modify-write state.json atomically; keeps fields the caller did not name."""
        state = self.read_state()
        state.update(fields)
        state["updated_at"] = time.time()
        atomic_write_json(self.state_json, state)
        return state

    # --- metrics -----------------------------------------------------------------------
    def append_metrics(self, rows: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        if not lines:
            return
        with open(self.metrics_jsonl, "a") as handle:
            handle.write(lines)
            handle.flush()
            os.fsync(handle.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_jsonl.exists():
            return []
        rows = []
        for line in self.metrics_jsonl.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                # A line torn by a kill mid-write: later rows are rewritten on resume.
                break
        return rows

    def truncate_metrics(self, last_step: int) -> None:
        """Keep rows up to `last_step`: resuming from a checkpoint replays what came after."""
        kept = [row for row in self.read_metrics() if row.get("step", 0) <= last_step]
        atomic_write_text(self.metrics_jsonl, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    # --- checkpoints -------------------------------------------------------------------
    def complete_checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of checkpoints with their COMPLETE marker, oldest first."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for path in self.checkpoints_dir.iterdir():
            if path.name.startswith("step_") and (path / COMPLETE_MARKER).exists():
                try:
                    found.append((int(path.name[5:]), path))
                except ValueError:
                    continue
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        found = self.complete_checkpoints()
        return found[-1] if found else None
