"""Run untrusted programs (model-written code) in a bubblewrap sandbox with rlimits.

Fail closed: by default (``SandboxConfig(isolation="bwrap")``) nothing runs unless a one-time
probe per process proved that bubblewrap isolates here; otherwise ``SandboxUnavailable`` says,
in one line, what is missing and how to fix it. The only way around it is the opt-out by name,
``isolation="none"`` (``task.sandbox=none``, ``gridrun reward code --no-sandbox``), which is
logged loudly and reported as ``isolated=False`` in every result.

What is covered:
- Filesystem: a fresh root holding read-only binds of /usr, /etc, the /bin-/lib
  links and the interpreter's prefix, a private /tmp capped in bytes and in inodes (a
  tmpfs mounted by a small launcher in its own mount namespace, since bubblewrap's own
  --tmpfs cannot cap inodes) and a minimal /dev. No /proc, no home directories, no project tree: writes outside /tmp fail
  and files such as ~/.netrc or the repository cannot be read.
- No network (own network namespace with only a down loopback), own IPC, UTS
  and PID namespaces. Everything started inside dies with the sandbox, detached
  or not (the namespace's PID 1 going away kills the rest). The sandbox dies at once
  with its caller: ``--die-with-parent`` kills bubblewrap's own PID 1 inside. When the
  program itself is PID 1 (``start_python(as_pid_1=True)``) it must exit when its stdin
  closes, as the code reward's harness does: as root, the kernel does not deliver
  die-with-parent to a process that dropped to another uid.
- No privileges: all capabilities dropped. As root, bubblewrap runs without a
  user namespace and the program drops to a random uid in [2**30, 2**30 + 2**24)
  so that RLIMIT_NPROC applies (the kernel never enforces it for uid 0). As any
  other user, an unprivileged user namespace maps the caller to uid 65534 and
  the process count is per sandbox.
- No user namespaces inside: a seccomp filter (x86_64, aarch64) refuses clone/unshare
  with CLONE_NEWUSER and clone3 (glibc falls back to clone), and in user-namespace mode
  ``--disable-userns`` as well. The probe checks that creating one fails.
- Memory that no address-space limit sees is refused: the same filter refuses SysV IPC
  (shmget, msgget, semget: a segment outlives its process), POSIX message queues
  (mq_open; RLIMIT_MSGQUEUE is 0 as well) and memfd_create/memfd_secret (a memfd is
  memory that need never be mapped). /dev/shm is not writable; /tmp is capped.
- rlimits set inside the sandbox before the program runs: CPU seconds, address
  space, file size, process count, open files, no message queues, no core files.
- An empty environment plus PATH/LANG/HOME/TMPDIR; no API keys or tokens.
- Parent side: wall-clock deadline, stdout/stderr read up to a cap, and the sandbox
  SIGKILLed (never SIGTERM) on timeout or overflow: its namespace's init first, so that
  bubblewrap reaps it and is then reaped here (nothing is orphaned to a PID 1 that may
  never reap), then the whole process group.

What is not covered:
- Kernel exploits: the seccomp filter only guards user namespaces; every other
  syscall stays reachable.
- CPU and memory contention: no cgroups, so the address-space limit is per process
  (at most nproc x memory_mb, plus tmpfs_mb of /tmp and the kernel's share of nofile
  descriptors per process, in total) and a sandbox can slow its neighbours.
- World-readable files under /usr, /etc and the interpreter prefix stay readable
  (/etc/shadow, /etc/gshadow, /etc/ssh, /etc/ssl/private and sudoers are masked).
- Root without CAP_SYS_ADMIN (e.g. Docker with seccomp=unconfined but not
  --privileged): a user namespace still isolates, but the program stays uid 0
  outside and RLIMIT_NPROC is not enforced (warned once).
- ``isolation="none"``: rlimits only. No filesystem, network or PID isolation; the
  program runs as the caller (root stays root: it could read secrets, kill or overwrite
  anything), sees the caller's processes in /proc, and children that leave the
  process group survive. Only for trusted code or debugging.

Entry points: ``run``/``run_python`` (one shot) and ``start``/``start_python``
(a ``SandboxProcess`` for line-oriented sessions, as the code reward's harness uses);
``require`` fails fast before any work when no sandbox is available.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gridrun.seam.errors import UserError

__all__ = [
    "Limits",
    "SandboxConfig",
    "SandboxProcess",
    "SandboxResult",
    "SandboxUnavailable",
    "isolation_status",
    "require",
    "run",
    "run_python",
    "start",
    "start_python",
]

log = logging.getLogger(__name__)

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_SANDBOX_UID_BASE = 1 << 30  # far above real accounts, so NPROC counts only this sandbox
_SANDBOX_UID_SPAN = 1 << 24
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_READ_CHUNK = 1 << 16
_ETC_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssh", "/etc/ssl/private",
                "/etc/sudoers", "/etc/sudoers.d", "/etc/security/opasswd")


class SandboxUnavailable(UserError, RuntimeError):
    """No working sandbox here, and the caller did not opt out by name (``isolation="none"``)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandbox start (rlimits apply per process inside)."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024  # RLIMIT_AS
    file_mb: int = 16  # RLIMIT_FSIZE
    nproc: int = 32  # RLIMIT_NPROC, counting threads
    nofile: int = 256  # RLIMIT_NOFILE: bounds kernel buffers held through pipes and sockets
    stdout_bytes: int = 8 << 20
    stderr_bytes: int = 1 << 20
    tmpfs_mb: int = 64  # size of the private /tmp
    tmpfs_inodes: int = 8192  # files and folders in /tmp (an empty file costs ~1 KB of kernel memory)


