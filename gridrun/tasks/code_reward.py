"""Code-generation reward: run the model's program against unit tests in the sandbox.

What it does:
- Takes the LAST fenced block of a response tagged python/py/python3 or untagged
  (complete fences only: a truncated response has no code; ``answers.last_python_block``).
- Checks syntax with ``compile()`` in the parent (from the program's UTF-8 bytes, as
  ``python3 main.py`` reads a file: a BOM or coding cookie means what it means there), then
  runs the tests in ``gridrun.tasks.sandbox``, which fails closed: without a working sandbox
  nothing runs (``SandboxUnavailable``) unless the caller opted out by name
  (``SandboxConfig(isolation="none")``; every score then carries the ``unsandboxed`` flag).
  Two DeepCoder/PrimeIntellect test formats:
  stdin/stdout ``{"input": str, "output": str}`` and function call
  ``{"fn_name": f, "input": [args...], "output": expected}``, where ``f`` is a
  top-level function or, LeetCode style, a method of ``class Solution``.
- ``mode="pass_rate"``: reward = passed / total (the DeepCoder paper);
  ``mode="all_pass"``: 1.0 only if every test passes (its released code).
- Output check, stdin/stdout: both sides split on whitespace and compared token by
  token (so trailing spaces, blank lines and line breaks do not matter); tokens that
  differ still match if both are numbers, one has a '.' or exponent, and they agree
  within 1e-6 (absolute or relative). Function call: the JSON round-tripped return
  value equals the expected value (floats within 1e-6), or the expected value is a
  one-element list holding it (TACO/PrimeIntellect wrap return values that way).
- A non-zero exit status fails a test even if the output is right. Exit statuses are the
  program's own (no value is reserved), judged as ``python3 main.py`` would end.

How tests run (all sandboxed):
- ``gridrun.tasks.harness`` runs in the sandbox (its PID 1, shipped as that module's
  source), compiles the program once and forks a fresh child per test with its own stdin
  file, rlimits and wall-clock timeout, so every test sees a new process exactly as if
  started alone, minus the interpreter start. Expected outputs never enter the sandbox:
  the parent compares.
- ``score_code_batch`` runs all programs on a ``concurrent.futures`` thread pool sized
  to the CPU count. Each program's tests go through one sandbox start in order (test 0
  first); the parent checks each reply before sending the next test. Under ``all_pass`` a
  failing program stops at its first failure ("skipped" counts the rest); under
  ``pass_rate`` only program-level failures (no code, syntax error) skip tests, so
  rewards are identical to running every test in its own sandbox (the baseline in
  bench/code_reward.py). With fewer programs than workers, a program's tests are split
  across several starts; every program's first chunk (holding test 0) is started before
  any later, speculative chunk.
- Limits are one ``CodeLimits``: per-test timeout (``timeout_s``), plus a per-program
  budget on the summed test time that scales with the number of tests:
  ``min(budget_cap_s, timeout_s + budget_per_test_s * n)`` (defaults: 6 s + 2 s per test,
  capped at 600 s: 26 s for 10 tests, the cap from 297 tests on). Once spent, the remaining tests are flagged ``budget``, not ``timeout``: the
  budget ran out, not the program. (Chunks of one program running in parallel can each
  start before the budget is seen, so exhausting it is the one case where results can
  depend on scheduling.)

Flags count tests (or programs, for no_code / syntax_error / unsandboxed):
no_code, syntax_error, runtime_error, wrong_answer, timeout, budget, memory,
output_limit, skipped, unsandboxed.

Left out: other languages, special judges, interactive problems, and test inputs
other than a string (stdin) or a JSON list of arguments (a string of
newline-separated JSON values is also accepted, LiveCodeBench style).
No torch import: this module is used by both the trainer and the reward workers.
"""

from __future__ import annotations

import base64
import inspect
import itertools
import json
import math
import os
import queue
import threading
import tokenize
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from gridrun.seam.errors import UserError
from gridrun.tasks import harness
from gridrun.tasks.answers import last_python_block
from gridrun.tasks.sandbox import Limits, SandboxConfig, SandboxProcess, require, start_python

__all__ = [
    "FLAG_NAMES",
    "CodeInputError",
    "CodeLimits",
    "CodeScore",
    "score_code",
    "score_code_batch",
    "score_program_json",
]

Mode = Literal["pass_rate", "all_pass"]

FLAG_NAMES = ("no_code", "syntax_error", "runtime_error", "wrong_answer", "timeout", "budget", "memory",
              "output_limit", "skipped", "unsandboxed")
