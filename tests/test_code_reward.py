"""Tests for gridrun.tasks.code_reward: fixtures in both test formats and modes, the
pool == one sandbox start per test, programs judged as `python3 main.py` would be,
and adversarial programs (each: reward 0, the right flag, bounded wall time, healthy
parent; their containment is tests/test_sandbox.py's). Tests that run the real sandbox are marked `sandbox` (skipped, saying why,
without bubblewrap); input errors and fail-closed checks run everywhere."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gridrun.tasks import sandbox
from gridrun.tasks.code_reward import (
    FLAG_NAMES,
    CodeLimits,
    CodeScore,
    score_code,
    score_code_batch,
    score_program_json,
)
from gridrun.tasks.sandbox import SandboxConfig, SandboxUnavailable
from tests.conftest import wait_until

needs_sandbox = pytest.mark.sandbox
FIXTURES = Path(__file__).parent / "fixtures" / "code_problems.jsonl"
PROBLEMS = [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]
ISOLATED = SandboxConfig()
FALLBACK = SandboxConfig(isolation="none")
ONE_TEST = [{"input": "1 2\n", "output": "3\n"}]
TWO_TESTS = ONE_TEST + [{"input": "2 2\n", "output": "4\n"}]
FAST: dict[str, Any] = {"limits": CodeLimits(timeout_s=1.0, memory_mb=256, output_bytes=1 << 20, nproc=16),
                        "sandbox": ISOLATED}


def fenced(code: str) -> str:
    return f"Let me think.\n```python\n{code}\n```\nDone."


def _only(score: CodeScore, **expected: int) -> None:
    got = {k: v for k, v in score.flags.items() if v}
    assert got == expected, score


def _harness_procs() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"gridrun-harness" in f.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            pass
    return found


def _assert_healthy() -> None:
    deadline = time.monotonic() + 2.0
    while _harness_procs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _harness_procs() == [], "sandboxed processes outlived their sandbox"
    ok = score_code(fenced("a, b = map(int, input().split())\nprint(a + b)"), ONE_TEST, **FAST)
    assert ok.reward == 1.0


def _adversarial(code: str, tests: list[dict[str, Any]] = ONE_TEST, max_s: float = 6.0,
                 **kw: Any) -> CodeScore:
    t0 = time.monotonic()
    score = score_code(fenced(code), tests, **{**FAST, **kw})
    assert time.monotonic() - t0 < max_s
    assert score.reward == 0.0 and score.passed == 0
    return score


@needs_sandbox
def test_no_code_and_syntax_error_skip_the_sandbox() -> None:
    t0 = time.monotonic()
    none = score_code("I don't know.", TWO_TESTS, **FAST)
    bad = score_code(fenced("def f(:\n    pass"), TWO_TESTS, **FAST)
    assert time.monotonic() - t0 < 0.5
    assert none == CodeScore(0.0, 0, 2, {**dict.fromkeys(FLAG_NAMES, 0), "no_code": 1})
    assert bad.reward == 0.0 and bad.flags["syntax_error"] == 1 and bad.flags["skipped"] == 0


@needs_sandbox
def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="no tests"):
        score_code(fenced("print(1)"), [], **FAST)
    with pytest.raises(ValueError, match="mode"):
        score_code(fenced("print(1)"), ONE_TEST, mode="mean", **FAST)  # type: ignore[arg-type]


# --------------------------------------------------------------------- fixtures
def _fixture_items() -> tuple[list[tuple[str, list[dict[str, Any]]]], list[tuple[str, str, float]]]:
    items, expected = [], []
    for prob in PROBLEMS:
        for sol in prob["solutions"]:
            items.append((fenced(sol["code"]), prob["tests"]))
            expected.append((prob["name"], sol["label"], sol["pass_rate"]))
    return items, expected


@needs_sandbox
@pytest.mark.parametrize("mode", ["pass_rate", "all_pass"])
def test_fixture_solutions_get_expected_rewards(mode: str) -> None:
    items, expected = _fixture_items()
    scores = score_code_batch(items, mode, limits=CodeLimits(timeout_s=2.0), sandbox=ISOLATED)  # type: ignore[arg-type]
    for (name, label, rate), score in zip(expected, scores):
        want = rate if mode == "pass_rate" else float(rate == 1.0)
        assert score.reward == pytest.approx(want), (name, label, score)
        assert score.total == len(next(p for p in PROBLEMS if p["name"] == name)["tests"])
        assert score.flags["unsandboxed"] == 0
        if mode == "pass_rate":
            assert score.flags["skipped"] == 0 and score.passed == round(rate * score.total)


def test_both_test_formats_are_covered() -> None:
    kinds = {("fn_name" in t) for p in PROBLEMS for t in p["tests"]}
    assert kinds == {True, False}
    assert any("class Solution" in s["code"] for p in PROBLEMS for s in p["solutions"])


@needs_sandbox
def test_pool_matches_one_sandbox_per_test() -> None:
    items, _ = _fixture_items()
    items = [it for it in items if it[1] in (PROBLEMS[0]["tests"], PROBLEMS[3]["tests"])]
    limits = CodeLimits(timeout_s=2.0)
    pooled = score_code_batch(items, "pass_rate", limits=limits, sandbox=ISOLATED)
    # The baseline: every test of every program alone in its own sandbox start, one at a time.
    alone = score_code_batch([(r, [t]) for r, tests in items for t in tests], "pass_rate", limits=limits,
                             workers=1, sandbox=ISOLATED)
    per_program = ("no_code", "syntax_error", "unsandboxed")
    at = 0
    for (_, tests), score in zip(items, pooled):
        mine, at = alone[at : at + len(tests)], at + len(tests)
        assert score.reward == sum(s.passed for s in mine) / len(tests)
        assert score.flags == {k: (max if k in per_program else sum)(s.flags[k] for s in mine) for k in FLAG_NAMES}


@needs_sandbox
def test_all_pass_drops_a_failing_program_after_one_test() -> None:
    tests = [{"input": f"{i} 1\n", "output": f"{i + 1}\n"} for i in range(6)]
    score = score_code(fenced("print(-1)"), tests, "all_pass", workers=1, **{**FAST, "sandbox": ISOLATED})
    _only(score, wrong_answer=1, skipped=5)


@needs_sandbox
def test_score_program_json(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("a, b = map(int, input().split())\nprint(a * b if a == 2 else a + b)\n")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps(TWO_TESTS))
    out = score_program_json(str(prog), str(tests), "pass_rate")
    assert out == {"reward": 1.0, "passed": 2, "total": 2, "flags": dict.fromkeys(FLAG_NAMES, 0)}
    tests.write_text(json.dumps({"inputs": ["1 2\n", "3 3\n"], "outputs": ["3\n", "7\n"]}))  # APPS layout
    out = score_program_json(str(prog), str(tests), "all_pass")
    assert out["reward"] == 0.0 and out["flags"]["wrong_answer"] == 1


@needs_sandbox
def test_reward_code_scores_with_a_cells_own_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a + b printed as a * b: right on "2 2" -> 4, wrong on "1 2" -> 3, so 1 of 2 tests pass.
    # A released cell (all_pass, the default) scores 0.0; a cell with as_written's pass_rate 0.5.
    from gridrun.cli import main
    from tests.conftest import make_cell

    prog = tmp_path / "prog.py"
    prog.write_text("a, b = map(int, input().split())\nprint(a * b)\n")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps(TWO_TESTS))
    assert TWO_TESTS == [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}]
    released = make_cell(tmp_path, "released", task={"name": "code", "data_path": str(tmp_path)})
    as_written = make_cell(tmp_path, "as_written", task={"name": "code", "data_path": str(tmp_path),
                                                         "code_reward_mode": "pass_rate", "code_test_timeout_s": 6.0})
    rewards = {}
    for cell in (released, as_written):
        assert main(["reward", "code", "--file", str(prog), "--tests", str(tests), "--cell", str(cell)]) == 0
        rewards[cell.name] = json.loads(capsys.readouterr().out)["reward"]
    assert rewards == {"released": 0.0, "as_written": 0.5}
    assert main(["reward", "code", "--file", str(prog), "--tests", str(tests), "--cell", str(released),
                 "--mode", "pass_rate"]) == 2
    assert "drop --mode" in capsys.readouterr().err


def test_no_torch_import() -> None:
    code = "import sys, gridrun.tasks.code_reward, gridrun.tasks.sandbox; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ adversarial
# Containment (writes outside, the environment, the network, fork bombs) is the sandbox's
# and tested once, in tests/test_sandbox.py. Here: each attack gets its flag and reward 0 in
# bounded time, and leaves the harness healthy for the next program.
@needs_sandbox
def test_infinite_loop_times_out() -> None:
    _only(_adversarial("while True:\n    pass"), timeout=1)
    _assert_healthy()


@needs_sandbox
def test_ignoring_sigterm_times_out() -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)"
    _only(_adversarial(code), timeout=1)
    _assert_healthy()


@needs_sandbox
def test_memory_bomb_is_flagged_memory() -> None:
    _only(_adversarial("x = [bytearray(1 << 24) for _ in range(10**6)]"), memory=1)
    _assert_healthy()


@needs_sandbox
def test_printing_a_gigabyte_hits_output_limit() -> None:
    code = "import sys\nfor _ in range(1024):\n    sys.stdout.write('3' * (1 << 20))"
    _only(_adversarial(code), output_limit=1)
    _assert_healthy()


@needs_sandbox
def test_killing_its_parent_does_not_stop_the_harness() -> None:
    # Each test still runs (wrong answer twice): the harness is PID 1 of its namespace.
    code = ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
            "except ProcessLookupError:\n    pass  # nothing else to kill: init and the caller are exempt\nprint('x')")
    _only(_adversarial(code, TWO_TESTS, workers=1), wrong_answer=2)
    _assert_healthy()


@needs_sandbox
def test_output_that_is_correct_but_exits_nonzero_fails() -> None:
    _only(_adversarial("print(3)\nraise SystemExit(1)"), runtime_error=1)


# ---------------------------------------------------------------------- opt-out
@needs_sandbox
def test_opt_out_warns_flags_and_enforces_rlimits(caplog: pytest.LogCaptureFixture) -> None:
    sandbox._warned.clear()
    kw = {**FAST, "sandbox": FALLBACK}
    with caplog.at_level(logging.WARNING, logger="gridrun.tasks.sandbox"):
        ok = score_code(fenced("a, b = map(int, input().split())\nprint(a + b)"), TWO_TESTS, **kw)
        mem = score_code(fenced("x = bytearray(4 << 30)"), ONE_TEST, **kw)
        loop = score_code(fenced("while True:\n    pass"), ONE_TEST, **kw)
        # Without a PID namespace the program can kill the harness: that test fails, the rest still run.
        killer = score_code(fenced("import os\nos.kill(os.getppid(), 9)"), TWO_TESTS, workers=1, **kw)
    assert sum("WITHOUT ISOLATION" in r.getMessage() for r in caplog.records) == 1
    assert ok.reward == 1.0 and ok.flags["unsandboxed"] == 1
    _only(mem, memory=1, unsandboxed=1)
    _only(loop, timeout=1, unsandboxed=1)
    _only(killer, runtime_error=2, unsandboxed=1)


def test_missing_sandbox_refuses_before_anything_runs(tmp_path: Path) -> None:
    # Fails closed even for a batch in which no program would reach the sandbox (no code).
    missing = SandboxConfig(bwrap="/nonexistent/bwrap")
    marker = tmp_path / "ran"
    for response in (fenced(f"open({str(marker)!r}, 'w').write('x')"), "no code at all"):
        with pytest.raises(SandboxUnavailable) as err:
            score_code(response, ONE_TEST, sandbox=missing)
        assert "\n" not in str(err.value) and "apt-get install bubblewrap" in str(err.value)
    assert not marker.exists()


# ------------------------------------------------------- judged like python3 main.py
# (program, flag or "pass"): stdin "1 2", expected output "3". Each verdict is what plain
# `python3 main.py` makes of it (checked against a real run below): exit status 0 and the
# right output pass; anything else fails, with the program's own status, whatever it is.
LIKE_PYTHON = [
    ("\ufeffa, b = map(int, input().split())\nprint(a + b)", "pass"),  # a BOM is not a syntax error
    ("import sys\nprint(3)\nsys.stdout.close()", "pass"),  # a closed stdout is not flushed at exit
    ("import sys\nprint(3)\nsys.exit(0)", "pass"),
    ("import sys\nprint(3)\nsys.exit(256)", "pass"),  # the kernel keeps the low byte: status 0
    ("import atexit\natexit.register(print, 3)", "pass"),  # exit handlers run, as at interpreter exit
    ("import threading, time\ndef late():\n    time.sleep(0.1)\n    print(3)\nthreading.Thread(target=late).start()",
     "pass"),  # non-daemon threads are joined before exit
    ("import sys\nprint(3)\nsys.exit(97)", "runtime_error"),  # 97 is the program's, not the harness's
    ("import os, sys\nprint(3)\nsys.stdout.flush()\nos._exit(97)", "runtime_error"),
    ("import os\nprint(3)\nos._exit(0)", "wrong_answer"),  # the buffered 3 is lost, as with a pipe
    ("import os\nprint(3)\nos.close(1)", "runtime_error"),  # the flush at exit fails: status 120
    ("import sys\nprint(3)\nsys.exit('bye')", "runtime_error"),  # a message: printed, status 1
]


def _plain_python(code: str, stdin: str, folder: Path) -> tuple[int, str]:
    main = folder / "main.py"
    main.write_bytes(code.encode("utf-8"))
    out = subprocess.run([sys.executable, "-I", str(main)], input=stdin.encode(), capture_output=True,
                         timeout=10, check=False, cwd=folder)
    return out.returncode, out.stdout.decode()


@needs_sandbox
def test_programs_are_judged_as_plain_python_judges_them(tmp_path: Path) -> None:
    scores = score_code_batch([(fenced(code), ONE_TEST) for code, _ in LIKE_PYTHON], **FAST)
    for (code, verdict), score in zip(LIKE_PYTHON, scores):
        status, out = _plain_python(code, ONE_TEST[0]["input"], tmp_path)
        assert (status == 0 and out.split() == ["3"]) == (verdict == "pass"), (code, status, out)
        if verdict == "pass":
            assert score.reward == 1.0, (code, score)
        else:
            _only(score, **{verdict: 1})


@needs_sandbox
def test_each_test_starts_with_an_empty_tmp() -> None:
    # As if every test ran alone: a file left by test 0 is gone in test 1 (which would print
    # "again"), and the harness's stdin file, replaced by a folder, does not break test 1.
    code = ("import os, tempfile\nseen = os.path.join(tempfile.gettempdir(), 'seen')\n"
            "if os.path.exists(seen):\n    print('again')\nelse:\n    open(seen, 'w').close()\n"
            "    a, b = map(int, input().split())\n    print(a + b)\n"
            "stdin_file = os.path.join(tempfile.gettempdir(), 'gridrun-harness.in')\n"
            "os.unlink(stdin_file)\nos.mkdir(stdin_file)\n")
    score = score_code(fenced(code), TWO_TESTS, workers=1, **FAST)
    assert (score.reward, score.passed) == (1.0, 2), score


@needs_sandbox
def test_status_97_in_a_batch_loses_no_result() -> None:
    # Once a reserved harness status: a batch holding such a program crashed as a whole.
    good = fenced("a, b = map(int, input().split())\nprint(a + b)")
    scores = score_code_batch([(good, TWO_TESTS)] * 3 + [(fenced("raise SystemExit(97)"), TWO_TESTS)]
                              + [(good, TWO_TESTS)] * 4, **FAST)
    assert [s.reward for s in scores] == [1.0] * 3 + [0.0] + [1.0] * 4
    _only(scores[3], runtime_error=2)


def test_budget_scales_with_the_tests_up_to_its_cap() -> None:
    # timeout + 2 s per test, capped at 600 s: 6 + 2 * 10 = 26 s; the cap binds from
    # 6 + 2n >= 600, i.e. n = 297 tests; 10,000 tests get the cap.
    limits = CodeLimits()
    assert limits.program_budget_s(10) == 26.0
    assert limits.program_budget_s(296) == 598.0 and limits.program_budget_s(297) == 600.0
    assert limits.program_budget_s(10_000) == 600.0
    assert CodeLimits(timeout_s=1.0, budget_per_test_s=0.2).program_budget_s(3) == pytest.approx(1.6)


def test_limits_refuse_a_non_positive_timeout() -> None:
    with pytest.raises(ValueError, match="CodeLimits.timeout_s must be positive, got 0"):
        CodeLimits(timeout_s=0)


@needs_sandbox
def test_spent_budget_is_flagged_budget_not_timeout() -> None:
    # Each test sleeps 0.8 s (well under its 1 s timeout) and passes. Budget: 1 + 0.2 * 5 =
    # 2 s. Tests 0-2 start with 0, ~0.85 and ~1.7 s spent; test 3 would start at ~2.5 s, past
    # the budget, so tests 3 and 4 are flagged budget: 3 of 5 passed.
    tests = [{"input": "1 2\n", "output": "3\n"}] * 5
    code = "import time\ntime.sleep(0.8)\na, b = map(int, input().split())\nprint(a + b)"
    score = score_code(fenced(code), tests, workers=1, sandbox=ISOLATED,
                       limits=dataclasses.replace(FAST["limits"], budget_per_test_s=0.2))
    assert (score.passed, score.reward) == (3, 0.6)
    _only(score, budget=2)


# --------------------------------------------------------- the scorer's own processes
def _pids_named(name: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == name:
                    found.append(int(pid))
        except (OSError, ValueError):
            pass
    return found


def _named(name: str, body: str) -> str:
    """A program that renames its process (visible in /proc/PID/comm outside) and runs ``body``."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n{body}"