ISOLATIONS = ("bwrap", "none")


@dataclass(frozen=True)
class SandboxConfig:
    """How to isolate. ``python`` defaults to the real path of ``sys.executable``."""

    # "bwrap": a working bubblewrap sandbox or nothing runs. "none": the opt-out by name,
    # rlimits only (see the module docstring for what that gives up).
    isolation: Literal["bwrap", "none"] = "bwrap"
    bwrap: str = "bwrap"  # a name looked up on PATH, or a path
    python: str | None = None
    ro_paths: tuple[str, ...] = ()  # extra host paths to bind read-only

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"sandbox isolation {self.isolation!r} is not one of {list(ISOLATIONS)}")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandbox start; stdout/stderr are truncated at their caps."""

    returncode: int | None  # negative: killed by that signal; under bwrap, 128+N for signal N
    stdout: bytes
    stderr: bytes
    wall_s: float
    timed_out: bool
    output_limit: bool  # stdout or stderr went over its cap and the sandbox was killed
    isolated: bool  # False: ran under the rlimits-only fallback

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_limit


# Runs first inside the sandbox, in the same process as the payload: drops the uid,
# blocks ptrace of the payload and sets the rlimits.
_PRELUDE = r'''
def _gridrun_confine(spec):
    import os, resource, signal
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid):
            raise SystemExit("gridrun sandbox: could not drop privileges")
    if spec["nodump"] and uid is None:
        # Blocks ptrace from the program (same uid). Not needed after the uid change
        # above: the kernel already marks the process non-dumpable then.
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    nproc = spec["nproc"]
    if spec["nproc_shared"]:
        # No user namespace: the kernel counts every process of this uid on the host.
        me = str(os.getuid())
        try:
            for pid in os.listdir("/proc"):
                try:
                    with open("/proc/%s/status" % pid) as f:
                        if any(l.startswith("Uid:") and l.split()[1] == me for l in f):
                            nproc += 1
                except OSError:
                    pass
        except OSError:
            pass
    cpu = spec["cpu"]
    for name, soft, hard in (
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_AS", spec["as"], spec["as"]),
        ("RLIMIT_FSIZE", spec["fsize"], spec["fsize"]),
        ("RLIMIT_NPROC", nproc, nproc),
        ("RLIMIT_NOFILE", spec["nofile"], spec["nofile"]),
        ("RLIMIT_MSGQUEUE", 0, 0),
        ("RLIMIT_CORE", 0, 0),
    ):
        resource.setrlimit(getattr(resource, name), (soft, hard))
'''

# Run by the probe after the prelude: the sandbox must refuse to create a user namespace.
_PROBE_CHECK = r'''
import ctypes
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0:  # CLONE_NEWUSER
    raise SystemExit("a user namespace could be created inside it")
print("gridrun-sandbox-ok")
'''

_WRAPPER = _PRELUDE + r'''
import os, sys
_gridrun_confine(__import__("json").loads(sys.argv[1]))
os.execv(sys.argv[2], sys.argv[2:])
'''


# The sandbox's parent (trusted, ours): starts bubblewrap in its own mount namespace (and,
# without root, its own user namespace) holding /tmp's tmpfs, so /tmp can be capped in
# inodes as well as bytes (bubblewrap's --tmpfs only takes a size); mounts are made private
# first, so nothing mounted here reaches the host. It is a child subreaper and reaps every
# process of the sandbox, so none is orphaned to a PID 1 that may never reap: bubblewrap
# exits as soon as its init reports a status, before that init is reaped. SIGTERM makes it
# SIGKILL bubblewrap's process group; it exits with bubblewrap's status once all are reaped.
_LAUNCHER = r'''
import ctypes, json, os, signal, sys
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def check(ok, what):
    if not ok:
        raise SystemExit("gridrun sandbox launcher: %s failed: %s" % (what, os.strerror(ctypes.get_errno())))
uid, gid = os.getuid(), os.getgid()
check(libc.unshare(0x00020000 | (0x10000000 if spec["userns"] else 0)) == 0, "unshare")  # NEWNS, NEWUSER
if spec["userns"]:
    for name, text in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None) == 0, "making mounts private")  # MS_REC|MS_PRIVATE
check(libc.mount(b"tmpfs", spec["dir"].encode(), b"tmpfs", 2 | 4, spec["options"].encode()) == 0,
      "mounting /tmp")  # MS_NOSUID|MS_NODEV
child, stopped = 0, False
def stop(signum, frame):
    global stopped
    stopped = True
    if child:
        try:
            os.killpg(child, signal.SIGKILL)
        except OSError:
            pass
signal.signal(signal.SIGTERM, stop)
check(libc.prctl(36, 1, 0, 0, 0) == 0, "becoming a subreaper")  # PR_SET_CHILD_SUBREAPER
libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the caller
if os.getppid() != spec["parent"]:
    raise SystemExit("gridrun sandbox launcher: its caller is gone")
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.execv(sys.argv[2], sys.argv[2:])
try:
    os.setpgid(child, child)
except OSError:
    pass
if stopped:
    stop(signal.SIGTERM, None)
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)  # the sandbox's pipes close when the sandbox is done, not when we are
os.closerange(3, 1 << 16)
status = 0
while True:
    try:
        pid, st = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    if pid == child:
        status = st
if os.WIFSIGNALED(status):  # the same death, so the caller sees what bubblewrap got
    if os.WTERMSIG(status) != signal.SIGKILL:
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.WEXITSTATUS(status))
'''


@dataclass(frozen=True)
class _Isolation:
    ok: bool
    reason: str  # why not, with the fix; empty when ok
    privileged: bool  # bwrap as root without a user namespace; the program drops to a random uid
    caveat: str = ""  # isolated, but weaker than documented (logged once)
    bwrap: str = ""  # absolute path of the bubblewrap that was probed


_probe_lock = threading.Lock()
_probe_cache: dict[tuple[str, str | None, str, bool], _Isolation] = {}
_warned: set[str] = set()

# seccomp-bpf refusing new user namespaces. Per machine: audit arch, clone, unshare, clone3.
_SYSCALLS = {"x86_64": (0xC000003E, 56, 272, 435), "aarch64": (0xC00000B7, 220, 97, 435)}
# Refused outright (EPERM), per machine: memory outside every rlimit. shmget, msgget, semget,
# mq_open, memfd_create, memfd_secret.
_REFUSED = {"x86_64": (29, 68, 64, 240, 319, 447), "aarch64": (194, 186, 190, 180, 279, 447)}
_CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000


def _seccomp_filter(machine: str) -> bytes | None:
    """The filter as struct sock_filter[] for ``bwrap --seccomp``; None for an unknown machine."""
    if machine not in _SYSCALLS:
        return None
    arch, clone, unshare, clone3 = _SYSCALLS[machine]
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|.., BPF_RET
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000
    eperm, enosys = 1, 38
    refused = [insn for nr in _REFUSED[machine] for insn in ((jeq, 0, 1, nr), (ret, 0, 0, errno | eperm))]
    program = [
        (ld_abs, 0, 0, 4),  # A = seccomp_data.arch
        (jeq, 1, 0, arch),
        (ret, 0, 0, kill),  # another ABI (i386's int 0x80): could bypass the numbers below
        (ld_abs, 0, 0, 0),  # A = seccomp_data.nr
        (jge, 0, 1, _X32_SYSCALL_BIT),
        (ret, 0, 0, errno | enosys),  # x32 ABI
        (jeq, 0, 1, clone3),
        (ret, 0, 0, errno | enosys),  # its flags sit behind a pointer; glibc falls back to clone
        *refused,
        (jeq, 1, 0, clone),
        (jeq, 0, 3, unshare),
        (ld_abs, 0, 0, 16),  # A = low word of args[0], the flags (little-endian)
        (jset, 0, 1, _CLONE_NEWUSER),
        (ret, 0, 0, errno | eperm),
        (ret, 0, 0, allow),
    ]
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


_SECCOMP = _seccomp_filter(platform.machine())


def _seccomp_fd() -> int | None:
    """A pipe's read end holding the filter, for one bwrap start (the caller closes it)."""
    if _SECCOMP is None:
        return None
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, _SECCOMP)  # a few hundred bytes: far below a pipe's capacity
    finally:
        os.close(write_end)
    return read_end


