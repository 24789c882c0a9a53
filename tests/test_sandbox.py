"""Containment tests for gridrun.tasks.sandbox, and fail-closed behaviour without it.

Tests marked `sandbox` need bubblewrap (apt-get install bubblewrap) and skip, saying why,
where it cannot isolate. Each adversarial program is checked for containment, a bounded
wall time and a healthy parent (no leftover sandbox processes; the next sandbox still works).
The fail-closed tests run everywhere: they make bubblewrap missing or broken on purpose.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gridrun.tasks import sandbox
from gridrun.tasks.sandbox import Limits, SandboxConfig, SandboxUnavailable, run, run_python

needs_sandbox = pytest.mark.sandbox

ISOLATED = SandboxConfig()  # fails with the fix if bwrap cannot run
FALLBACK = SandboxConfig(isolation="none")
FAST = Limits(wall_s=3.0, cpu_s=2, memory_mb=256, nproc=16, stdout_bytes=1 << 20)


def _procs_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _assert_healthy(marker: str) -> None:
    deadline = time.monotonic() + 2.0
    while _procs_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(marker) == [], "sandbox processes outlived the sandbox"
    again = run_python("print('still ok')", limits=FAST, config=ISOLATED)
    assert again.ok and again.stdout == b"still ok\n"


@needs_sandbox
def test_runs_isolated_as_unprivileged_user_without_proc() -> None:
    res = run_python("import os\nprint(os.getuid(), os.path.exists('/proc/1'), os.getcwd())",
                     limits=FAST, config=ISOLATED)
    assert res.ok and res.isolated
    uid, has_proc, cwd = res.stdout.decode().split()
    assert int(uid) != 0 and has_proc == "False" and cwd == "/tmp"


@needs_sandbox
def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"WANDB_API_KEY": "wandb-s3cret-123", "HF_TOKEN": "hf_s3cret", "AWS_SECRET_ACCESS_KEY": "aws-s3cret"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    res = run_python("import os\nprint(dict(os.environ))", limits=FAST, config=ISOLATED)
    assert res.ok
    for key, value in secrets.items():
        assert key.encode() not in res.stdout and value.encode() not in res.stdout
    fallback = run_python("import os\nprint(dict(os.environ))", limits=FAST, config=FALLBACK)
    assert b"s3cret" not in fallback.stdout


@needs_sandbox
def test_timeout_sigkills_group_even_if_sigterm_ignored() -> None:
    marker = "gridrun-test-sigterm-7f3a"
    src = ("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "if os.fork() == 0:\n    os.setsid()\n"
           f"    os.execv('/bin/sleep', ['sleep', '1000', '{marker}'])\n"
           "while True:\n    time.sleep(0.05)\n")
    t0 = time.monotonic()
    res = run_python(src, limits=Limits(wall_s=1.0), config=ISOLATED)
    assert time.monotonic() - t0 < 4.0
    assert res.timed_out and res.returncode == -9
    _assert_healthy(marker)  # the detached sleeper died with the sandbox


@needs_sandbox
def test_stdout_cap_kills_a_gigabyte_printer() -> None:
    t0 = time.monotonic()
    res = run_python("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n",
                     limits=Limits(wall_s=20.0, stdout_bytes=1 << 20), config=ISOLATED)
    assert time.monotonic() - t0 < 5.0
    assert res.output_limit and not res.ok and len(res.stdout) == 1 << 20
    _assert_healthy("gridrun-none")


@needs_sandbox
def test_writes_outside_the_sandbox_fail(tmp_path: Path) -> None:
    targets = [tmp_path / "pwned", Path("/etc/gridrun-pwned"), Path(os.getcwd()) / "gridrun-pwned"]
    src = "import sys\nfor p in sys.argv[1:]:\n    try:\n        open(p, 'w').write('x')\n" \
          "        print('WROTE', p)\n    except OSError as e:\n        print('denied', p, e.errno)\n"
    res = run([sandbox._python(ISOLATED), "-I", "-c", src, *map(str, targets)], limits=FAST, config=ISOLATED)
    assert res.returncode == 0 and b"WROTE" not in res.stdout
    for target in targets:
        assert not target.exists()


@needs_sandbox
def test_cannot_remount_read_only_binds() -> None:
    # Regression: with capabilities left, root inside could `mount -o remount,rw` the
    # host's filesystem and write through it.
    res = run(["/bin/sh", "-c", "mount -o remount,rw,bind /usr 2>&1; touch /usr/gridrun-pwned 2>&1; echo done"],
              limits=FAST, config=ISOLATED)
    assert b"done" in res.stdout
    assert not Path("/usr/gridrun-pwned").exists()


@needs_sandbox
def test_project_and_home_are_not_visible() -> None:
    paths = [os.getcwd(), os.path.expanduser("~/.bashrc"), "/proc/self/environ"]
    res = run_python(f"import os\nprint([os.path.exists(p) for p in {paths!r}])", limits=FAST, config=ISOLATED)
    assert res.stdout.strip() == b"[False, False, False]"


@needs_sandbox
def test_no_network_to_the_host() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    src = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
           "    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e.errno)\n")
    try:
        res = run_python(src, limits=FAST, config=ISOLATED)
        assert b"CONNECTED" not in res.stdout and b"blocked" in res.stdout
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


@needs_sandbox
def test_fork_bomb_is_contained() -> None:
    marker = "gridrun-test-forkbomb-19c2"
    src = f"# {marker}\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    res = run_python(src, limits=Limits(wall_s=2.0, nproc=16), config=ISOLATED)
    assert time.monotonic() - t0 < 6.0
    assert res.timed_out
    _assert_healthy(marker)


@needs_sandbox
def test_no_user_namespace_can_be_created_inside() -> None:
    # A user namespace would hand the program every capability over its own namespaces:
    # refused for the unshare call, for clone with the flag, and for the unshare tool.
    src = ("import ctypes, os, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
           "print('clone', libc.syscall(56 if os.uname().machine == 'x86_64' else 220, 0x10000000 | 17, 0, 0, 0, 0))\n"
           "tool = subprocess.run(['unshare', '--user', 'true'], capture_output=True)\n"
           "print('tool', tool.returncode)\n")
    res = run_python(src, limits=FAST)
    assert res.ok, res.stderr
    assert res.stdout.decode().split("\n")[:3] == ["unshare -1 1", "clone -1", "tool 1"]  # errno 1: EPERM


@needs_sandbox
def test_password_hashes_are_masked() -> None:
    src = ("for p in ('/etc/shadow', '/etc/gshadow', '/etc/sudoers'):\n    try:\n"
           "        print(p, len(open(p).read()))\n    except OSError as e:\n        print(p, 'denied', e.errno)\n")
    res = run_python(src, limits=FAST)
    assert res.ok
    for line in res.stdout.decode().splitlines():  # masked by /dev/null (0 bytes) where they exist
        assert line.endswith(" 0") or " denied " in line, line


@needs_sandbox
def test_nproc_limit_applies() -> None:
    src = ("import os, time\nn = 0\nfor _ in range(100):\n    try:\n        if os.fork() == 0:\n"
           "            time.sleep(2)\n            os._exit(0)\n        n += 1\n    except OSError:\n        break\nprint(n)\n")
    res = run_python(src, limits=Limits(wall_s=5.0, nproc=8), config=ISOLATED)
    assert res.returncode == 0 and int(res.stdout) < 8


@needs_sandbox
def test_memory_bomb_gets_memory_error() -> None:
    res = run_python("x = bytearray(4 << 30)", limits=FAST, config=ISOLATED)
    assert res.returncode == 1 and b"MemoryError" in res.stderr


@needs_sandbox
def test_cpu_limit_kills_busy_loop() -> None:
    t0 = time.monotonic()
    res = run_python("while True:\n    pass\n", limits=Limits(wall_s=10.0, cpu_s=1), config=ISOLATED)
    assert time.monotonic() - t0 < 5.0
    # SIGXCPU, then SIGKILL at the hard limit; bwrap's reaper reports death by signal N as 128+N
    assert not res.timed_out and res.returncode in (128 + 24, 128 + 9)


@needs_sandbox
def test_killing_its_parent_leaves_us_alive() -> None:
    src = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\nprint('after')"
    res = run_python(src, limits=FAST, config=ISOLATED)
    assert not res.timed_out
    _assert_healthy("gridrun-none")


def test_opt_out_warns_once_and_enforces_rlimits(caplog: pytest.LogCaptureFixture) -> None:
    sandbox._warned.clear()
    with caplog.at_level(logging.WARNING, logger="gridrun.tasks.sandbox"):
        mem = run_python("x = bytearray(4 << 30)", limits=FAST, config=FALLBACK)
        cpu = run_python("while True:\n    pass\n", limits=Limits(wall_s=10.0, cpu_s=1), config=FALLBACK)
    warnings = [r for r in caplog.records if "WITHOUT ISOLATION" in r.getMessage()]
    assert len(warnings) == 1 and "--no-sandbox" in warnings[0].getMessage()
    assert not mem.isolated and mem.returncode == 1 and b"MemoryError" in mem.stderr
    assert cpu.returncode in (-24, -9) and not cpu.timed_out


def test_opt_out_timeout_still_sigkills() -> None:
    src = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.05)\n"
    res = run_python(src, limits=Limits(wall_s=1.0), config=FALLBACK)
    assert res.timed_out and res.returncode == -9


def test_missing_bwrap_refuses_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(SandboxUnavailable) as missing:
        run_python(f"open({str(marker)!r}, 'w').write('x')", config=SandboxConfig(bwrap="/nonexistent/bwrap"))
    message = str(missing.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message and "/nonexistent/bwrap" in message
    assert not marker.exists()


def test_config_rejects_an_unknown_isolation() -> None:
    with pytest.raises(ValueError, match="'bwrap', 'none'"):
        SandboxConfig(isolation="off")  # type: ignore[arg-type]


def _fake_bwrap(folder: Path, stderr_line: str) -> Path:
    """An executable named bwrap that fails the way a kernel without namespaces makes it fail."""
    folder.mkdir(exist_ok=True)
    fake = folder / "bwrap"
    fake.write_text(f"#!/bin/sh\necho '{stderr_line}' >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


def test_broken_bwrap_on_path_is_named_not_reported_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A bwrap that exists but cannot create namespaces: the hint must be about that binary,
    # not "install bubblewrap" (it is installed).
    fake = _fake_bwrap(tmp_path / "bin", "bwrap: No permissions to creating new namespace")
    monkeypatch.setenv("PATH", str(fake.parent))
    ok, reason = sandbox.isolation_status()
    assert not ok and "\n" not in reason
    assert f"bubblewrap at {fake} cannot create the sandbox" in reason and "No permissions" in reason
    assert "apt-get install" not in reason


@needs_sandbox
def test_bwrap_outside_the_standard_folders_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which("bwrap")
    assert real is not None
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt" / "bwrap").symlink_to(real)
    monkeypatch.setenv("PATH", str(tmp_path / "opt"))  # none of /usr/local/bin, /usr/bin, /bin
    assert sandbox.isolation_status() == (True, "")
    res = run_python("print('inside')", limits=FAST)
    assert res.ok and res.isolated and res.stdout == b"inside\n"


def _run_without_working_bwrap(argv: list[str], replacement: Path | None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` where the bwrap on PATH is unusable: ``replacement`` (or /dev/null, which is
    not executable) is bind-mounted over it in a private mount namespace that nothing else sees."""
    real = shutil.which("bwrap")
    if real is None:  # nothing to hide: this machine has no bubblewrap; a replacement goes on PATH
        env = dict(os.environ)
        if replacement is not None:
            env["PATH"] = f"{replacement.parent}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    if subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot create a private mount namespace here (needs root): unshare -m")
    hide = f'mount --bind "{replacement or "/dev/null"}" "{os.path.realpath(real)}" && exec "$@"'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", hide, "sh", *argv],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("broken", [False, True], ids=["missing", "broken"])
def test_reward_code_fails_closed_without_a_working_sandbox(tmp_path: Path, broken: bool) -> None:
    # The program would leave a file behind on the host if it ran at all.
    marker = tmp_path / "ran"
    prog = tmp_path / "prog.py"
    prog.write_text(f"open({str(marker)!r}, 'w').write('x')\nprint(3)\n")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps([{"input": "", "output": "3"}]))
    fake = _fake_bwrap(tmp_path / "bin", "bwrap: Creating new namespace failed: Operation not permitted") if broken else None
    res = _run_without_working_bwrap(
        [sys.executable, "-m", "gridrun.cli", "reward", "code", "--file", str(prog), "--tests", str(tests)], fake)
    assert res.returncode != 0 and res.stdout == ""
    assert not marker.exists()
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("gridrun: error: no working sandbox for untrusted code") and "--no-sandbox" in lines[0]
    if broken:
        assert "cannot create the sandbox" in lines[0] and "Operation not permitted" in lines[0]
    else:
        assert "apt-get install bubblewrap" in lines[0]
