"""Tests for gridrun.tasks.data (`gridrun data prepare`): the fixtures are tiny files in the real
upstream layouts (DAPO-Math-17k-Processed parquet, DeepCoder primeintellect jsonl), made up here.

tests/fixtures/dapo_math_sample.parquet holds `dapo_rows()` below (the test
`test_math_fixture_is_dapo_rows` keeps them equal; run this file as a script to rewrite it,
and the math sample gridrun ships, gridrun/tasks/math_sample/, prepared from it).
40 rows: row 3 lacks DAPO's answer wrapper, row 7 has an empty solution and row 13 a blank
prompt. numpy's default_rng(42).permutation(40) starts 32, 7, 39, 18: those ceil(0.1 x 40) = 4
rows are held out, and row 7 is invalid, so 3 validation problems remain, 35 training ones.

tests/fixtures/deepcoder_sample.jsonl: 10 valid problems (7 stdin/stdout, 3 function-call,
one of them LeetCode style) and 6 malformed ones, one per drop reason.
"""

from __future__ import annotations

import hashlib
import json
import sys
from math import comb, gcd
from pathlib import Path
from typing import Any

import pytest

from gridrun.cli import main
from gridrun.tasks import data
from gridrun.tasks.code import CodeTask
from gridrun.tasks.data import DataError, permutation, prepare, split_problems
from gridrun.tasks.math import MathTask
from gridrun.tasks.prepared import MATH_SAMPLE, MissingData, read_split