def _python(config: SandboxConfig) -> str:
    return os.path.realpath(config.python or sys.executable)


def _bind_roots(python: str, extra: Sequence[str]) -> list[str]:
    # The interpreter's prefix (…/bin/python -> …) holds its stdlib and libpython.
    prefix = os.path.dirname(os.path.dirname(python))
    roots: list[str] = []
    for path in (prefix, *extra):
        path = os.path.realpath(path)
        if any(path == r or path.startswith(r + "/") for r in ("/usr", "/etc", *roots)):
            continue
        roots.append(path)
    return roots


def _bwrap_argv(bwrap: str, config: SandboxConfig, limits: Limits, *, as_pid_1: bool, privileged: bool,
                seccomp_fd: int | None, tmp_dir: str) -> list[str]:
    """The launcher, then bubblewrap's command line; ``tmp_dir`` is an empty host folder that
    the launcher mounts /tmp's tmpfs on (in its own mount namespace)."""
    tmpfs = {"dir": tmp_dir, "userns": not privileged, "parent": os.getpid(),
             "options": f"size={limits.tmpfs_mb << 20},nr_inodes={limits.tmpfs_inodes},mode=1777"}
    argv = [_python(config), "-I", "-S", "-c", _LAUNCHER, json.dumps(tmpfs), bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent"]
    if privileged:
        # Privileged mode (no user namespace) so the program can drop to a non-root
        # uid that RLIMIT_NPROC applies to; only setuid/setgid survive until then.
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns",
                 "--cap-drop", "ALL"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if as_pid_1:
        argv.append("--as-pid-1")
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in _TOP_LINKS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind", "/etc", "/etc"]
    # Root-only secrets in /etc; readable if the sandbox ends up as uid 0 outside.
    for secret in _ETC_SECRETS:
        if os.path.isdir(secret):
            argv += ["--tmpfs", secret]
        elif os.path.exists(secret):
            argv += ["--ro-bind", "/dev/null", secret]
    made: set[str] = set()
    for path in _bind_roots(_python(config), config.ro_paths):
        # bwrap copies the host's modes for parent dirs (/root is 0700), which would
        # hide the interpreter from the unprivileged program; make them traversable.
        parent = os.path.dirname(path)
        ancestors = []
        while parent not in ("/", "") and parent not in made:
            ancestors.append(parent)
            parent = os.path.dirname(parent)
        for anc in reversed(ancestors):
            argv += ["--perms", "0755", "--dir", anc]
            made.add(anc)
        argv += ["--ro-bind", path, path]
        made.add(path)
    argv += ["--dev", "/dev", "--bind", tmp_dir, "/tmp", "--chdir", "/tmp", "--clearenv"]
    for key, value in {**_ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}.items():
        argv += ["--setenv", key, value]
    return argv


def _spec(limits: Limits, *, isolated: bool, privileged: bool, nodump: bool) -> str:
    return json.dumps({
        "uid": _SANDBOX_UID_BASE + random.randrange(_SANDBOX_UID_SPAN) if isolated and privileged else None,
        "nodump": nodump,
        "nproc": limits.nproc,
        "nproc_shared": not isolated,
        "cpu": max(1, int(limits.cpu_s)),
        "as": limits.memory_mb << 20,
        "fsize": limits.file_mb << 20,
        "nofile": limits.nofile,
    })


def _popen(argv: list[str], seccomp_fd: int | None, **kwargs: object) -> subprocess.Popen:
    try:
        return subprocess.Popen(argv, pass_fds=() if seccomp_fd is None else (seccomp_fd,), **kwargs)  # type: ignore[call-overload]
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)