@needs_sandbox
def test_killing_the_scorer_kills_its_sandbox_at_once(tmp_path: Path) -> None:
    # As root the program runs under another uid, which the kernel's die-with-parent signal
    # cannot reach: the harness must notice its stdin closing.
    name = f"grk{os.getpid() % 10**6}"
    code = _named(name, "import time\ntime.sleep(60)")
    scorer = subprocess.Popen([sys.executable, "-c", (
        "from gridrun.tasks.code_reward import CodeLimits, score_code\n"
        f"score_code({fenced(code)!r}, [{{'input': '', 'output': '3'}}], limits=CodeLimits(timeout_s=50.0))\n")])
    try:
        wait_until(lambda: _pids_named(name), "the sandboxed program to start", timeout=20, poll=0.05)
        scorer.kill()
        scorer.wait()
        t0 = time.monotonic()
        wait_until(lambda: not _pids_named(name), "the sandbox to die with its scorer", timeout=5, poll=0.02)
        assert time.monotonic() - t0 < 1.0
    finally:
        scorer.kill()
        for pid in _pids_named(name):
            os.kill(pid, 9)


@needs_sandbox
def test_a_daemon_left_behind_dies_with_its_test() -> None:
    name = f"grd{os.getpid() % 10**6}"
    code = _named(name, "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
                        "    os._exit(0)\nprint(3)")
    score = score_code(fenced(code), ONE_TEST, **FAST)
    assert score.reward == 1.0  # the answer is right; the daemon must still be gone
    assert _pids_named(name) == []


