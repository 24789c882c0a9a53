"""`gridrun data prepare math|code`: fetch a task's data set, validate it, write the prepared format.

What it does:
- `math`: DAPO-Math-17k, open-r1's processed English subset (`open-r1/DAPO-Math-17k-Processed`,
  config `en`, split `train`, about 14.1k rows). Its columns: `prompt` (the problem, a string),
  `solution` (the ground-truth final answer, a short string, not a worked solution),
  `data_source`, `source_prompt` (DAPO's original chat messages), `ability`, `reward_model`
  (`{"ground_truth", "style"}`) and `extra_info` (`{"index"}`). The question is `prompt`, the
  answer is `solution`. `prompt` still carries DAPO's own instruction around the problem
  ("Solve the following math problem step by step. The last line of your response should be
  of the form Answer: $Answer ..." / "Remember to put your answer on its own line after
  \"Answer:\"."); it contradicts our `\\boxed{}` prompts, yet the released code trained on it.
  Each row keeps both: `prompt`, as distributed (what `task.question=dapo_prompt`, the
  released preset, shows the model), and `question`, that exact wrapper removed (counted in
  meta.json as `wrapper_stripped`; `task.question=bare`, the as_written preset). Split: exactly what
  `datasets.Dataset.train_test_split(test_size=0.1, seed=42)` does (a numpy PCG64 permutation
  of the rows, the first ceil(10%) held out), which is how the paper's released code split it:
  1412 validation problems out of 14116. Invalid rows are dropped after the split, so every
  valid problem stays on the side of the paper's split it was on.
- `code`: DeepCoder's PrimeIntellect subset (`agentica-org/DeepCoder-Preview-Dataset`, config
  `primeintellect`, split `train`). Its columns: `problem` (the statement), `solutions`
  (reference programs, unused here) and `tests`, a JSON string holding a list of tests, each
  either `{"type": "stdin_stdout", "input": str, "output": str}` or
  `{"type": "function_call", "fn_name": str, "input": [args...], "output": expected}`.
  Problems whose tests are not well-formed are dropped (see `_code_tests`), the rest are
  shuffled with `numpy.random.default_rng(42).permutation` (what `Dataset.shuffle(seed=42)`
  does) and the first 1000 are held out for validation. Tests are written in the form
  `gridrun.tasks.code_reward` takes: `{"input", "output"}` or `{"fn_name", "input", "output"}`.
- Sources: the hub through `datasets.load_dataset` (imported only then), or a local copy given
  by `--from PATH`: one .parquet/.jsonl file, or a directory of them (a hub snapshot works: a
  subdirectory named after the config is entered, and `train*` files are preferred).
- Test: a slice of the training side held out for the test evaluation (the checkpoint chosen
  on val, measured once on problems nothing chose it on): the first `test_size` training
  problems in the split's permutation order (already a seed-42 shuffle), as many as the
  validation split holds unless `--test-size` says otherwise. The paper's validation split is
  untouched; training loses exactly these problems (meta.json: `test_size`, `counts.test`,
  `test_split`). Every cell reading the folder sees the same slice.
- Output: `<out>/{train,val,test}.jsonl` in the prepared format (gridrun/tasks/prepared.py) and
  `<out>/meta.json` (source, sha256 of every input file and of the rows read, seed, counts,
  drops by reason). Nothing is written until the data has been read and validated, and each
  file is replaced atomically, meta.json last.

What it leaves out:
- The released code's code-data filter: it kept only tests listed as passing in a
  `runtime_results.json` it does not publish, so its exact test sets cannot be rebuilt here.
  Its LiveCodeBench-style instruction around each problem is applied when a cell loads the
  data (`task.question=lcb_instruction`, gridrun/tasks/code.py), not written here.
- No re-verification of DeepCoder's tests against its reference solutions (DeepCoder's curators
  already kept only problems their solutions pass; running ~16k solutions here would take hours).
- No cap on the number or size of tests per problem: the reward's per-program time cap bounds
  the cost instead.
- No deduplication beyond the upstream one, and no other math/code data sets.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridrun.seam.errors import UserError

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # 3: the test slice (test.jsonl)
DEFAULT_SEED = 42

# DAPO's own answer instruction around each problem (see the module docstring).
_DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
_DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class DataError(UserError):
    """A data problem the user can fix; one line, naming the fix."""


@dataclass(frozen=True)
class Source:
    """Where a task's data lives upstream, and how it is split."""

    hub: str
    config: str
    split: str
    # A float is a fraction held out (rounded up, as `train_test_split` does); an int is a count.
    val_size: float | int
    # Rows to problems: (row, index) -> (problem dict, None) or (None, reason it was dropped).
    normalize: Callable[[dict[str, Any], int], tuple[dict[str, Any] | None, str | None]]
    # True: split all rows first, then drop invalid ones (math, to keep the paper's split).
    # False: drop invalid rows first, then shuffle the rest (code).
    split_before_filter: bool


