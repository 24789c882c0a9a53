"""Per-problem validation records: written and read by the run directory, damage kept local."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridrun.seam.records import ValidationRecord
from gridrun.seam.rundir import RunDir


def record(step: int, correct: list[int], split: str = "val") -> ValidationRecord:
    return ValidationRecord.from_outcomes(split, step, ((f"p{i}", bool(c)) for i, c in enumerate(correct)))


def test_outcomes_tally_per_problem_in_first_seen_order() -> None:
    r = ValidationRecord.from_outcomes("val", 3, [("b", True), ("a", False), ("b", False), ("a", True), ("b", True)])
    assert (r.problems, r.samples, r.correct) == (("b", "a"), (3, 2), (2, 1))
    assert r.acc == pytest.approx(3 / 5) and r.rates() == {"b": pytest.approx(2 / 3), "a": 0.5}
    assert r.matches(0.6) and not r.matches(0.61)


def test_a_record_round_trips_and_stale_steps_go_on_resume(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for step in (0, 10, 20):
        run.write_record(record(step, [1, 0, step % 20]))
    run.write_record(record(20, [1, 1], split="test"))
    found, damage = run.read_records("val")
    assert not damage and sorted(found) == [0, 10, 20] and found[10] == record(10, [1, 0, 10 % 20])
    run.drop_records_after(10)
    assert sorted(run.read_records("val")[0]) == [0, 10] and not run.read_records("test")[0]


@pytest.mark.parametrize("text, why", [
    (b"{not json", "Expecting"),
    (b"\xff\xfe", "utf-8"),
    (json.dumps({"split": "val", "step": 5, "problems": ["a"], "samples": [1], "correct": [2]}).encode(), "correct <= samples"),
    (json.dumps({"split": "val", "step": 5, "problems": ["a", "a"], "samples": [1, 1], "correct": [0, 1]}).encode(), "distinct"),
    (json.dumps({"split": "val", "step": 6, "problems": ["a"], "samples": [1], "correct": [1]}).encode(), "holds the record of val step 6"),
])
def test_a_damaged_record_is_left_out_alone_with_its_fix(tmp_path: Path, text: bytes, why: str) -> None:
    run = RunDir(tmp_path)
    run.write_record(record(0, [1, 0]))
    run.record_file("val", 5).write_bytes(text)
    found, damage = run.read_records("val")
    assert list(found) == [0]
    assert len(damage) == 1 and why in damage[0] and "delete it" in damage[0]