@needs_sandbox
def test_tests_file_cannot_be_found_through_proc(tmp_path: Path) -> None:
    # The exploit from the field: find the scorer's command line in /proc, read the tests
    # file it names and print the expected output. Sandboxed there is no /proc and no host
    # filesystem: wrong answer. --no-sandbox gives exactly that up (reward 1, flagged).
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import json, os\nfound = None\ntry:\n    pids = os.listdir('/proc')\nexcept OSError:\n    pids = []\n"
        "for pid in pids:\n    try:\n        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        "    except OSError:\n        continue\n    if b'--tests' in argv:\n"
        "        found = json.load(open(argv[argv.index(b'--tests') + 1]))[0]['output']\n"
        "print(found)\n")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps([{"input": "", "output": "secret-7781"}]))
    argv = [sys.executable, "-m", "gridrun.cli", "reward", "code", "--file", str(prog), "--tests", str(tests)]
    sandboxed = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert sandboxed["reward"] == 0.0 and sandboxed["flags"]["wrong_answer"] == 1
    opted_out = subprocess.run([*argv, "--no-sandbox"], capture_output=True, text=True, check=True)
    assert json.loads(opted_out.stdout)["reward"] == 1.0 and json.loads(opted_out.stdout)["flags"]["unsandboxed"] == 1
    assert "WITHOUT ISOLATION" in opted_out.stderr