def _try_bwrap(bwrap: str, config: SandboxConfig, privileged: bool) -> str:
    """Start a trivial sandbox; "" if it isolated as promised, else the last error line."""
    limits = Limits(wall_s=20.0)
    spec = json.loads(_spec(limits, isolated=True, privileged=privileged, nodump=False))
    check = f"{_PRELUDE}\n_gridrun_confine({spec!r})\n{_PROBE_CHECK}"
    seccomp_fd = _seccomp_fd()
    tmp_dir = tempfile.mkdtemp(prefix="gridrun-sbx-tmp-")
    argv = [*_bwrap_argv(bwrap, config, limits, as_pid_1=False, privileged=privileged, seccomp_fd=seccomp_fd,
                         tmp_dir=tmp_dir), _python(config), "-I", "-S", "-c", check]
    try:
        proc = _popen(argv, seccomp_fd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, env=dict(_ENV), start_new_session=True)
        out, err = proc.communicate(timeout=limits.wall_s)
    except OSError as exc:
        return f"it failed to start: {exc}"
    except subprocess.TimeoutExpired:
        _kill_sandbox(proc.pid)
        proc.communicate()
        return f"it did not answer within {limits.wall_s:.0f} s"
    finally:
        _remove_tmp_dir(tmp_dir)
    if proc.returncode == 0 and b"gridrun-sandbox-ok" in out:
        return ""
    lines = err.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _remove_tmp_dir(path: str) -> None:
    try:
        os.rmdir(path)  # empty on the host: the tmpfs was only ever mounted in the launcher's namespace
    except OSError as exc:
        log.warning("could not remove the sandbox's /tmp mount point %s: %s", path, exc)


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the zombie in place, so its pid (= its process group id) cannot be
    # reused before the group has been swept.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_sandbox(pid: int, grace_s: float = 2.0) -> None:
    """SIGKILL the sandbox whose launcher is our child ``pid``; the caller reaps ``pid``.

    The launcher SIGKILLs bubblewrap's group and reaps everything first (see _LAUNCHER);
    only then, or after ``grace_s``, does the launcher's own group get SIGKILL.
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace_s
    while not _exited(pid) and time.monotonic() < end:
        time.sleep(0.002)
    try:
        os.killpg(pid, signal.SIGKILL)  # stragglers, or a launcher that did not answer
    except ProcessLookupError:
        pass


def _probe(config: SandboxConfig, bwrap: str | None, root: bool) -> _Isolation:
    if bwrap is None:
        where = config.bwrap if os.sep in config.bwrap else f"{config.bwrap!r} on PATH"
        return _Isolation(False, f"bubblewrap is not installed (no {where}): apt-get install bubblewrap", False)
    bwrap = os.path.abspath(bwrap)
    if root:
        error = _try_bwrap(bwrap, config, privileged=True)
        if not error:
            return _Isolation(True, "", True, bwrap=bwrap)
    # Not root, or root without CAP_SYS_ADMIN (a default Docker container): user namespace.
    error_userns = _try_bwrap(bwrap, config, privileged=False)
    if not error_userns:
        caveat = ("sandbox runs in a user namespace as uid 0 outside, where the kernel does not "
                  "enforce RLIMIT_NPROC: fork bombs are bounded only by the wall-clock timeout; "
                  "fix: run as a non-root user or give root CAP_SYS_ADMIN") if root else ""
        return _Isolation(True, "", False, caveat, bwrap)
    if root:
        detail = f"as root: {error}; in a user namespace: {error_userns}"
        fix = ("give root CAP_SYS_ADMIN (Docker: --privileged) or allow user namespaces "
               "(sysctl user.max_user_namespaces=15000; Docker: --security-opt seccomp=unconfined)")
    else:
        detail = error_userns
        fix = ("enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and "
               "user.max_user_namespaces=15000; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0)")
    return _Isolation(False, f"bubblewrap at {bwrap} cannot create the sandbox ({detail}): {fix}", False, bwrap=bwrap)


def isolation_status(config: SandboxConfig | None = None) -> tuple[bool, str]:
    """(True, "") if bubblewrap isolates here, else (False, reason naming the fix).

    The probe runs once per (bubblewrap name and where PATH finds it, interpreter, root) and is cached.
    """
    iso = _isolation(config or SandboxConfig())
    return iso.ok, iso.reason


def _isolation(config: SandboxConfig) -> _Isolation:
    root = os.geteuid() == 0
    bwrap = shutil.which(config.bwrap)  # searched here: the sandbox's own PATH is the standard one
    key = (config.bwrap, bwrap, _python(config), root)
    with _probe_lock:
        if key not in _probe_cache:
            _probe_cache[key] = _probe(config, bwrap, root)
        return _probe_cache[key]


def _warn_once(message: str) -> None:
    with _probe_lock:
        first = message not in _warned
        _warned.add(message)
    if first:
        log.warning("%s", message)


def _resolve(config: SandboxConfig) -> _Isolation:
    if config.isolation == "none":
        _warn_once("UNTRUSTED CODE RUNS WITHOUT ISOLATION: the sandbox is switched off by name (isolation='none', "
                   "i.e. task.sandbox=none or --no-sandbox); programs can read, write, kill and connect to "
                   "whatever this user can")
        return _Isolation(False, "switched off by name (isolation='none')", False)
    iso = _isolation(config)
    if not iso.ok:
        raise SandboxUnavailable(f"no working sandbox for untrusted code: {iso.reason}")
    if iso.caveat:
        _warn_once(iso.caveat)
    return iso


def require(config: SandboxConfig | None = None) -> None:
    """Fail fast: raise ``SandboxUnavailable`` (one line, naming the fix) unless programs can run.

    With ``isolation="none"`` this only logs the opt-out warning.
    """
    _resolve(config or SandboxConfig())


class SandboxProcess:
    """One running sandbox with pipes: line-oriented sessions and one-shot runs.

    Not thread-safe; use one instance per thread. Close with ``finish`` or ``kill``.
    """

    def __init__(self, inner_argv: Sequence[str], limits: Limits, iso: _Isolation,
                 config: SandboxConfig, *, as_pid_1: bool = False) -> None:
        self.limits = limits
        self.isolated = iso.ok
        self.timed_out = False
        self.output_limit = False
        self._t0 = time.monotonic()
        self._deadline = self._t0 + limits.wall_s
        self._workdir: str | None = None
        self._tmp_dir: str | None = None
        seccomp_fd = None
        if iso.ok:
            seccomp_fd = _seccomp_fd()
            self._tmp_dir = tempfile.mkdtemp(prefix="gridrun-sbx-tmp-")
            argv = _bwrap_argv(iso.bwrap, config, limits, as_pid_1=as_pid_1, privileged=iso.privileged,
                               seccomp_fd=seccomp_fd, tmp_dir=self._tmp_dir) + list(inner_argv)
            env, cwd = dict(_ENV), "/"
        else:
            self._workdir = tempfile.mkdtemp(prefix="gridrun-sbx-")
            os.chmod(self._workdir, 0o700)
            argv = list(inner_argv)
            env = {**_ENV, "HOME": self._workdir, "TMPDIR": self._workdir}
            cwd = self._workdir
        # A new session makes the sandbox a process group we can SIGKILL as a whole.
        try:
            self._proc = _popen(argv, seccomp_fd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True,
                                close_fds=True)
        except BaseException:
            for folder in (self._tmp_dir, self._workdir):
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
            raise
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr
        self._stdin = self._proc.stdin.fileno()
        os.set_blocking(self._stdin, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._proc.stdout.fileno(), selectors.EVENT_READ, "out")
        self._sel.register(self._proc.stderr.fileno(), selectors.EVENT_READ, "err")
        self._out = bytearray()
        self._err = bytearray()
        self._out_total = 0
        self._out_pos = 0  # start of the next unread line in _out
        self._open = {"out", "err"}
        self._pending = bytearray()
        self._stdin_open = True
        self._result: SandboxResult | None = None
        self._reaped = False

    # -- pumping ---------------------------------------------------------------
    def _pump(self, deadline: float) -> bool:
        """One select round; False if the deadline passed or the sandbox was killed."""
        if self._result is not None:
            return False
        deadline = min(deadline, self._deadline)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if deadline >= self._deadline:
                self.timed_out = True
                self.kill()
            return False
        if self._pending and self._stdin_open:
            try:
                self._sel.register(self._stdin, selectors.EVENT_WRITE, "in")
            except KeyError:
                pass
        events = self._sel.select(remaining)
        try:
            self._sel.unregister(self._stdin)
        except (KeyError, ValueError):
            pass
        for key, _ in events:
            if key.data == "in":
                try:
                    n = os.write(self._stdin, self._pending[:_READ_CHUNK])
                    del self._pending[:n]
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    self._pending.clear()
                    self._close_stdin()
                continue
            chunk = os.read(key.fd, _READ_CHUNK)
            if not chunk:
                self._sel.unregister(key.fd)
                self._open.discard(key.data)
                continue
            if key.data == "out":
                room = self.limits.stdout_bytes - self._out_total
                self._out_total += len(chunk)
                self._out += chunk[: max(0, room)]
                if self._out_total > self.limits.stdout_bytes:
                    self.output_limit = True
                    self.kill()
                    return False
            else:
                room = self.limits.stderr_bytes - len(self._err)
                self._err += chunk[: max(0, room)]
                if len(chunk) > room:
                    self.output_limit = True
                    self.kill()
                    return False
        return True

    def _close_stdin(self) -> None:
        if self._stdin_open:
            self._stdin_open = False
            try:
                self._proc.stdin.close()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass

    # -- session API -----------------------------------------------------------
    def send(self, data: bytes, timeout_s: float) -> bool:
        """Write ``data`` to the sandbox's stdin; False if it could not be delivered."""
        if not self._stdin_open or self._result is not None:
            return False
        self._pending += data
        deadline = time.monotonic() + timeout_s
        while self._pending and self._stdin_open:
            if not self._pump(deadline):
                return False
        return not self._pending

    def read_line(self, timeout_s: float) -> bytes | None:
        """Next stdout line (without newline), or None on EOF, timeout or overflow."""
        deadline = time.monotonic() + timeout_s
        while True:
            nl = self._out.find(b"\n", self._out_pos)
            if nl >= 0:
                line = bytes(self._out[self._out_pos:nl])
                self._out_pos = nl + 1
                if self._out_pos > (1 << 20):  # keep the buffer small in long sessions
                    del self._out[: self._out_pos]
                    self._out_pos = 0
                return line
            if "out" not in self._open:
                return None
            if not self._pump(deadline):
                if time.monotonic() >= deadline and self._result is None:
                    self.kill()  # a session that misses a reply deadline is over
                    self.timed_out = True
                return None

    def _exited(self) -> bool:
        return _exited(self._proc.pid)

    def kill(self) -> None:
        """SIGKILL the sandbox: its PID namespace's init, then its whole process group."""
        if self._reaped:
            return
        if self.isolated:
            _kill_sandbox(self._proc.pid)
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def finish(self) -> SandboxResult:
        """Close stdin, collect output until EOF or the wall deadline, reap; idempotent."""
        if self._result is not None:
            return self._result
        self._close_stdin()
        self._pending.clear()
        exited_at: float | None = None
        while self._open:
            if exited_at is None and self._exited():
                exited_at = time.monotonic()
            # Once the main process is gone, leftovers holding the pipes get a short grace.
            until = self._deadline if exited_at is None else min(self._deadline, exited_at + 0.2)
            if not self._pump(until):
                break
        while not self._exited():
            if time.monotonic() >= self._deadline:
                self.timed_out = True
                break
            time.sleep(0.005)
        self.kill()  # also catches stragglers left in the group
        self._proc.wait()
        self._reaped = True
        self._sel.close()
        for stream in (self._proc.stdout, self._proc.stderr):
            stream.close()  # type: ignore[union-attr]
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        if self._tmp_dir is not None:
            _remove_tmp_dir(self._tmp_dir)
        self._result = SandboxResult(
            returncode=self._proc.returncode, stdout=bytes(self._out[self._out_pos:]),
            stderr=bytes(self._err), wall_s=time.monotonic() - self._t0,
            timed_out=self.timed_out, output_limit=self.output_limit, isolated=self.isolated)
        return self._result

    def __enter__(self) -> SandboxProcess:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self.finish()


