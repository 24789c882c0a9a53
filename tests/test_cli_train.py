"""The training-side commands a user meets: `gridrun reward` and `gridrun run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gridrun.cellrun import run_cell
from gridrun.seam.rundir import RunDir
from tests.conftest import make_cell
from tests.states import reopen


def gridrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gridrun.cli", *args], capture_output=True, text=True, timeout=120, check=False)


def test_reward_math_prints_json() -> None:
    out = gridrun("reward", "math", "--response", "so \\boxed{84} then \\boxed{\\frac{170}{2}}", "--answer", "85",
                  "--grader", "math_verify")
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
    reopen(cell)
    assert run_cell(cell) == 0
    runs = sorted(p.name for p in (RunDir(cell).wandb_dir / "wandb").glob("offline-run-*"))
    ids = {name.rsplit("-", 1)[1] for name in runs}
    assert len(runs) == 2 and len(ids) == 1, runs


def test_reward_math_scores_with_a_cells_own_grader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "\boxed{2/4}" against 1/2, and a response without a box: the released grader (the
    # schema's default) says 0.0 and 0.0 (unreduced fractions are wrong, no box is 0);
    # a cell under preset=as_written's settings (math-verify, -0.1) says 1.0 and -0.1.
    from gridrun.cli import main

    released = make_cell(tmp_path, "released")
    as_written = make_cell(tmp_path, "as_written", task={"name": "arith", "grader": "math_verify", "format_penalty": -0.1})

    def score(*args: str) -> dict:
        assert main(["reward", "math", *args]) == 0
        return json.loads(capsys.readouterr().out)

    for response, by_cell in (("\\boxed{2/4}", {released: 0.0, as_written: 1.0}), ("no box", {released: 0.0, as_written: -0.1})):
        for cell, reward in by_cell.items():
            assert score("--response", response, "--answer", "\\frac{1}{2}", "--cell", str(cell))["reward"] == reward
    # Without a cell: the schema's defaults, i.e. the released grader; flags set either by hand.
    assert score("--response", "\\boxed{2/4}", "--answer", "\\frac{1}{2}")["reward"] == 0.0
    assert score("--response", "no box", "--answer", "1", "--grader", "math_verify", "--format-penalty", "-0.1") == {
        "reward": -0.1, "parsed": None}
    # --cell with a hand-set reward setting, or a cell of another task, is one line naming the fix.
    assert main(["reward", "math", "--response", "x", "--answer", "1", "--cell", str(released), "--grader", "released"]) == 2
    assert "drop --grader" in capsys.readouterr().err
    code_cell = make_cell(tmp_path, "code", task={"name": "code", "data_path": str(tmp_path)})
    assert main(["reward", "math", "--response", "x", "--answer", "1", "--cell", str(code_cell)]) == 2
    assert "gridrun reward code --cell" in capsys.readouterr().err


@pytest.mark.parametrize("final", ["done", "stopped"])
def test_run_leaves_a_final_cell_as_it_is(tmp_path: Path, final: str) -> None:
    # done and stopped are final for `gridrun run` as for `resubmit`: a stopped cell (its alert's
    # action) is never trained on by hand to done, keeping the stop's alert as if it had acted.
    from tests.states import put_state

    cell = make_cell(tmp_path, workflow={"name": "voting"})
    put_state(RunDir(cell), state=final, step=2, total_steps=2, attempt=1)
    before = (cell / "state.json").read_bytes()
    done = gridrun("run", str(cell))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"is {final}, which is final" in done.stderr and "--replace" in done.stderr
    assert (cell / "state.json").read_bytes() == before and not (cell / "metrics.jsonl").exists()