# ------------------------------------------------- `gridrun reward code`: one-line errors
@pytest.mark.parametrize("content, expected", [
    (b'{"input": "1", "output": "1"}', "holds a JSON object"),
    (b'"1 2"', "holds a JSON string"),
    (b"[]", "holds an empty list"),
    (b'[{"input": "1"}]', "test 0 needs 'input' and 'output' keys, got ['input']"),
    (b'[{"input": "1", "output": "1"}, 5]', "test 1 needs 'input' and 'output' keys, got int"),
    (b'[{"input": "1", "output": "1"', "is not valid JSON"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not UTF-8 text"),
    (b'[{"input": 5, "output": "1"}]', "stdin test input must be a string, got int"),
], ids=["object", "string", "empty", "missing-key", "not-an-object", "bad-json", "binary", "bad-input"])
def test_reward_code_malformed_tests_file_is_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("print(1)\n")
    tests = tmp_path / "tests.json"
    tests.write_bytes(content)
    _assert_one_line_error(["--file", str(prog), "--tests", str(tests)], f"tests file {tests}", expected)


def test_reward_code_bad_program_or_folder_is_one_line(tmp_path: Path) -> None:
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps(ONE_TEST))
    binary = tmp_path / "prog.py"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    _assert_one_line_error(["--file", str(binary), "--tests", str(tests)], f"program {binary}", "binary file")
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"print('\xe9')\n")  # not UTF-8 and no coding cookie: python3 refuses it too
    _assert_one_line_error(["--file", str(latin), "--tests", str(tests)], f"program {latin}", "not Python source")
    good = tmp_path / "good.py"
    good.write_text("print(3)\n")
    _assert_one_line_error(["--file", str(good), "--tests", str(tmp_path)], f"tests file {tmp_path}",
                           "is a folder: pass the file itself")


def _assert_one_line_error(args: list[str], subject: str, expected: str) -> None:
    res = subprocess.run([sys.executable, "-m", "gridrun.cli", "reward", "code", *args],
                         capture_output=True, text=True, check=False, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"gridrun: error: {subject}") and expected in lines[0], lines[0]