@dataclass
class Prepared:
    """What `prepare` wrote."""

    out: Path
    n_train: int
    n_val: int
    n_test: int
    dropped: dict[str, int]
    meta: dict[str, Any] = field(repr=False)


# ---------------------------------------------------------------------------------------- math
def _strip_dapo_wrapper(prompt: str) -> tuple[str, bool]:
    if prompt.startswith(_DAPO_PREFIX) and prompt.endswith(_DAPO_SUFFIX):
        return prompt[len(_DAPO_PREFIX) : len(prompt) - len(_DAPO_SUFFIX)].strip(), True
    return prompt.strip(), False


def _math_problem(row: dict[str, Any], index: int) -> tuple[dict[str, Any] | None, str | None]:
    # Fallbacks cover the unprocessed DAPO layout (`prompt` as chat messages, the answer only in
    # `reward_model.ground_truth`) and copies with `problem`/`answer` columns.
    prompt = row.get("prompt", row.get("problem"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        prompt = prompt[0].get("content")
    answer = row.get("solution", row.get("answer"))
    if answer is None and isinstance(row.get("reward_model"), dict):
        answer = row["reward_model"].get("ground_truth")
    if not isinstance(prompt, str) or not prompt.strip():
        return None, "no_question"
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool) or not str(answer).strip():
        return None, "no_answer"
    question, stripped = _strip_dapo_wrapper(prompt)
    if not question:
        return None, "no_question"
    return {"id": f"math-{index:06d}", "question": question, "answer": str(answer).strip(),
            "tests": [], "prompt": prompt.strip(), "_wrapper_stripped": stripped}, None


# ---------------------------------------------------------------------------------------- code
def _code_test(test: Any) -> tuple[dict[str, Any] | None, str]:
    """One test in the reward's form and its kind ("stdin" or "call:<fn>"), or (None, reason)."""
    if not isinstance(test, dict) or "input" not in test or "output" not in test:
        return None, "test_without_input_output"
    kind = test.get("type")
    fn_name = test.get("fn_name")
    if kind == "function_call" or (kind is None and fn_name):
        if not isinstance(fn_name, str) or not _IDENTIFIER.match(fn_name):
            return None, "call_test_without_fn_name"
        if not isinstance(test["input"], list):
            return None, "call_test_input_not_a_list"
        return {"fn_name": fn_name, "input": test["input"], "output": test["output"]}, f"call:{fn_name}"
    if kind not in (None, "stdin_stdout"):
        return None, "unknown_test_type"
    if not isinstance(test["input"], str) or not isinstance(test["output"], str):
        return None, "stdin_test_not_strings"
    return {"input": test["input"], "output": test["output"]}, "stdin"


def _code_tests(raw: Any) -> tuple[list[dict[str, Any]] | None, str]:
    """The problem's tests in the reward's form, or (None, reason): one bad test drops the problem,
    because a reward over a partly unreadable test set would not mean what `pass_rate` says."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return None, "tests_not_json"
    if not isinstance(raw, list) or not raw:
        return None, "no_tests"
    tests, kinds = [], set()
    for test in raw:
        norm, kind = _code_test(test)
        if norm is None:
            return None, kind
        tests.append(norm)
        kinds.add(kind)
    if len(kinds) > 1:
        return None, "mixed_test_kinds"  # stdin and call tests (or two functions) in one problem
    return tests, ""


def _code_problem(row: dict[str, Any], index: int) -> tuple[dict[str, Any] | None, str | None]:
    question = row.get("problem")
    if not isinstance(question, str) or not question.strip():
        return None, "no_question"
    tests, reason = _code_tests(row.get("tests"))
    if tests is None:
        return None, reason
    return {"id": f"code-{index:06d}", "question": question.strip(), "answer": "", "tests": tests}, None


SOURCES: dict[str, Source] = {
    "math": Source("open-r1/DAPO-Math-17k-Processed", "en", "train", 0.1, _math_problem, True),
    "code": Source("agentica-org/DeepCoder-Preview-Dataset", "primeintellect", "train", 1000, _code_problem, False),
}


# ------------------------------------------------------------------------------------- reading
def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _data_files(path: Path, config: str) -> list[Path]:
    if path.is_file():
        if path.suffix not in (".parquet", ".jsonl"):
            raise DataError(f"{path}: expected a .parquet or .jsonl file (or a directory of them)")
        return [path]
    if not path.is_dir():
        what = "it exists but is neither a file nor a folder (a pipe, a socket or a device?)" if path.exists() else \
            "no such file or directory"
        raise DataError(f"--from {path}: {what}: pass a .parquet or .jsonl file or a folder of them")
    if (path / config).is_dir():  # a hub snapshot: <repo>/<config>/train-*.parquet
        path = path / config
    files = sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".jsonl") and p.is_file())
    train = [p for p in files if p.name.startswith("train")]
    if not files:
        raise DataError(f"--from {path}: no .parquet or .jsonl files in it")
    return train or files


def _rows_from_file(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=512):
                yield from batch.to_pylist()
        except pa.ArrowException as err:  # an empty file, a CSV renamed .parquet, a truncated copy
            why = (str(err).strip().splitlines() or [""])[0][:120]
            raise DataError(f"{path} is not a Parquet file ({why}): re-export it as Parquet, or as "
                            "JSON lines (.jsonl, one problem per line)") from None
        return
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}:{line_no} is not UTF-8 text: re-export the file as UTF-8 JSON lines") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                # A broken line is a broken file, not a malformed problem: refuse rather than guess.
                raise DataError(f"{path}:{line_no} is not JSON ({err.msg}): re-export the file") from err
            if not isinstance(row, dict):
                raise DataError(f"{path}:{line_no} is not a JSON object: expected one row per line")
            yield row


def _rows_from_hub(source: Source) -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
    fix = (f"download it where there is internet (`hf download {source.hub} --repo-type dataset "
           f"--local-dir DIR`) and pass that folder (or its `{source.config}` files) with --from PATH")
    try:
        import datasets
    except ImportError as err:
        raise DataError(f"reading from the hub needs the `datasets` package (pip install datasets), "
                        f"or {fix}") from err
    try:
        ds = datasets.load_dataset(source.hub, source.config, split=source.split)
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise DataError(f"could not load {source.hub} ({source.config}) from the hub "
                        f"({type(err).__name__}: {first}): {fix}") from err
    info = {"kind": "hub", "name": source.hub, "config": source.config, "split": source.split,
            "datasets_version": datasets.__version__, "fingerprint": getattr(ds, "_fingerprint", None)}
    return iter(ds), info


def _read(source: Source, from_path: Path | None) -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
    """Every row of the source, in order (streamed: DeepCoder's rows carry large reference
    solutions that are never kept), plus where it came from."""
    if from_path is None:
        return _rows_from_hub(source)
    files = _data_files(from_path, source.config)
    info = {"kind": "path", "path": str(from_path.resolve()),
            "files": [{"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": _sha256_file(p)}
                      for p in files]}
    return (row for p in files for row in _rows_from_file(p)), info


class _RowHasher:
    """sha256 over the rows as read, in order. The same rows hash the same whether they came
    from the hub or a local copy, so a local copy can be checked against a hub run's meta.json."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def passing(self, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for row in rows:
            self._digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
            self._digest.update(b"\n")
            yield row

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


# ------------------------------------------------------------------------------------ splitting
def permutation(n: int, seed: int) -> list[int]:
    """The row order `datasets` uses for `shuffle(seed=)` and `train_test_split(seed=)`."""
    import numpy as np

    return [int(i) for i in np.random.default_rng(seed).permutation(n)]


def n_held_out(val_size: float, n: int) -> int:
    """Rows held out: ceil(fraction x n) as `train_test_split` rounds, or a count."""
    if isinstance(val_size, float):
        if not 0.0 < val_size < 1.0:
            raise DataError(f"--val-size {val_size}: a fraction must lie strictly between 0 and 1")
        return math.ceil(val_size * n)
    if val_size < 1:
        raise DataError(f"--val-size {val_size}: a count must be at least 1")
    return val_size


def split_problems(task: str, rows: Iterable[dict[str, Any]], seed: int = DEFAULT_SEED,
                   val_size: float | None = None) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """Normalize, validate and split source rows: (train, val, counts). Pure; no I/O.

    `val_size`: a float is the fraction held out, an int the count; None takes the task's default.
    """
    source = SOURCES[task]
    val_size = source.val_size if val_size is None else val_size
    normalized = [source.normalize(row, i) for i, row in enumerate(rows)]
    n_rows = len(normalized)
    if not n_rows:
        raise DataError(f"the {task} source has no rows: check --from")
    dropped: Counter[str] = Counter(str(reason) for problem, reason in normalized if problem is None)
    counts: dict[str, Any] = {"source_rows": n_rows}
    if source.split_before_filter:
        n_val = n_held_out(val_size, n_rows)
        if n_val >= n_rows:
            raise DataError(f"holding out {n_val} of {n_rows} rows leaves nothing to train on: lower --val-size")
        order = permutation(n_rows, seed)
        val = [problem for i in order[:n_val] if (problem := normalized[i][0]) is not None]
        train = [problem for i in order[n_val:] if (problem := normalized[i][0]) is not None]
        counts["dropped_from_val"] = n_val - len(val)
    else:
        kept = [problem for problem, _ in normalized if problem is not None]
        n_val = n_held_out(val_size, len(kept))
        if n_val >= len(kept):
            raise DataError(f"holding out {n_val} of {len(kept)} valid problems leaves nothing to train on: "
                            "lower --val-size")
        order = permutation(len(kept), seed)
        val = [kept[i] for i in order[:n_val]]
        train = [kept[i] for i in order[n_val:]]
    counts.update(kept=len(train) + len(val), train=len(train), val=len(val),
                  dropped=dict(sorted(dropped.items())), dropped_total=sum(dropped.values()))
    if task == "math":
        counts["wrapper_stripped"] = sum(1 for p in train + val if p.pop("_wrapper_stripped"))
    return train, val, counts


def hold_out_test(train: list[dict[str, Any]], test_size: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, test): the first `test_size` training problems (in the split's permutation
    order, so a seeded random sample) held out as the test split. Pure; no I/O."""
    if test_size < 1:
        raise DataError(f"--test-size {test_size}: the test split needs at least 1 problem")
    if test_size >= len(train):
        raise DataError(f"holding out {test_size} test problems of {len(train)} training problems leaves nothing "
                        "to train on: lower --test-size")
    return train[test_size:], train[:test_size]


# ------------------------------------------------------------------------------------- writing
def _write_atomic(path: Path, lines: Iterator[str]) -> str:
    """Write lines to a temp file, fsync, rename over path; returns the file's sha256. A disk
    that refuses the write is a DataError naming the file, and leaves no temp file."""
    tmp = path.with_name(f".{path.name}.tmp")
    digest = hashlib.sha256()
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(line)
                digest.update(line.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)  # a full disk leaves no temp file behind
        if isinstance(err, OSError):
            raise DataError(f"cannot write {path}: {err.strerror}: free space there, or pass --out <a folder "
                            "on another disk>, then run the command again") from None
        raise
    return digest.hexdigest()


def _jsonl(problems: list[dict[str, Any]]) -> Iterator[str]:
    for problem in problems:
        yield json.dumps(problem, ensure_ascii=False) + "\n"


def default_out(task: str) -> Path:
    return Path("data") / task


def prepare(task: str, from_path: str | Path | None = None, out: str | Path | None = None,
            seed: int = DEFAULT_SEED, val_size: float | None = None, test_size: int | None = None) -> Prepared:
    """Read the task's data (hub, or `from_path`), validate, split and write the prepared format.
    `test_size`: the test slice taken from training (None: as many as the validation split)."""
    if task not in SOURCES:
        raise DataError(f"unknown task {task!r}: expected one of {list(SOURCES)}")
    source = SOURCES[task]
    out_dir = Path(out) if out is not None else default_out(task)
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out {out_dir} is a file, not a folder: pass a folder (created if absent) for "
                        "train.jsonl, val.jsonl and meta.json")
    started = time.time()
    rows, origin = _read(source, Path(from_path) if from_path is not None else None)
    hasher = _RowHasher()
    train, val, counts = split_problems(task, hasher.passing(rows), seed, val_size)
    log.info("read %d %s rows from %s", counts["source_rows"], task, origin.get("path") or origin.get("name"))
    if not train or not val:
        raise DataError(f"no valid {task} problems on one side of the split ({counts['dropped']} dropped): "
                        "check that --from points at the right data set")

    test_size = len(val) if test_size is None else test_size
    train, test = hold_out_test(train, test_size)
    counts.update(train=len(train), test=len(test))

    out_dir.mkdir(parents=True, exist_ok=True)
    # A previous run's meta.json must not vouch for splits that are being replaced.
    (out_dir / "meta.json").unlink(missing_ok=True)
    outputs = {"train.jsonl": _write_atomic(out_dir / "train.jsonl", _jsonl(train)),
               "val.jsonl": _write_atomic(out_dir / "val.jsonl", _jsonl(val)),
               "test.jsonl": _write_atomic(out_dir / "test.jsonl", _jsonl(test))}
    meta = {
        "format": FORMAT_VERSION,
        "task": task,
        "source": origin,
        "rows_sha256": hasher.hexdigest(),
        "seed": seed,
        "val_size": source.val_size if val_size is None else val_size,
        "split": ("train_test_split: numpy default_rng(seed).permutation over all rows, first "
                  "ceil(val_size x rows) held out, invalid rows dropped afterwards"
                  if source.split_before_filter else
                  "invalid rows dropped, numpy default_rng(seed).permutation over the rest, first val_size held out"),
        "test_size": test_size,
        "test_split": (f"the first {test_size} training problems in the split's permutation order, held out "
                       "from training for the test evaluation (the validation split is unchanged)"),
        "counts": counts,
        "outputs_sha256": outputs,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
    }
    # meta.json last: its presence says the three splits beside it are complete and belong together.
    _write_atomic(out_dir / "meta.json", iter([json.dumps(meta, indent=2, ensure_ascii=False) + "\n"]))
    return Prepared(out=out_dir, n_train=len(train), n_val=len(val), n_test=len(test), dropped=counts["dropped"],
                    meta=meta)