FIXTURES = Path(__file__).parent / "fixtures"
MATH_FIXTURE = FIXTURES / "dapo_math_sample.parquet"
CODE_FIXTURE = FIXTURES / "deepcoder_sample.jsonl"
WRAP_PRE = ("Solve the following math problem step by step. The last line of your response should be of the "
            "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
WRAP_SUF = '\n\nRemember to put your answer on its own line after "Answer:".'


def _dapo_problem(i: int) -> tuple[str, str]:
    a, b = 3 + i % 7, 5 + (i * 3) % 11
    kind = i % 5
    if kind == 0:
        m = 7 + i % 13
        return f"Find the remainder when ${a}^{{{b}}}$ is divided by ${m}$.", str(pow(a, b, m))
    if kind == 1:
        n = 12 * (i + 1)
        return f"How many positive integers divide ${n}$?", str(sum(1 for d in range(1, n + 1) if n % d == 0))
    if kind == 2:
        return f"What is the sum of the first ${b}$ positive odd integers?", str(b * b)
    if kind == 3:
        return f"Compute $\\binom{{{a + b}}}{{{a}}}$.", str(comb(a + b, a))
    x, y = 6 * a, 4 * b
    question = (f"The least common multiple of ${x}$ and ${y}$ is $L$ and their greatest common divisor is $G$. "
                "Find $L - G$.")
    return question, str(x * y // gcd(x, y) - gcd(x, y))


def dapo_rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(40):
        text, answer = _dapo_problem(i)
        prompt = text if i == 3 else WRAP_PRE + text + WRAP_SUF
        if i == 7:
            answer = ""
        if i == 13:
            prompt = "   "
        index = hashlib.sha256(f"fixture-{i}".encode()).hexdigest()
        rows.append({
            "prompt": prompt,
            "solution": answer,
            "data_source": "math_dapo",
            "source_prompt": [{"content": prompt, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"{index[:8]}-{index[8:12]}-{index[12:16]}-{index[16:20]}-{index[20:32]}"},
        })
    return rows


def _code_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CODE_FIXTURE.read_text().splitlines() if line.strip()]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_math_fixture_is_dapo_rows() -> None:
    import pyarrow.parquet as pq

    assert pq.read_table(MATH_FIXTURE).to_pylist() == dapo_rows()


# ---------------------------------------------------------------------------------------- math
def test_math_split_by_hand() -> None:
    # See the module docstring: rows 32, 7, 39, 18 are held out; 7 is invalid.
    assert permutation(40, 42)[:4] == [32, 7, 39, 18]
    train, val, counts = split_problems("math", dapo_rows())
    assert [p["id"] for p in val] == ["math-000032", "math-000039", "math-000018"]
    assert len(train) == 35 and "math-000013" not in {p["id"] for p in train}
    assert counts["dropped"] == {"no_answer": 1, "no_question": 1}
    assert counts["dropped_from_val"] == 1
    # 38 valid rows, all but row 3 wrapped in DAPO's "Answer:" instruction, which is removed.
    assert counts["wrapper_stripped"] == 37
    assert all("Answer:" not in p["question"] and p["question"] == p["question"].strip() for p in train + val)
    # Each row keeps the prompt as distributed too (what the released preset shows the model).
    row0 = next(p for p in train if p["id"] == "math-000000")
    bare = "Find the remainder when $3^{5}$ is divided by $7$."
    assert row0 == {"id": "math-000000", "question": bare, "answer": "5", "tests": [],
                    "prompt": (WRAP_PRE + bare + WRAP_SUF).strip()}  # 3^5 = 243 = 34 x 7 + 5
    row3 = next(p for p in train + val if p["id"] == "math-000003")
    assert row3["prompt"] == row3["question"]  # row 3 came without the wrapper


def test_math_split_matches_datasets_train_test_split() -> None:
    # The paper's released code split with Dataset.train_test_split(test_size=0.1, seed=42).
    datasets = pytest.importorskip("datasets")
    for n in (40, 14116):
        split = datasets.Dataset.from_dict({"i": list(range(n))}).train_test_split(test_size=0.1, seed=42)
        order = permutation(n, 42)
        n_val = data.n_held_out(0.1, n)
        assert split["test"]["i"] == order[:n_val]
        assert split["train"]["i"] == order[n_val:]
    assert data.n_held_out(0.1, 14116) == 1412


def test_split_is_deterministic_and_seeded() -> None:
    first = split_problems("math", dapo_rows())
    assert split_problems("math", dapo_rows()) == first
    _, other_val, _ = split_problems("math", dapo_rows(), seed=7)
    assert {p["id"] for p in other_val} != {p["id"] for p in first[1]}


def test_math_accepts_the_unprocessed_dapo_layout() -> None:
    row = {"prompt": [{"role": "user", "content": WRAP_PRE + "What is 2 + 2?" + WRAP_SUF}],
           "reward_model": {"ground_truth": "4", "style": "rule"}}
    problem, reason = data._math_problem(row, 5)
    assert reason is None and problem is not None
    assert (problem["question"], problem["answer"]) == ("What is 2 + 2?", "4")


# ---------------------------------------------------------------------------------------- code
def test_code_split_and_drops() -> None:
    train, val, counts = split_problems("code", _code_rows(), val_size=3)
    assert counts["dropped"] == {"call_test_without_fn_name": 1, "mixed_test_kinds": 1, "no_question": 1,
                                 "no_tests": 1, "stdin_test_not_strings": 1, "tests_not_json": 1}
    assert (len(train), len(val)) == (7, 3)
    # Filter first, then shuffle the 10 valid problems (rows 0-9) with default_rng(42).
    assert [p["id"] for p in val] == [f"code-{i:06d}" for i in permutation(10, 42)[:3]]
    assert split_problems("code", _code_rows(), val_size=3) == (train, val, counts)


def test_code_tests_take_the_rewards_forms() -> None:
    train, val, _ = split_problems("code", _code_rows(), val_size=3)
    by_id = {p["id"]: p for p in train + val}
    assert by_id["code-000000"]["tests"][0] == {"input": "1 2\n", "output": "3\n"}
    assert by_id["code-000006"]["tests"][0] == {"fn_name": "add", "input": [1, 2], "output": [3]}
    for problem in train + val:
        kinds = {"fn_name" in t for t in problem["tests"]}
        assert len(kinds) == 1 and problem["tests"]


@pytest.mark.parametrize("tests, reason", [
    ("[1, 2", "tests_not_json"),
    ("{}", "no_tests"),
    ([{"type": "stdin_stdout", "input": "1\n"}], "test_without_input_output"),
    ([{"type": "function_call", "fn_name": "not valid", "input": [1], "output": 1}], "call_test_without_fn_name"),
    ([{"type": "function_call", "fn_name": "f", "input": 1, "output": 1}], "call_test_input_not_a_list"),
    ([{"type": "interactive", "input": "", "output": ""}], "unknown_test_type"),
    ([{"fn_name": "f", "input": [1], "output": 1}, {"fn_name": "g", "input": [1], "output": 1}], "mixed_test_kinds"),
])
def test_code_test_validation(tests: Any, reason: str) -> None:
    assert data._code_problem({"problem": "p", "tests": tests}, 0) == (None, reason)


def test_val_size_larger_than_the_data_is_refused() -> None:
    with pytest.raises(DataError, match="--val-size"):
        split_problems("code", _code_rows())  # the default 1000 of 10 valid problems


# ---------------------------------------------------------------------------------------- prepare
def test_prepare_math_writes_the_format(tmp_path: Path) -> None:
    out = tmp_path / "math"
    done = prepare("math", MATH_FIXTURE, out)
    # 38 valid problems: 3 validation, and as many test problems taken from the 35 of training.
    assert (done.n_train, done.n_val, done.n_test) == (32, 3, 3)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "test.jsonl", "train.jsonl", "val.jsonl"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["files"][0]["sha256"] == hashlib.sha256(MATH_FIXTURE.read_bytes()).hexdigest()
    assert meta["seed"] == 42 and meta["counts"]["dropped_total"] == 2
    assert meta["outputs_sha256"]["val.jsonl"] == hashlib.sha256((out / "val.jsonl").read_bytes()).hexdigest()
    task = MathTask(out)
    assert [p.id for p in task.val_problems()] == ["math-000032", "math-000039", "math-000018"]
    assert task.score("so \\boxed{169}", task.val_problems()[0]).correct  # 13 odd numbers sum to 13^2
    again = tmp_path / "again"
    prepare("math", MATH_FIXTURE, again)
    assert (again / "train.jsonl").read_bytes() == (out / "train.jsonl").read_bytes()


def test_prepare_code_writes_the_format(tmp_path: Path) -> None:
    prepare("code", CODE_FIXTURE, tmp_path, val_size=3)
    problems = [p for split in ("train", "val", "test") for p in read_split(tmp_path, split, "code")]
    assert len(problems) == 10 and all(p.tests and p.answer == "" for p in problems)


def test_from_a_hub_snapshot_folder(tmp_path: Path) -> None:
    # `hf download` lays a repo out as <repo>/<config>/train-*.parquet beside other configs.
    snapshot = tmp_path / "DAPO-Math-17k-Processed"
    for config in ("en", "cn"):
        (snapshot / config).mkdir(parents=True)
    (snapshot / "en" / "train-00000-of-00001.parquet").write_bytes(MATH_FIXTURE.read_bytes())
    (snapshot / "cn" / "train-00000-of-00001.parquet").write_bytes(b"not read")
    done = prepare("math", snapshot, tmp_path / "out")
    assert (done.n_train, done.n_val) == (32, 3)


def test_hub_rows_equal_local_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load(name: str, config: str, split: str) -> Any:
        calls.append((name, config, split))
        return datasets.Dataset.from_list(dapo_rows())

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    hub = prepare("math", None, tmp_path / "hub")
    local = prepare("math", MATH_FIXTURE, tmp_path / "local")
    assert calls == [("open-r1/DAPO-Math-17k-Processed", "en", "train")]
    assert hub.meta["source"]["kind"] == "hub"
    assert hub.meta["rows_sha256"] == local.meta["rows_sha256"]
    assert (tmp_path / "hub" / "train.jsonl").read_bytes() == (tmp_path / "local" / "train.jsonl").read_bytes()


def test_hub_failure_is_one_line_naming_from_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    datasets = pytest.importorskip("datasets")

    def offline(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("Couldn't reach 'agentica-org/DeepCoder-Preview-Dataset' on the Hub\n(details)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    out = tmp_path / "code"
    assert main(["data", "prepare", "code", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--from PATH" in err and "ConnectionError" in err
    assert not out.exists()


def test_missing_data_names_the_prepare_command(tmp_path: Path) -> None:
    with pytest.raises(MissingData, match="gridrun data prepare code"):
        CodeTask(tmp_path / "nothing")


def test_bad_from_path_and_broken_jsonl(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        prepare("math", tmp_path / "absent", tmp_path / "out")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(CODE_FIXTURE.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(DataError, match="broken.jsonl:2"):
        prepare("code", broken, tmp_path / "out", val_size=1)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="no rows"):
        prepare("code", empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_what_its_name_says_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: a 32-line ArrowInvalid traceback for the first two, FileExistsError for --out.
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    csv = tmp_path / "rows.parquet"
    csv.write_text("prompt,answer\nWhat is 1+1?,2\n")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(CODE_FIXTURE.read_bytes().splitlines(keepends=True)[0] + b'{"prompt": "caf\xe9"}\n')
    parquet_fix = "): re-export it as Parquet, or as JSON lines (.jsonl, one problem per line)\n"
    cases = {
        empty: (f"{empty} is not a Parquet file (", parquet_fix),
        csv: (f"{csv} is not a Parquet file (", parquet_fix),
        latin: (f"{latin}:2 is not UTF-8 text", ": re-export the file as UTF-8 JSON lines\n"),
    }
    for path, (what, fix) in cases.items():
        assert main(["data", "prepare", "code", "--from", str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gridrun: error: {what}") and err.endswith(fix) and err.count("\n") == 1, err
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    assert main(["data", "prepare", "code", "--from", str(CODE_FIXTURE), "--out", str(taken)]) == 2
    assert capsys.readouterr().err == (
        f"gridrun: error: --out {taken} is a file, not a folder: pass a folder (created if absent) for "
        "train.jsonl, val.jsonl and meta.json\n")
    assert taken.read_text() == "not a folder" and not (tmp_path / "out").exists()


def test_cli_prepare_prints_the_data_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", "code", "--from", str(CODE_FIXTURE), "--val-size", "3"]) == 0
    out = capsys.readouterr().out
    assert f"task.data_path={tmp_path / 'data' / 'code'}" in out  # default out: data/<task> under the cwd
    assert "4 train, 3 val, 3 test" in out and "1 tests_not_json" in out
    assert len(CodeTask(tmp_path / "data" / "code").val_problems()) == 3


def test_the_math_task_shows_the_dapo_prompt_or_the_bare_problem(tmp_path: Path) -> None:
    # task.question=dapo_prompt (released) keeps DAPO's "Answer:" instruction around the
    # problem, as the released code trained; bare (as_written) strips it.
    from gridrun.tasks.math import MathTask

    prepare("math", MATH_FIXTURE, tmp_path / "math")
    released, as_written = (MathTask(tmp_path / "math", question=q) for q in ("dapo_prompt", "bare"))
    first = {p.id: p for p in released.train_problems()}["math-000000"]
    bare = {p.id: p for p in as_written.train_problems()}["math-000000"]
    assert bare.question == "Find the remainder when $3^{5}$ is divided by $7$."
    assert first.question == (WRAP_PRE + bare.question + WRAP_SUF).strip() and first.answer == bare.answer == "5"
    # Data prepared before the prompt was kept: the released task names the fix.
    old = tmp_path / "old"
    old.mkdir()
    for split in ("train", "val"):
        rows = [{k: v for k, v in row.items() if k != "prompt"} for row in _lines(tmp_path / "math" / f"{split}.jsonl")]
        (old / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert MathTask(old, question="bare").train_problems()
    with pytest.raises(MissingData, match=r"no 'prompt' field .*re-run `gridrun data prepare math`"):
        MathTask(old, question="dapo_prompt")


def ship_math_sample(out: Path = MATH_SAMPLE) -> None:
    """gridrun/tasks/math_sample/: the math fixture prepared, its source named from the
    repository root (a path on the machine that wrote it means nothing where it is installed)."""
    prepare("math", MATH_FIXTURE, out)
    meta = json.loads((out / "meta.json").read_text())
    relative = str(MATH_FIXTURE.relative_to(Path(__file__).parents[1]))
    meta["source"]["path"] = relative
    meta["source"]["files"][0]["path"] = relative
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def test_the_shipped_math_sample_is_the_fixture_prepared(tmp_path: Path) -> None:
    # What a CPU canary trains on where no math data is prepared (gridrun/grid/canary.py): the
    # fixture's 38 valid problems, split as `gridrun data prepare math` splits them.
    ship_math_sample(tmp_path)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        assert (MATH_SAMPLE / name).read_bytes() == (tmp_path / name).read_bytes(), \
            f"{MATH_SAMPLE / name} is stale: rewrite it with `python tests/test_data.py`"
    shipped, fresh = (json.loads((folder / "meta.json").read_text()) for folder in (MATH_SAMPLE, tmp_path))
    del shipped["created"], shipped["seconds"], fresh["created"], fresh["seconds"]
    assert shipped == fresh
    assert [len(read_split(MATH_SAMPLE, split, "math")) for split in ("train", "val", "test")] == [32, 3, 3]


if __name__ == "__main__":  # rewrite the math fixture from dapo_rows(), then the shipped sample from it
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(dapo_rows()), MATH_FIXTURE)
    ship_math_sample()
    sys.exit(0)
