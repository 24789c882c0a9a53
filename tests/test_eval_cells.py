"""Evaluation cells (kind eval): any trained adapters, per role, scored with the cell's own
validation settings. The check that matters: an eval cell on a cell's exported peak, with
the settings the cell validated under, reproduces the peak's accuracy exactly (on CPU the
same weights, prompts, batches and sampling seed give the same tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gridrun.adapters import AdapterSourceError, resolve
from gridrun.cellrun import run_cell
from gridrun.export import ExportError, export
from gridrun.seam.runconfig import load_config
from gridrun.seam.rundir import RunDir
from gridrun.tasks import make_task
from tests.conftest import make_cell

TRAINED = "voting-ip-toy-arith-s1"
# Validation every step: on the shipped toy world this cell's accuracy is 3/16 at step 0 and
# peaks at 5/16 at step 1 (then falls back), so the peak (step 1) is a checkpoint kept only
# because it is the peak (save_every is 4).
TRAIN = {"total_steps": 4, "val_every": 1, "save_every": 4, "val_problems": 16, "batch_problems": 8, "ppo_mini_batch": 8}
# Enough episodes and LR for the model to move in one step (at TOY_CELL's 4 x 2 it does not).
LEARNS = {"cell": {"seed": 1}, "grpo": {"n": 4}, "optim": {"lr": 1e-3}}


def val_rows(cell: Path) -> dict[int, dict[str, Any]]:
    return {row["step"]: row for row in RunDir(cell).read_metrics() if row["split"] == "val"}


def texts(cell: Path, step: int) -> list[list[str]]:
    lines = RunDir(cell).samples(step).read_text().splitlines()
    return [[turn["text"] for turn in json.loads(line)["turns"]] for line in lines]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cell = make_cell(tmp_path_factory.mktemp("eval"), TRAINED, workflow={"name": "voting"},
                     policy={"name": "isolated"}, train=TRAIN, **LEARNS)
    assert run_cell(cell) == 0
    return cell


def eval_cell(root: Path, name: str, adapters: dict[str, str], **overrides: Any) -> Path:
    return make_cell(root, name, cell={"kind": "eval"}, workflow={"name": "voting"},
                     policy={"name": "transfer", "adapters": adapters}, **overrides)


def test_an_eval_cell_on_the_exported_peak_reproduces_the_peak_exactly(trained: Path) -> None:
    state = RunDir(trained).read_state().to_json()
    assert (state["peak_step"], state["peak_val_acc"]) == (1, 5 / 16)
    assert [s for s, _ in RunDir(trained).complete_checkpoints()] == [1, 4]
    out = export(RunDir(trained), "peak", trained.parent / "peak-export")
    # Same validation settings as the trained cell (val_problems 16, T 0.7, lengths).
    cell = eval_cell(trained.parent, "eval-export", {"generator": str(out), "aggregator": str(out)},
                     train={"val_problems": 16})
    assert run_cell(cell) == 0
    rows = val_rows(cell)
    assert list(rows) == [0] and rows[0]["val/acc"] == 5 / 16
    # Not only the number: every turn of the dumped episodes is the trainer's at step 1.
    assert texts(cell, 0) == texts(trained, 1)
    assert RunDir(cell).latest_checkpoint() is None and RunDir(cell).read_state().to_json()["total_steps"] == 0


def test_a_cell_id_and_step_name_the_same_adapters(trained: Path) -> None:
    # `<cell id>@peak` from a cell of the same sweep (a sibling folder) is the checkpoint itself.
    sibling = trained.parent / "eval-sibling"
    assert resolve(f"{TRAINED}@peak", "aggregator", sibling) == RunDir(trained).checkpoint(1) / "adapters" / "aggregator"
    assert resolve(f"../{TRAINED}@4", "generator", sibling) == RunDir(trained).checkpoint(4) / "adapters" / "generator"
    with pytest.raises(AdapterSourceError, match=r"no checkpoint at step 2 on disk \(steps on disk: 1, 4\)"):
        resolve(f"{TRAINED}@2", "generator", sibling)
    cell = eval_cell(trained.parent, "eval-by-id", {"generator": f"{TRAINED}@peak", "aggregator": f"{TRAINED}@peak"},
                     train={"val_problems": 16})
    assert run_cell(cell) == 0
    assert val_rows(cell)[0]["val/acc"] == 5 / 16


def test_an_eval_cell_has_its_own_validation_settings(trained: Path) -> None:
    # The generator's peak adapter alone (the aggregator on the base model), greedy, on 8
    # training problems: a different evaluation of the same adapter, as asked.
    cell = eval_cell(trained.parent, "eval-greedy-train", {"generator": f"{TRAINED}@peak"},
                     sampling={"val_temperature": 0.0}, train={"val_problems": 8, "val_split": "train"})
    assert run_cell(cell) == 0
    episodes = [json.loads(line) for line in RunDir(cell).samples(0).read_text().splitlines()]

    task = make_task(load_config(cell / "config.yaml").task)
    train_questions = [p.question for p in task.train_problems()[:8]]
    assert [e["question"] for e in episodes] == train_questions
    # Greedy: the three voters' answers to one problem are the same text.
    for episode in episodes:
        voters = [t["text"] for t in episode["turns"] if t["role"] == "generator"]
        assert len(voters) == 3 and len(set(voters)) == 1


def test_an_eval_cell_whose_source_is_unfinished_fails_in_one_line(trained: Path) -> None:
    cell = eval_cell(trained.parent, "eval-missing", {"generator": "no-such-cell@peak"})
    assert run_cell(cell) == 1
    error = RunDir(cell).read_state().to_json()["error"]
    assert "\n" not in error and "is neither a run dir, an export nor a peft adapter folder" in error


def test_a_step_is_for_runs_and_an_at_sign_inside_a_path_is_the_paths(trained: Path) -> None:
    out = trained.parent / "by-at@home"
    export(RunDir(trained), "4", out)
    assert resolve(str(out), "generator") == out / "generator"
    with pytest.raises(AdapterSourceError, match=r"@peak picks a step of a run, but .* holds one adapter set: drop @peak"):
        resolve(f"{out}@peak", "generator")


def test_an_eval_cell_has_nothing_to_export(trained: Path) -> None:
    cell = eval_cell(trained.parent, "eval-export-refused", {"all_roles": f"{TRAINED}@peak"})
    with pytest.raises(ExportError, match="is of kind eval: it trains no adapter, so there is nothing to export"):
        export(RunDir(cell))
