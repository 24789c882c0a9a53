"""The prepared-data format every real task reads: `<dir>/{train,val,test}.jsonl` + `<dir>/meta.json`.

`gridrun data prepare math|code` writes it (from the hub or a local copy); training jobs
read only this, so compute nodes without internet work. One JSON object per line:
`{"id": str, "question": str, "answer": str, "tests": [...]}` (tests for code only; math rows
also hold "prompt", the problem as DAPO-Math distributes it, its format instruction included).
test.jsonl (the slice held out from training for the test evaluation) is absent from data
prepared before gridrun held one out: such a folder still trains and validates, and its cells
skip the test evaluation, saying so (`read_test`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gridrun.seam.registry import ConfigError
from gridrun.tasks.base import Problem

# A prepared math set shipped with gridrun (package data): 38 short problems in DAPO-Math's
# format (tests/fixtures/dapo_math_sample.parquet, prepared by `gridrun data prepare math`),
# what the CPU canary trains on where no math data is prepared. Never the paper's data.
MATH_SAMPLE = Path(__file__).with_name("math_sample")


class MissingData(FileNotFoundError):
    pass


def read_split(data_path: str | Path, split: str, task: str, question: str = "question") -> list[Problem]:
    """A prepared split's problems; `question` names the row field the model sees (math's
    "prompt" holds the problem as its source distributed it, format instructions included)."""
    path = Path(data_path) / f"{split}.jsonl"
    if not path.is_file():
        raise MissingData(
            f"no prepared {task} data at {path}: run `gridrun data prepare {task} --out {data_path}` "
            "(add --from PATH on machines without hub access)"
        )
    problems = []
    with open(path) as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                problems.append(
                    Problem(
                        id=str(row["id"]),
                        question=row[question],
                        answer=str(row.get("answer", "")),
                        tests=tuple(row.get("tests", ())),
                    )
                )
            except KeyError as err:
                if question != "question" and question not in row:
                    raise MissingData(f"{path}:{line_no} has no '{question}' field (prepared by an older gridrun): "
                                      f"re-run `gridrun data prepare {task}`") from err
                raise MissingData(f"{path}:{line_no} is not a prepared problem (KeyError): "
                                  f"re-run `gridrun data prepare {task}`") from err
            except (json.JSONDecodeError, TypeError) as err:
                raise MissingData(
                    f"{path}:{line_no} is not a prepared problem ({err.__class__.__name__}): "
                    f"re-run `gridrun data prepare {task}`"
                ) from err
    return problems


def require_data(params: Any) -> None:
    """Tasks reading prepared data refuse a config without its path, naming the command."""
    if not getattr(params, "data_path", None):
        raise ConfigError(f"task '{params.name}' needs task.data_path: run `gridrun data prepare {params.name}` "
                          "and point task.data_path at its output")


def read_test(data_path: str | Path, task: str, question: str = "question") -> tuple[list[Problem], str]:
    """The test split and what to say when there is none. Data prepared before the test slice
    existed has no test.jsonl: its cells train and validate as before and skip the test
    evaluation (re-preparing would change the training set under a sweep already running
    on it, so the cell does not refuse)."""
    missing = (f"no test split in {data_path} (prepared before gridrun held one out): this cell skips its test "
               f"evaluation; re-run `gridrun data prepare {task} --out {data_path}` for one (it moves as many "
               "problems as val holds from train to test.jsonl: plan the sweep afresh then)")
    if not (Path(data_path) / "test.jsonl").is_file():
        return [], missing
    return read_split(data_path, "test", task, question), missing
