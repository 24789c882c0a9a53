"""The training-side commands a user meets: `gridrun reward` and `gridrun run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.cellrun import run_cell
from gridrun.rundir import RunDir
from tests.conftest import make_cell


def gridrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gridrun.cli", *args], capture_output=True, text=True, timeout=120, check=False)


def test_reward_math_prints_json() -> None:
    out = gridrun("reward", "math", "--response", "so \\boxed{84} then \\boxed{\\frac{170}{2}}", "--answer", "85")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"reward": 1.0, "parsed": "\\frac{170}{2}"}


def test_run_on_a_directory_that_is_not_a_cell_names_the_fix(tmp_path: Path) -> None:
    out = gridrun("run", str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "not a run dir" in out.stderr and "results/<sweep>/cells" in out.stderr
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_run_with_a_typo_in_config_names_the_key(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, train={"totl_steps": 2})
    out = gridrun("run", str(cell))
    assert out.returncode == 2 and "did you mean 'train.total_steps'" in out.stderr
    assert sorted(p.name for p in cell.iterdir()) == ["config.yaml"]


@pytest.mark.usefixtures("toy_world")
def test_wandb_offline_keeps_one_run_across_resumes(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, logging={"wandb_mode": "offline"}, train={"total_steps": 1, "val_every": 1})
    assert run_cell(cell) == 0
    (cell / "config.yaml").write_text((cell / "config.yaml").read_text().replace("total_steps: 1", "total_steps: 2"))
    assert run_cell(cell) == 0
    runs = sorted(p.name for p in (RunDir(cell).wandb_dir / "wandb").glob("offline-run-*"))
    ids = {name.rsplit("-", 1)[1] for name in runs}
    assert len(runs) == 2 and len(ids) == 1, runs
