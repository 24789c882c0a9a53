"""Tests for gridrun.tasks.code_reward: extraction, fixtures in both test formats and
modes, scheduler == per-test baseline, programs judged as `python3 main.py` would be,
and adversarial programs (each: contained, reward 0, the right flag, bounded wall time,
healthy parent). Every test here runs the real sandbox (marker `sandbox`)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gridrun.tasks import sandbox
from gridrun.tasks.code_reward import (
    FLAG_NAMES,
    CodeScore,
    extract_code,
    score_code,
    score_code_batch,
    score_program_json,
)
from gridrun.tasks.sandbox import SandboxConfig, SandboxUnavailable

pytestmark = pytest.mark.sandbox

FIXTURES = Path(__file__).parent / "fixtures" / "code_problems.jsonl"
PROBLEMS = [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]
ISOLATED = SandboxConfig()
FALLBACK = SandboxConfig(isolation="none")
ONE_TEST = [{"input": "1 2\n", "output": "3\n"}]
TWO_TESTS = ONE_TEST + [{"input": "2 2\n", "output": "4\n"}]
FAST: dict[str, Any] = {"timeout_s": 1.0, "memory_mb": 256, "output_bytes": 1 << 20, "nproc": 16, "sandbox": ISOLATED}


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


# ------------------------------------------------------------------ extraction
def test_extract_last_python_block() -> None:
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```text\nnot code\n```\n"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("a\n```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("no code here") is None
    assert extract_code("```python\nprint(4)\n") is None  # truncated, no closing fence
    assert extract_code("```cpp\nint main(){}\n```") is None


def test_no_code_and_syntax_error_skip_the_sandbox() -> None:
    t0 = time.monotonic()
    none = score_code("I don't know.", TWO_TESTS, **FAST)
    bad = score_code(fenced("def f(:\n    pass"), TWO_TESTS, **FAST)
    assert time.monotonic() - t0 < 0.5
    assert none == CodeScore(0.0, 0, 2, {**dict.fromkeys(FLAG_NAMES, 0), "no_code": 1})
    assert bad.reward == 0.0 and bad.flags["syntax_error"] == 1 and bad.flags["skipped"] == 0


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


@pytest.mark.parametrize("mode", ["pass_rate", "all_pass"])
def test_fixture_solutions_get_expected_rewards(mode: str) -> None:
    items, expected = _fixture_items()
    scores = score_code_batch(items, mode, timeout_s=2.0, sandbox=ISOLATED)  # type: ignore[arg-type]
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


def test_scheduler_matches_per_test_baseline() -> None:
    items, _ = _fixture_items()
    items = [it for it in items if it[1] in (PROBLEMS[0]["tests"], PROBLEMS[3]["tests"])]
    fast = score_code_batch(items, "pass_rate", timeout_s=2.0, sandbox=ISOLATED)
    slow = score_code_batch(items, "pass_rate", timeout_s=2.0, sandbox=ISOLATED, strategy="per_test")
    assert [s.reward for s in fast] == [s.reward for s in slow]
    assert [s.flags for s in fast] == [s.flags for s in slow]


def test_all_pass_drops_a_failing_program_after_one_test() -> None:
    tests = [{"input": f"{i} 1\n", "output": f"{i + 1}\n"} for i in range(6)]
    score = score_code(fenced("print(-1)"), tests, "all_pass", workers=1, **{**FAST, "sandbox": ISOLATED})
    _only(score, wrong_answer=1, skipped=5)


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


def test_no_torch_import() -> None:
    code = "import sys, gridrun.tasks.code_reward, gridrun.tasks.sandbox; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ adversarial
def test_infinite_loop_times_out() -> None:
    _only(_adversarial("while True:\n    pass"), timeout=1)
    _assert_healthy()


def test_ignoring_sigterm_times_out() -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)"
    _only(_adversarial(code), timeout=1)
    _assert_healthy()


def test_fork_bomb_times_out_and_leaves_nothing() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    _only(_adversarial(code, max_s=8.0), timeout=1)
    _assert_healthy()


def test_memory_bomb_is_flagged_memory() -> None:
    _only(_adversarial("x = [bytearray(1 << 24) for _ in range(10**6)]"), memory=1)
    _assert_healthy()


def test_write_outside_sandbox_fails(tmp_path: Path) -> None:
    targets = [tmp_path / "pwned", Path("/etc/gridrun-pwned")]
    code = "for p in %r:\n    open(p, 'w').write('x')\nprint(3)" % [str(t) for t in targets]
    _only(_adversarial(code), runtime_error=1)
    for target in targets:
        assert not target.exists()
    _assert_healthy()


def test_environment_secret_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "wandb-secret-4b1d"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    code = "import os\nprint(os.environ.get('WANDB_API_KEY', 'missing'))"
    _only(_adversarial(code, [{"input": "", "output": secret}]), wrong_answer=1)
    _assert_healthy()


def test_socket_to_host_gets_no_connection() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.3)
    try:
        code = "import socket\ns = socket.create_connection(('127.0.0.1', %d), timeout=1)\ns.sendall(b'x')\nprint(3)"
        _only(_adversarial(code % listener.getsockname()[1]), runtime_error=1)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    _assert_healthy()


def test_printing_a_gigabyte_hits_output_limit() -> None:
    code = "import sys\nfor _ in range(1024):\n    sys.stdout.write('3' * (1 << 20))"
    _only(_adversarial(code), output_limit=1)
    _assert_healthy()


def test_killing_its_parent_does_not_stop_the_harness() -> None:
    # Each test still runs (wrong answer twice): the harness is PID 1 of its namespace.
    code = ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
            "except ProcessLookupError:\n    pass  # nothing else to kill: init and the caller are exempt\nprint('x')")
    _only(_adversarial(code, TWO_TESTS, workers=1), wrong_answer=2)
    _assert_healthy()


def test_output_that_is_correct_but_exits_nonzero_fails() -> None:
    _only(_adversarial("print(3)\nraise SystemExit(1)"), runtime_error=1)


# ---------------------------------------------------------------------- opt-out
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
