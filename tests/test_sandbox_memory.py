"""The sandbox counts a program's memory whole: kernel objects that outlive or escape its
processes' address space (SysV and POSIX IPC, memfds, tmpfs inodes) are refused or capped,
and the host's available memory is measured while a hostile program runs many tests.

Also: every sandbox is reaped by its parent, so no zombie is left where PID 1 does not reap.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from gridrun.tasks.code_reward import CodeLimits, score_code
from gridrun.tasks.sandbox import Limits, SandboxConfig, run_python

needs_sandbox = pytest.mark.sandbox
ISOLATED = SandboxConfig()
FAST = Limits(wall_s=10.0, cpu_s=8, memory_mb=256, nproc=16, stdout_bytes=1 << 20)


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no MemAvailable in /proc/meminfo")


@needs_sandbox
def test_sysv_posix_ipc_and_memfd_are_refused() -> None:
    # Each of these holds memory that no rlimit sees: a SysV segment outlives its process,
    # a memfd or a message queue is never part of the address space.
    code = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
got = {}
got["shmget"] = libc.shmget(0, 1 << 20, 0o1600) >= 0
got["msgget"] = libc.msgget(0, 0o1600) >= 0
got["semget"] = libc.semget(0, 1, 0o1600) >= 0
got["mq_open"] = libc.syscall(240 if os.uname().machine == "x86_64" else 180, b"q", 0o100 | 2, 0o600, None) >= 0
try:
    os.memfd_create("x")
    got["memfd_create"] = True
except OSError:
    got["memfd_create"] = False
print(sorted(k for k, v in got.items() if v))
'''
    res = run_python(code, limits=FAST, config=ISOLATED)
    assert res.ok, res.stderr
    assert res.stdout.strip() == b"[]"


@needs_sandbox
def test_tmp_inodes_are_capped() -> None:
    # Empty files cost no tmpfs bytes but about a kilobyte of kernel memory each.
    code = r'''
import os
n = 0
try:
    while n < 200000:
        os.close(os.open("/tmp/f%d" % n, os.O_CREAT | os.O_WRONLY, 0o600))
        n += 1
except OSError as e:
    print(n, e.errno)
else:
    print(n, 0)
'''
    limits = Limits(wall_s=30.0, cpu_s=25, memory_mb=256, nproc=16, stdout_bytes=1 << 20)
    res = run_python(code, limits=limits, config=ISOLATED)
    assert res.ok, res.stderr
    n, errno = map(int, res.stdout.split())
    assert errno == 28 and n <= limits.tmpfs_inodes  # ENOSPC


# Per test: SysV segments that would outlive it, memfds and many files held until it ends.
HOSTILE = r'''
import ctypes, os, signal, time
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(2):
    sid = libc.shmget(0, 32 << 20, 0o1600)
    if sid >= 0:
        addr = libc.shmat(sid, None, 0)
        if addr and addr != ctypes.c_void_p(-1).value:
            ctypes.memset(addr, 1, 32 << 20)
            libc.shmdt(ctypes.c_void_p(addr))
held = []
block = b"x" * (1 << 20)
for _ in range(100):
    try:
        fd = os.memfd_create("m")
    except OSError:
        break
    for _ in range(8):
        try:
            os.write(fd, block)
        except OSError:
            break
    held.append(fd)
for i in range(20000):
    try:
        os.close(os.open("/tmp/f%d" % i, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError:
        break
time.sleep(0.05)
print(3)
'''


@pytest.mark.slow  # ~25 s: 50 tests of a program that takes every kind of memory it can
@needs_sandbox
def test_host_memory_stays_bounded_under_a_hostile_program() -> None:
    tests: list[dict[str, Any]] = [{"input": "", "output": "3\n"} for _ in range(50)]
    limits = CodeLimits(timeout_s=4.0, memory_mb=256, output_bytes=8 << 20, nproc=16)
    start = _mem_available()
    low = [start]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            low[0] = min(low[0], _mem_available())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        score = score_code(f"```python\n{HOSTILE}\n```", tests, limits=limits, workers=1, sandbox=ISOLATED)
    finally:
        stop.set()
        sampler.join()
    after = _mem_available()
    gib = 1 << 30
    assert score.total == 50
    assert start - low[0] < 1.5 * gib, f"host available memory fell {(start - low[0]) / gib:.2f} GiB while it ran"
    assert start - after < 1.5 * gib, f"host available memory {(start - after) / gib:.2f} GiB lower after it ran"


def _zombie_children() -> list[int]:
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and fields[1] == me:
            found.append(int(pid))
    return found


@pytest.fixture
def subreaper() -> Any:
    """Orphans come to this process, as to a PID 1 that never reaps (a container without init)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    try:
        yield
    finally:
        libc.prctl(36, 0, 0, 0, 0)
        for pid in _zombie_children():  # leave nothing behind, whatever the outcome
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


@needs_sandbox
def test_no_zombie_children_after_rewards(subreaper: None) -> None:
    tests = [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}]
    fast = CodeLimits(timeout_s=2.0, memory_mb=256, output_bytes=1 << 20, nproc=16)
    programs = ["a, b = map(int, input().split())\nprint(a + b)", "while True:\n    pass",
                "import os\nos.fork()\nprint(3)"]
    before = set(_zombie_children())
    for i in range(6):
        score_code(f"```python\n{programs[i % 3]}\n```", tests, limits=fast, sandbox=ISOLATED)
    for _ in range(3):
        run_python("print(1)", limits=FAST, config=ISOLATED)
    left = set(_zombie_children()) - before
    assert not left, f"zombie children of the test process: {sorted(left)}"