_FLOAT_TOL = 1e-6
_READY_TIMEOUT_S = 30.0
_REPLY_SLACK_S = 3.0  # per test, on top of the harness's own timeout
_HARNESS_SOURCE = inspect.getsource(harness)


class CodeInputError(UserError, ValueError):
    """A program or tests file that cannot be scored as given; the message names the fix."""


@dataclass(frozen=True)
class CodeScore:
    """Reward of one program. ``passed`` counts tests that ran and passed."""

    reward: float
    passed: int
    total: int
    flags: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CodeLimits:
    """What one program's tests may use; the defaults are a training run's."""

    # Per test: wall clock, and ceil() CPU seconds.
    timeout_s: float = 6.0
    # The per-program budget on summed test time (see program_budget_s).
    budget_per_test_s: float = 2.0
    budget_cap_s: float = 600.0
    # Address space per process.
    memory_mb: int = 1024
    # stdout / stderr per test.
    output_bytes: int = 8 << 20
    nproc: int = 32

    def __post_init__(self) -> None:
        for name in ("timeout_s", "budget_cap_s", "memory_mb", "output_bytes", "nproc"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CodeLimits.{name} must be positive, got {getattr(self, name)!r}")
        if self.budget_per_test_s < 0:
            raise ValueError(f"CodeLimits.budget_per_test_s must be >= 0, got {self.budget_per_test_s!r}")

    def program_budget_s(self, n_tests: int) -> float:
        """Seconds of summed test time one program may spend, for ``n_tests`` tests."""
        return min(self.budget_cap_s, self.timeout_s + self.budget_per_test_s * n_tests)


@dataclass(frozen=True)
class _Options:
    mode: Mode
    limits: CodeLimits
    sandbox: SandboxConfig


# --------------------------------------------------------------------------- code
def _syntax_ok(code: bytes) -> bool:
    try:
        compile(code, "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        return False
    return True


# -------------------------------------------------------------------------- tests
def _is_call(test: dict[str, Any]) -> bool:
    return bool(test.get("fn_name")) or test.get("type") == "function_call"


def _call_args(raw: Any) -> list[Any]:
    if isinstance(raw, str):  # LiveCodeBench: one JSON value per line
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    if isinstance(raw, (list, tuple)):
        return list(raw)
    raise TypeError(f"function-call test input must be a list of arguments, got {type(raw).__name__}")


def _stdin_text(raw: Any) -> str:
    if isinstance(raw, list):
        return "\n".join(map(str, raw)) + "\n"
    if not isinstance(raw, str):
        raise TypeError(f"stdin test input must be a string, got {type(raw).__name__}")
    return raw


def _request(index: int, test: dict[str, Any]) -> dict[str, Any]:
    if "input" not in test or "output" not in test:
        raise ValueError(f"test {index} needs 'input' and 'output' keys, got {sorted(test)}")
    if _is_call(test):
        if not test.get("fn_name"):
            raise ValueError(f"function-call test {index} has no fn_name")
        return {"i": index, "fn": str(test["fn_name"]), "args": _call_args(test["input"])}
    return {"i": index, "stdin": _stdin_text(test["input"])}


def _num(tok: str) -> float | None:
    try:
        value = float(tok)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _FLOAT_TOL * max(1.0, abs(b))


def _tokens_match(actual: str, expected: str) -> bool:
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if g == w:
            continue
        if not any(c in s for s in (g, w) for c in ".eE"):
            return False
        gv, wv = _num(g), _num(w)
        if gv is None or wv is None or not _close(gv, wv):
            return False
    return True


def _values_match(actual: Any, expected: Any) -> bool:
    if isinstance(expected, list) and isinstance(actual, list):
        return len(actual) == len(expected) and all(map(_values_match, actual, expected))
    if isinstance(expected, dict) and isinstance(actual, dict):
        return actual.keys() == expected.keys() and all(
            _values_match(actual[k], expected[k]) for k in expected)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (actual, expected))
    if numbers and (isinstance(actual, float) or isinstance(expected, float)):
        return _close(float(actual), float(expected))
    return bool(actual == expected)


def _expected_output(test: dict[str, Any]) -> Any:
    out = test["output"]
    if not _is_call(test) and isinstance(out, list):
        return "\n".join(map(str, out))
    return out


def _passes(test: dict[str, Any], out: bytes) -> bool:
    expected = _expected_output(test)
    if _is_call(test):
        try:
            actual = json.loads(out.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return False
        if _values_match(actual, expected):
            return True
        return isinstance(expected, list) and len(expected) == 1 and _values_match(actual, expected[0])
    return _tokens_match(out.decode("utf-8", errors="replace"), str(expected))


# ---------------------------------------------------------------------- scheduler
class _Program:
    """Per-program bookkeeping shared by the worker threads (guarded by the pool lock)."""

    def __init__(self, code: bytes | None, tests: Sequence[dict[str, Any]], budget_s: float) -> None:
        self.code = code
        self.tests = list(tests)
        self.budget_s = budget_s
        self.requests = [_request(i, t) for i, t in enumerate(self.tests)]
        self.outcome: list[str | None] = [None] * len(self.tests)  # "pass" or a flag name
        self.flags = dict.fromkeys(FLAG_NAMES, 0)
        self.dead = False  # all_pass: the reward is already 0
        self.spent_s = 0.0
        if code is None:
            self.flags["no_code"] = 1
            self.dead = True
        elif not _syntax_ok(code):
            self.flags["syntax_error"] = 1
            self.dead = True

    def score(self, mode: Mode) -> CodeScore:
        flags = dict(self.flags)
        passed = 0
        for outcome in self.outcome:
            if outcome == "pass":
                passed += 1
            elif outcome is not None:
                flags[outcome] += 1
            elif self.code is not None and flags["syntax_error"] == 0:
                flags["skipped"] += 1
        total = len(self.tests)
        if mode == "all_pass":
            reward = 1.0 if total and passed == total else 0.0
        else:
            reward = passed / total if total else 0.0
        return CodeScore(reward=reward, passed=passed, total=total, flags=flags)


def _session_limits(prog: _Program, limits: CodeLimits, n_tests: int) -> Limits:
    max_in = max((len(r.get("stdin", "")) * 4 for r in prog.requests), default=0)
    cap = limits.output_bytes
    budget = min(prog.budget_s, n_tests * limits.timeout_s)
    return Limits(
        wall_s=budget + n_tests * _REPLY_SLACK_S + _READY_TIMEOUT_S,
        cpu_s=int(budget + n_tests * (math.ceil(limits.timeout_s) + 2) + 10),
        memory_mb=limits.memory_mb,
        file_mb=max(cap, max_in) // (1 << 20) + 1,
        nproc=limits.nproc,
        stdout_bytes=n_tests * (cap * 4 // 3 + 8192) + 4096,  # base64 replies
        stderr_bytes=1 << 20,
        tmpfs_mb=(max_in + 4 * cap) // (1 << 20) + 32,
    )


class _HarnessError(RuntimeError):
    """The harness itself failed (never the program: it cannot reach the harness's channels)."""


def _run_chunk(prog: _Program, tests: list[int], opts: _Options, lock: threading.Lock) -> list[int]:
    """Run ``tests`` of ``prog`` in one sandbox start; returns tests left to retry."""
    limits = opts.limits
    proc: SandboxProcess = start_python(_HARNESS_SOURCE, limits=_session_limits(prog, limits, len(tests)),
                                        config=opts.sandbox, as_pid_1=True)
    assert prog.code is not None
    with proc:
        header = {"code": base64.b64encode(prog.code).decode(), "timeout": limits.timeout_s,
                  "out_cap": limits.output_bytes}
        proc.send(json.dumps(header).encode() + b"\n", _READY_TIMEOUT_S)
        ready = proc.read_line(_READY_TIMEOUT_S)
        if ready is None:
            res = proc.finish()
            raise _HarnessError(
                f"sandbox harness did not start (exit {res.returncode}, timed_out={res.timed_out}): "
                f"{res.stderr.decode(errors='replace').strip()[-500:]}")
        with lock:
            if not proc.isolated:
                prog.flags["unsandboxed"] = 1
        for pos, k in enumerate(tests):
            with lock:
                if prog.dead:
                    return []
                if prog.spent_s >= prog.budget_s:
                    for j in tests[pos:]:
                        prog.outcome[j] = "budget"
                    prog.dead = opts.mode == "all_pass"
                    return []
            req = json.dumps(prog.requests[k]).encode() + b"\n"
            reply_s = limits.timeout_s + _REPLY_SLACK_S + len(req) / 20e6
            line = proc.read_line(reply_s) if proc.send(req, reply_s) else None
            if line is None:
                # The sandbox died or hung mid-test: charge this test, retry the rest
                # in a fresh start so they are judged exactly as if run alone.
                flag = ("output_limit" if proc.output_limit else
                        "timeout" if proc.timed_out else "runtime_error")
                with lock:
                    prog.outcome[k] = flag
                    prog.spent_s += limits.timeout_s
                    prog.dead = prog.dead or opts.mode == "all_pass"
                return tests[pos + 1:]
            reply = json.loads(line)
            status = reply["status"]
            if status == "harness_error":
                raise _HarnessError(f"sandbox harness failed to set up test {k}: {reply['err'].strip()[-300:]}")
            if status == "ok":
                status = "pass" if _passes(prog.tests[k], base64.b64decode(reply["out"])) else "wrong_answer"
            elif status == "syntax_error":
                status = "runtime_error"  # parent compiled it: the sandbox's Python differs
            with lock:
                prog.outcome[k] = status
                prog.spent_s += float(reply["t"])
                if status != "pass" and opts.mode == "all_pass":
                    prog.dead = True
        return []


def _chunks(n_tests: int, parts: int) -> list[list[int]]:
    parts = max(1, min(parts, n_tests))
    size = math.ceil(n_tests / parts)
    return [list(range(i, min(i + size, n_tests))) for i in range(0, n_tests, size)]


def _workers(workers: int | None) -> int:
    if workers is not None:
        return max(1, workers)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _run_pool(progs: list[_Program], opts: _Options, workers: int) -> None:
    live = [i for i, p in enumerate(progs) if not p.dead and p.tests]
    if not live:
        return
    parts = math.ceil(workers / len(live)) if len(live) < workers else 1
    seq = itertools.count()
    # Chunks wait in (rank, program, seq) order: every program's first chunk, holding test 0,
    # starts before any program's later (speculative) chunk, and a retried chunk keeps its
    # rank. Each pool task takes the best waiting chunk when it starts, not when submitted.
    waiting: queue.PriorityQueue[tuple[int, int, int, list[int]]] = queue.PriorityQueue()
    for i in live:
        for rank, chunk in enumerate(_chunks(len(progs[i].tests), parts)):
            waiting.put((rank, i, next(seq), chunk))
    lock = threading.Lock()

    def run_best() -> tuple[int, int, list[int]]:
        rank, i, _, chunk = waiting.get_nowait()  # one task per waiting chunk: never empty
        return rank, i, _run_chunk(progs[i], chunk, opts, lock)

    with ThreadPoolExecutor(max_workers=min(workers, waiting.qsize()), thread_name_prefix="code-reward") as pool:
        running: set[Future[tuple[int, int, list[int]]]] = {pool.submit(run_best) for _ in range(waiting.qsize())}
        while running:
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                if future.exception() is not None:
                    for other in running:
                        other.cancel()  # chunks already in a sandbox finish; no new one starts
                    raise future.exception()  # type: ignore[misc]
                rank, i, retry = future.result()
                if retry:
                    waiting.put((rank, i, next(seq), retry))
                    running.add(pool.submit(run_best))


def _score(codes: Sequence[bytes | None], tests: Sequence[Sequence[dict[str, Any]]], opts: _Options,
           workers: int | None) -> list[CodeScore]:
    for t in tests:
        if not t:
            raise ValueError("a problem has no tests: drop it from the data set or add tests")
    require(opts.sandbox)  # fail closed before any work, even if no program would run
    progs = [_Program(c, t, opts.limits.program_budget_s(len(t))) for c, t in zip(codes, tests)]
    _run_pool(progs, opts, _workers(workers))
    return [p.score(opts.mode) for p in progs]


def _options(mode: str, limits: CodeLimits | None, sandbox: SandboxConfig | None) -> _Options:
    if mode not in ("pass_rate", "all_pass"):
        raise ValueError(f"mode must be 'pass_rate' or 'all_pass', got {mode!r}")
    return _Options(mode=mode, limits=limits or CodeLimits(), sandbox=sandbox or SandboxConfig())  # type: ignore[arg-type]


def _program_bytes(code: str | None) -> bytes | None:
    # What `python3 main.py` would read had the response's code been saved as a UTF-8 file.
    return None if code is None else code.encode("utf-8", "surrogatepass")


# ----------------------------------------------------------------------- public API
def score_code_batch(
    items: Iterable[tuple[str, list[dict[str, Any]]]],
    mode: Mode = "pass_rate",
    *,
    limits: CodeLimits | None = None,
    workers: int | None = None,
    sandbox: SandboxConfig | None = None,
) -> list[CodeScore]:
    """Score (response, tests) pairs; results in input order.

    ``limits`` defaults to ``CodeLimits()``; ``workers`` to the CPU count. Raises
    ``SandboxUnavailable`` (before running anything) if there is no working sandbox and
    ``sandbox.isolation`` is not "none".
    """
    pairs = list(items)
    opts = _options(mode, limits, sandbox)
    return _score([_program_bytes(last_python_block(r)) for r, _ in pairs], [t for _, t in pairs], opts, workers)


def score_code(
    response: str,
    tests: list[dict[str, Any]],
    mode: Mode = "pass_rate",
    *,
    limits: CodeLimits | None = None,
    workers: int | None = None,
    sandbox: SandboxConfig | None = None,
) -> CodeScore:
    """Score one model response against ``tests``; see ``score_code_batch``."""
    return score_code_batch([(response, tests)], mode, limits=limits, workers=workers, sandbox=sandbox)[0]


_JSON_NAMES = {dict: "object", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
_TESTS_SHAPES = ('a list of {"input", "output"[, "fn_name"]} objects, {"tests": [...]}, '
                 'or APPS-style {"inputs", "outputs"[, "fn_name"]}')


def _load_tests(raw: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(raw, dict) and "tests" in raw:
        raw = raw["tests"]
    if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw:  # APPS/TACO layout
        if not isinstance(raw["inputs"], list) or not isinstance(raw["outputs"], list):
            raise CodeInputError(f"{where}: 'inputs' and 'outputs' must be lists: write {_TESTS_SHAPES}")
        fn = raw.get("fn_name")
        raw = [{"input": i, "output": o, **({"fn_name": fn} if fn else {})}
               for i, o in zip(raw["inputs"], raw["outputs"])]
    if not isinstance(raw, list) or not raw:
        got = "an empty list" if raw == [] else f"a JSON {_JSON_NAMES.get(type(raw), type(raw).__name__)}"
        raise CodeInputError(f"{where} holds {got}: write {_TESTS_SHAPES}")
    for index, test in enumerate(raw):
        if not isinstance(test, dict) or "input" not in test or "output" not in test:
            keys = sorted(test) if isinstance(test, dict) else type(test).__name__
            raise CodeInputError(f"{where}: test {index} needs 'input' and 'output' keys, got {keys}: "
                                 f"write {_TESTS_SHAPES}")
        try:
            _request(index, test)
        except (TypeError, ValueError) as err:
            raise CodeInputError(f"{where}: {err}") from None
    return raw


def _read_file(path: str, what: str) -> bytes:
    if os.path.isdir(path):
        raise CodeInputError(f"{what} {path} is a folder: pass the file itself")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CodeInputError(f"{what} {path} does not exist") from None
    except OSError as err:
        raise CodeInputError(f"{what} {path} cannot be read ({err.strerror})") from None


def read_program(path: str) -> bytes:
    """A Python source file's bytes; ``CodeInputError`` if it is not source text at all."""
    data = _read_file(path, "program")
    if b"\0" in data:
        raise CodeInputError(f"program {path} is a binary file (it holds NUL bytes): pass a Python source file")
    try:
        encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
        data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as err:
        raise CodeInputError(f"program {path} is not Python source text ({err}): pass a UTF-8 "
                             "(or coding-declared) Python source file") from None
    return data


def read_tests(path: str) -> list[dict[str, Any]]:
    """A tests file for ``gridrun reward code``; ``CodeInputError`` naming the fix if malformed."""
    data = _read_file(path, "tests file")
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise CodeInputError(f"tests file {path} is not UTF-8 text (a binary file?): pass a JSON file") from None
    except json.JSONDecodeError as err:
        raise CodeInputError(f"tests file {path} is not valid JSON ({err}): write {_TESTS_SHAPES}") from None
    return _load_tests(raw, f"tests file {path}")


def score_program_json(program_path: str, tests_path: str, mode: Mode = "pass_rate",
                       sandbox: SandboxConfig | None = None, limits: CodeLimits | None = None) -> dict[str, Any]:
    """Score a plain program file (not a model response) for ``gridrun reward code``.

    Returns ``{"reward", "passed", "total", "flags"}``; bad files raise ``CodeInputError``.
    """
    code = read_program(program_path)
    tests = read_tests(tests_path)
    score = _score([code], [tests], _options(mode, limits, sandbox), None)[0]
    return {"reward": score.reward, "passed": score.passed, "total": score.total, "flags": score.flags}