def start(argv: Sequence[str], *, limits: Limits | None = None,
          config: SandboxConfig | None = None) -> SandboxProcess:
    """Start ``argv`` (absolute path first) under the rlimit wrapper in a sandbox."""
    limits = limits or Limits()
    config = config or SandboxConfig()
    iso = _resolve(config)
    spec = _spec(limits, isolated=iso.ok, privileged=iso.privileged, nodump=False)
    inner = [_python(config), "-I", "-S", "-c", _WRAPPER, spec, *argv]
    return SandboxProcess(inner, limits, iso, config)


def start_python(source: str, *, limits: Limits | None = None, config: SandboxConfig | None = None,
                 as_pid_1: bool = False) -> SandboxProcess:
    """Run Python ``source`` in a sandbox; limits are applied in-process before it runs.

    ``as_pid_1`` makes the program the namespace's init: signals from its own
    children (even SIGKILL) cannot reach it, and when it exits every process left
    in the sandbox is killed. It must then reap its children itself, and exit when
    its stdin closes: as root, that is the only sign that the caller died.
    """
    limits = limits or Limits()
    config = config or SandboxConfig()
    iso = _resolve(config)
    spec = json.loads(_spec(limits, isolated=iso.ok, privileged=iso.privileged, nodump=True))
    code = f"{_PRELUDE}\n_gridrun_confine({spec!r})\ndel _gridrun_confine\n{source}"
    inner = [_python(config), "-I", "-c", code]
    return SandboxProcess(inner, limits, iso, config, as_pid_1=as_pid_1)


def run(argv: Sequence[str], stdin: bytes = b"", *, limits: Limits | None = None,
        config: SandboxConfig | None = None) -> SandboxResult:
    """Run ``argv`` to completion in a sandbox, feeding ``stdin``."""
    proc = start(argv, limits=limits, config=config)
    return _one_shot(proc, stdin)


def run_python(source: str, stdin: bytes = b"", *, limits: Limits | None = None,
               config: SandboxConfig | None = None) -> SandboxResult:
    """Run Python ``source`` (as ``python -I -c``) to completion in a sandbox."""
    proc = start_python(source, limits=limits, config=config)
    return _one_shot(proc, stdin)


def _one_shot(proc: SandboxProcess, stdin: bytes) -> SandboxResult:
    with proc:
        if stdin:
            proc.send(stdin, proc.limits.wall_s)
        return proc.finish()
