"""The test harness that runs inside the code reward's sandbox, shipped there as this file's source.

It runs as PID 1 of the sandbox's PID namespace (``sandbox.start_python(as_pid_1=True)``),
after the sandbox's prelude dropped privileges and set the rlimits. It compiles the program
once, then forks a fresh child per test, so every test sees a new process with its own stdin
file, rlimits and wall-clock timeout, as ``python3 main.py`` run alone would, minus the
interpreter start. Files the program left in /tmp are removed before the next test.

Protocol, one JSON object per line on stdin/stdout:
  parent -> {"code": base64 of the program's bytes, "timeout": s, "out_cap": bytes}
  harness -> {"ready": true, "compiled": bool}
  parent -> {"i": k, "stdin": str} or {"i": k, "fn": name, "args": [...]}
  harness -> {"i": k, "status": ..., "out": base64, "err": str, "t": s}
Status: ok, timeout, memory, runtime_error, output_limit, syntax_error, harness_error.

Judged like Python:
- The exit status is the program's own, any value: a failure to set up the test child is
  reported on a pipe that is closed before the program's first line runs, so no program can
  forge (or be mistaken for) a harness failure.
- The source is compiled from bytes, so a UTF-8 BOM and coding cookies mean what they mean
  to ``python3 main.py``.
- At exit, in CPython's order: non-daemon threads joined, atexit handlers run, then stdout
  and stderr flushed unless the program closed them; a failed flush makes the status 120.

Its stdin doubles as a lifeline: it is only ever readable between tests, so EOF during a test
means the scorer died, and the harness kills the test and exits, taking the sandbox with it.

Left out: expected outputs never enter the sandbox (the parent compares). Only the standard
library is imported: gridrun itself is not importable inside the sandbox.
"""

# No `from __future__` import: the sandbox runs this source after its prelude, where one would
# be a SyntaxError.
import atexit
import base64
import builtins
import contextlib
import json
import math
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback
import types
from typing import Any, BinaryIO

FILES = ("in", "out", "err", "res")
_EXIT_FLUSH_FAILED = 120  # CPython's status when flushing stdout/stderr at exit fails


def exit_status(code: object) -> int:
    """The process exit status CPython gives ``raise SystemExit(code)`` (0-255)."""
    if code is None:
        return 0
    if isinstance(code, int):
        # CPython reads a C long (-1 on overflow) and the kernel keeps the low byte.
        return (code if -(1 << 63) <= code < (1 << 63) else -1) & 0xFF
    with contextlib.suppress(BaseException):  # a broken stderr does not change the status
        print(code, file=sys.stderr)
    return 1


def _jsonable(o: Any) -> Any:
    if isinstance(o, (set, frozenset)):
        try:
            return sorted(o)
        except TypeError:
            return list(o)
    if isinstance(o, bytes):
        return o.decode("utf-8", "replace")
    return repr(o)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _read(path: str, limit: int, tail: bool = False) -> bytes:
    try:
        with open(path, "rb") as f:
            if tail:
                f.seek(max(0, _size(path) - limit))
            return f.read(limit)
    except OSError:
        return b""


