"""Where a run's metric rows go: metrics.jsonl in the run dir (the record every analysis
reads) and wandb (offline by default; one run id across resumes, so a resumed cell is one
wandb run). Only rank 0 logs: other ranks' logs are disabled. Leaves out the rows' content
(the trainer builds them) and console logging.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gridrun.seam.runconfig import RunConfig
from gridrun.seam.rundir import RunDir


class MetricsLog:
    """metrics.jsonl (the record) and wandb (offline by default; one run id across resumes)."""

    def __init__(self, run_dir: RunDir, config: RunConfig, enabled: bool = True) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.wandb = None
        if enabled and config.logging.wandb_mode != "disabled":
            import wandb

            run_dir.wandb_dir.mkdir(parents=True, exist_ok=True)
            run_id = hashlib.sha1(f"{config.cell.id}:{run_dir.root.resolve()}".encode()).hexdigest()[:16]
            self.wandb = wandb.init(
                project=config.logging.wandb_project,
                name=config.cell.id,
                id=run_id,
                resume="allow",
                dir=str(run_dir.wandb_dir),
                mode=config.logging.wandb_mode,
                config=config.to_dict(),
            )

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.run_dir.append_metrics([row])
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k not in ("step", "split")}, step=row["step"])

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


