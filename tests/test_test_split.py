"""The test split: held out from train and val, measured once at the peak chosen on val."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridrun.cellrun import run_cell
from gridrun.seam.accuracy import first_peak, val_accuracy
from gridrun.seam.rundir import RunDir
from gridrun.tasks.arith import ArithParams, ArithTask
from gridrun.tasks.data import DataError, hold_out_test
from gridrun.tasks.math import MathTask
from tests.conftest import make_cell, metric_rows
from tests.states import reopen


def test_the_arith_test_split_is_disjoint_from_train_val_and_the_warm_start() -> None:
    from gridrun.tasks.arith import make_problems

    task = ArithTask()
    test = task.test_problems()
    assert len(test) == len(task.val_problems()) == ArithParams().n_val
    texts = {p.question for p in test}
    assert len(texts) == len(test) and all(p.id.startswith("arith-test-") for p in test)
    assert not texts & {p.question for p in task.train_problems() + task.val_problems()}
    warm_start, _ = make_problems(seed=0, n_train=5000, n_val=400)  # gridrun/toy/build.py's transcripts
    assert not texts & {p.question for p in warm_start}
    assert [p.question for p in ArithTask().test_problems()] == [p.question for p in test]  # fixed by the seed


def test_arith_without_room_for_a_test_split_has_none_and_says_why() -> None:
    task = ArithTask(n_train=7800, n_val=200)
    assert task.test_problems() == [] and "lower task.n_train" in task.test_missing


def test_the_test_slice_comes_from_training_and_refuses_to_take_all_of_it() -> None:
    train = [{"id": f"p{i}"} for i in range(5)]
    rest, test = hold_out_test(train, 2)
    assert [p["id"] for p in test] == ["p0", "p1"] and [p["id"] for p in rest] == ["p2", "p3", "p4"]
    with pytest.raises(DataError, match="lower --test-size"):
        hold_out_test(train, 5)


def test_prepared_math_holds_a_stable_test_slice_recorded_in_meta(math_data: Path, tmp_path: Path) -> None:
    from gridrun.tasks.data import prepare

    meta = json.loads((math_data / "math" / "meta.json").read_text())
    task = MathTask(math_data / "math")
    assert meta["test_size"] == meta["counts"]["test"] == len(task.test_problems()) == len(task.val_problems())
    assert meta["counts"]["train"] == len(task.train_problems()) and "held out from training" in meta["test_split"]
    ids = {split: {p.id for p in problems} for split, problems in
           (("train", task.train_problems()), ("val", task.val_problems()), ("test", task.test_problems()))}
    assert not ids["test"] & (ids["train"] | ids["val"])
    again = prepare("math", meta["source"]["path"], tmp_path / "again", val_size=3)
    assert [p.id for p in MathTask(again.out).test_problems()] == [p.id for p in task.test_problems()]


def test_data_prepared_before_the_test_slice_trains_and_says_it_has_no_test(math_data: Path, tmp_path: Path) -> None:
    import shutil

    old = tmp_path / "old"
    shutil.copytree(math_data / "math", old)
    (old / "test.jsonl").unlink()
    task = MathTask(old)
    assert task.test_problems() == [] and task.val_problems()
    assert f"re-run `gridrun data prepare math --out {old}`" in task.test_missing


def _test_rows(cell: Path) -> list[dict]:
    return [r for r in metric_rows(cell) if r["split"] == "test"]


@pytest.mark.usefixtures("toy_world")
def test_a_trained_cell_is_tested_once_at_its_peak_and_a_rerun_adds_nothing(tmp_path: Path) -> None:
    cell = make_cell(tmp_path, train={"total_steps": 2, "val_every": 1, "val_problems": 24})
    assert run_cell(cell) == 0
    rows = metric_rows(cell)
    peak = first_peak(val_accuracy(rows))
    assert peak is not None
    (test,) = _test_rows(cell)
    assert test["step"] == peak[0] and test["test/n_problems"] == 24 and 0 <= test["test/acc"] <= 1
    records, damage = RunDir(cell).read_records("test")
    assert not damage and list(records) == [peak[0]] and records[peak[0]].matches(test["test/acc"])
    assert records[peak[0]].problems[0] == "arith-test-0"
    # The process died after the row, before `done`: the resume finds the row and tests nothing.
    reopen(cell)
    assert run_cell(cell) == 0
    assert metric_rows(cell) == rows


@pytest.mark.usefixtures("toy_world")
def test_a_base_cell_is_tested_at_step_0_as_a_peak_at_step_0_is(tmp_path: Path) -> None:
    base = make_cell(tmp_path, "base", cell={"kind": "base"}, train={"val_problems": 24})
    assert run_cell(base) == 0
    (row,) = _test_rows(base)
    assert row["step"] == 0
    # A trained cell whose peak stays step 0 measures the base model there: the base's number.
    trained = make_cell(tmp_path, "trained", optim={"lr": 1e-12}, train={"total_steps": 1, "val_every": 1, "val_problems": 24})
    assert run_cell(trained) == 0
    (same,) = _test_rows(trained)
    assert same["step"] == 0 and same["test/acc"] == row["test/acc"]