class Harness:
    def __init__(self, code: bytes, timeout_s: float, out_cap: int, tmp: str) -> None:
        self.timeout_s, self.out_cap, self.tmp = timeout_s, out_cap, tmp
        self.cpu_s = max(1, math.ceil(timeout_s))
        self.paths = {name: os.path.join(tmp, "gridrun-harness." + name) for name in FILES}
        self.pid1 = os.getpid() == 1
        self.typing_names: dict[str, Any] | None = None
        try:
            self.code: types.CodeType | None = compile(code, "main.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
            self.code = None

    # -- the test child ---------------------------------------------------------------
    def _child(self, fn: str | None, args: list[Any] | None, report: int) -> None:
        """Set up the test process, then run the program; never returns."""
        try:
            os.setpgid(0, 0)
            for fd, name, flags in ((0, "in", os.O_RDONLY), (1, "out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, "err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                os.dup2(os.open(self.paths[name], flags, 0o600), fd)
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s + 1))
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.out_cap + 1, self.out_cap + 1))
            signal.signal(signal.SIGINT, signal.default_int_handler)
            # The program's own streams, open for its whole life (as the interpreter's are).
            # (typeshed marks sys.__std*__ Final; a fresh interpreter's are these very objects.)
            sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # type: ignore[misc]  # noqa: SIM115
            sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="surrogateescape",  # type: ignore[misc]  # noqa: SIM115
                                               closefd=False)
            sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace",  # type: ignore[misc]  # noqa: SIM115
                                               closefd=False, buffering=1)
            sys.argv = ["main.py"]
            atexit._clear()  # the harness's own exit handlers are not the program's
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = builtins
            main.__dict__["__file__"] = "main.py"
            sys.modules["__main__"] = main
            if fn is not None and self.typing_names:
                main.__dict__.update(self.typing_names)  # LeetCode signatures use List[int] unimported
            # Last step of the set-up: closes the report pipe (and the harness's reply pipe).
            os.closerange(3, 1 << 20)
        except BaseException:  # noqa: BLE001 - any set-up failure is the harness's, reported as such
            try:
                os.write(report, traceback.format_exc()[-2000:].encode() or b"?")
            finally:
                os._exit(1)
        os._exit(self._run_program(main, fn, args))

    def _run_program(self, main: types.ModuleType, fn: str | None, args: list[Any] | None) -> int:
        status = 0
        try:
            assert self.code is not None, "a program that does not compile is reported before it runs"
            exec(self.code, main.__dict__)  # noqa: S102 - running the program is the point
            if fn is not None:
                target = main.__dict__.get(fn)
                if not callable(target):
                    sol = main.__dict__.get("Solution")
                    if sol is None or not hasattr(sol, fn):
                        raise NameError(f"no function or Solution method named {fn!r}")
                    target = getattr(sol(), fn)
                data = json.dumps(target(*(args or [])), default=_jsonable).encode("utf-8")
                fd = os.open(self.paths["res"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                while data:
                    data = data[os.write(fd, data):]
                os.close(fd)
        except SystemExit as e:
            status = exit_status(e.code)
        except BaseException:  # noqa: BLE001 - like an uncaught exception at top level
            with contextlib.suppress(BaseException):
                traceback.print_exc()
            status = 1
        return _finalize(status)

    # -- the harness side -------------------------------------------------------------
    def _kill_rest(self, pid: int) -> None:
        try:
            if self.pid1:
                os.kill(-1, signal.SIGKILL)  # everything in the namespace but us
            else:
                os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _wait(self, pid: int, lifeline: int) -> tuple[bool, int, float]:
        """Wait for the test child; (timed out, wait status, CPU seconds)."""
        exited = self._wait_exit(pid, lifeline)
        if exited is None:
            self._kill_rest(pid)  # stdin closed mid-test: the scorer is gone
            os._exit(0)
        killed = not exited
        if killed:
            self._kill_rest(pid)
        _, status, usage = os.wait4(pid, 0)
        self._kill_rest(pid)  # detached leftovers must not leak into the next test
        if self.pid1:
            while True:
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    break
        return killed, status, usage.ru_utime + usage.ru_stime

    def _wait_exit(self, pid: int, lifeline: int) -> bool | None:
        """True once the child exited, False at the timeout, None if the lifeline closed first."""
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # before Linux 5.3: poll
            end = time.monotonic() + self.timeout_s
            while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                if select.select([lifeline], [], [], 0.002)[0]:
                    return None
                if time.monotonic() >= end:
                    return False
            return True
        try:
            ready = select.select([pidfd, lifeline], [], [], self.timeout_s)[0]
        finally:
            os.close(pidfd)
        if pidfd in ready:
            return True
        return None if ready else False

    def _clean_tmp(self) -> None:
        """Empty /tmp: the last test's files (the harness's own included, which the program
        could have replaced by a folder or a link) must not reach this one."""
        for entry in os.scandir(self.tmp):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=_make_writable_and_retry)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass

    def run(self, req: dict[str, Any], lifeline: int) -> dict[str, Any]:
        fn = req.get("fn")
        if fn is not None and self.typing_names is None:
            import typing

            self.typing_names = {n: getattr(typing, n) for n in typing.__all__ if n[0].isupper()}
        self._clean_tmp()
        with open(self.paths["in"], "xb") as f:
            f.write(req.get("stdin", "").encode("utf-8"))
        report_r, report_w = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(report_r)
            self._child(fn, req.get("args"), report_w)
        os.close(report_w)
        try:
            os.setpgid(pid, pid)  # also from this side, so _kill_rest never misses the group
        except OSError:
            pass
        killed, status, cpu = self._wait(pid, lifeline)
        elapsed = time.monotonic() - t0
        setup_error = os.read(report_r, 4096)
        os.close(report_r)
        err = _read(self.paths["err"], 4096, tail=True)
        st = self._status(killed, status, cpu, fn, err, setup_error)
        if setup_error:
            err = setup_error
        out = _read(self.paths["res" if fn is not None else "out"], self.out_cap) if st == "ok" else b""
        return {"i": req["i"], "status": st, "out": base64.b64encode(out).decode(),
                "err": err[-1000:].decode("utf-8", "replace"), "t": elapsed}

    def _status(self, killed: bool, status: int, cpu: float, fn: str | None, err: bytes, setup_error: bytes) -> str:
        if setup_error:
            return "harness_error"
        if killed:
            return "timeout"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU or cpu >= self.cpu_s:
                return "timeout"
            if sig == signal.SIGKILL:
                return "memory"  # not ours and not the CPU limit: the OOM killer
            return "runtime_error"
        if max(_size(self.paths["out"]), _size(self.paths["res"]), _size(self.paths["err"])) > self.out_cap:
            return "output_limit"
        if os.WEXITSTATUS(status) != 0:
            return "memory" if b"MemoryError" in err else "runtime_error"
        if fn is not None and _size(self.paths["res"]) < 0:
            return "runtime_error"
        return "ok"


def _finalize(status: int) -> int:
    """What CPython does after the main module finishes, in its order; the exit status."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  # wait for non-daemon threads
    atexit._run_exitfuncs()  # prints and ignores a handler's exception, as at interpreter exit
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except BaseException:  # noqa: BLE001
            status = _EXIT_FLUSH_FAILED
    return status


def _make_writable_and_retry(func: Any, path: str, _exc: object) -> None:
    try:
        os.chmod(os.path.dirname(path), 0o700)
        func(path)
    except OSError:
        pass


def _emit(out: BinaryIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as PID 1, only handled signals get through
    rd, wr = sys.stdin.buffer, sys.stdout.buffer
    head = json.loads(rd.readline())
    harness = Harness(base64.b64decode(head["code"]), float(head["timeout"]), int(head["out_cap"]),
                      os.environ.get("TMPDIR") or "/tmp")
    _emit(wr, {"ready": True, "compiled": harness.code is not None})
    for line in rd:  # EOF: the scorer closed the session or died
        req = json.loads(line)
        if harness.code is None:
            _emit(wr, {"i": req["i"], "status": "syntax_error", "out": "", "err": "", "t": 0.0})
        else:
            _emit(wr, harness.run(req, rd.fileno()))


if __name__ == "__main__":
    main()
