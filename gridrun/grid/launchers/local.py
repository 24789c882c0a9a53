"""The local launcher (`launcher=local`): cells as subprocesses of `gridrun sweep`, a few at
a time, with a progress display.

A local cell's job id is `<pid>@<host>` of the gridrun process that queued it; that process
starts the cell (`python -P -m gridrun.cli run <run_dir>`, its own session, logs appended to
logs/stdout.log and logs/stderr.log) when a slot frees. By default as many cells run at
once as the machine's cores hold cells of `grid.cluster.cpus_per_cell` threads each
(`grid.launcher.max_parallel` or --max-parallel set it by hand). Ctrl-C (or SIGTERM, or SIGHUP
when its terminal closes) sends SIGTERM to
every running cell, waits `term_timeout_s`, then SIGKILLs what is left; the cells record
`cancelled` themselves, and cells not yet started are marked cancelled here.

A cell that needs others (a transfer cell its sa_rl cell) starts once they are done, in
whatever process ran them; when one ends otherwise, the pool gives it up (it reads blocked).

A cell whose process dies without recording a final state (kill -9, out of memory) is
marked failed by this launcher if it is still running, and otherwise read as failed ("lost"):
a running cell whose run lock no process holds (gridrun/grid/launchers/observe.py's
`live_state`, for cells run by hand too), a queued one whose gridrun process exited
(`reconcile`). A cell whose folder was deleted under it ends `missing`; the others go on.

Left out: other hosts (a local cell can only be checked or cancelled from its own host),
GPU placement (one cell per machine on GPUs; use a scheduler for more).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridrun.grid.console import console
from gridrun.grid.errors import GridError
from gridrun.grid.launchers.base import Accepted, Launcher, LauncherSettings
from gridrun.grid.launchers.observe import HOST, live_state, observe, sweep_needs
from gridrun.grid.launchers.process import cell_env, last_own_line, log_tail, start_cell
from gridrun.modelfiles import model_dirs_env
from gridrun.seam import cellstate
from gridrun.seam.cellstate import BLOCKING_STATES, FINISHED_STATES, CellState, StateRecord
from gridrun.seam.rundir import RunDir

if TYPE_CHECKING:
    from gridrun.grid.sweepdir import SweepDir

# A process that started this long after a cell's timestamp is a recycled pid, not the cell's.
START_SLACK_S = 2.0


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (Linux), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@functools.cache
def _boot_time() -> float | None:
    try:
        line = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, StopIteration):
        return None
    return float(line.split()[1])


def alive(pid: int | None, since: float | None = None) -> bool:
    """Whether `pid` runs (not a zombie) and, given `since`, started no later than it."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _proc_stat(pid)
    if fields is None:
        return True  # no /proc: the signal check is all there is
    if fields[0] == "Z":
        return False
    boot = _boot_time()
    if since is None or boot is None:
        return True
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK") <= since + START_SLACK_S


def _job_pid(job_id: str | None) -> tuple[int | None, str | None]:
    if not job_id or "@" not in job_id:
        return None, None
    pid, _, host = job_id.partition("@")
    return (int(pid), host) if pid.isdigit() else (None, host)


def _signal_cell(pid: int, sig: int) -> None:
    """Signal a cell and its children (it leads its own session when we started it)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _cell_cpus(run_dir: RunDir) -> int | None:
    """The threads a cell was planned with (cell.json's resources.cpus), if it says."""
    return run_dir.planned_count("cpus")


@dataclass
class LocalSettings(LauncherSettings):
    """launcher=local: its settings' one home (gridrun/grid/compose.py stores them with Hydra
    at their defaults; conf/launcher/local.yaml places them and names the launcher). `max_parallel`:
    cells running at once (--max-parallel overrides it); null fits the machine: the cores
    this process may use divided by cluster.cpus_per_cell (2 cores, 1 thread a cell: 2)."""

    name: str = "local"
    # Seconds between polls of the cells' state files (the progress display's refresh).
    poll_s: float = 0.5
    # Seconds a cell gets to stop after SIGTERM (Ctrl-C, `gridrun cancel`) before SIGKILL.
    term_timeout_s: float = 30


class LocalLauncher(Launcher):
    name = "local"
    settings_type = LocalSettings

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        # None: fit the machine, once the cells' thread counts are known (`parallelism`).
        setting = self.settings.get("max_parallel")
        self.max_parallel = None if setting is None else max(1, int(setting))
        self.poll_s = float(self.settings.get("poll_s", LocalSettings.poll_s))
        self.term_timeout_s = float(self.settings.get("term_timeout_s", LocalSettings.term_timeout_s))
        self.job_id = f"{os.getpid()}@{HOST}"

    # --- the Launcher interface ------------------------------------------------------------
    def submit(self, sweep: SweepDir, ids: list[str], accepted: Accepted | None = None) -> dict[str, str]:
        # Nothing starts yet: this process owns the cells and starts them in wait().
        return {cell_id: self.job_id for cell_id in ids}

    def wait(self, sweep: SweepDir, ids: list[str]) -> int:
        cpus = [_cell_cpus(sweep.cell(cell_id)) for cell_id in ids]
        return _Pool(self, sweep, ids, self.parallelism(cpus)).run()

    def parallelism(self, cpus_per_cell: list[int | None]) -> int:
        """Cells at once: the setting, else the cores this process may use divided by the
        most threads any of these cells takes (at least one cell)."""
        if self.max_parallel is not None:
            return self.max_parallel
        widest = max([cpus for cpus in cpus_per_cell if cpus] or [1])
        return max(1, len(os.sched_getaffinity(0)) // widest)

    @classmethod
    def reconcile(cls, states: Mapping[str, StateRecord]) -> dict[str, tuple[str, str]]:
        # A running cell is judged by its run lock before this (observe.live_state); a queued
        # one, by the gridrun process that queued it and would start it.
        lost: dict[str, tuple[str, str]] = {}
        for cell_id, record in states.items():
            launcher_pid, host = _job_pid(record.job_id)
            dead = (
                record.state == CellState.QUEUED
                and host == HOST
                and launcher_pid is not None
                and not alive(record.pid)
                and not alive(launcher_pid, record.queued_at)
            )
            if dead:
                why = (f"lost: the gridrun process that queued it ({launcher_pid}) exited before running it; "
                       "start it with `gridrun resubmit --failed`")
                lost[cell_id] = ("failed", why)
        return lost

    def cancel(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        done = []
        for cell_id in ids:
            run_dir = sweep.cell(cell_id)
            record = run_dir.read_state()
            _, host = _job_pid(record.job_id)
            if record.state == CellState.RUNNING:
                host = record.node or host
            if host and host != HOST:
                raise GridError(f"{cell_id} runs on host {host}: cancel it there (`gridrun cancel` on {host})")
            pid = record.pid
            if pid is not None and alive(pid):
                _signal_cell(pid, signal.SIGTERM)
                done.append(f"{cell_id}: sent SIGTERM to process {pid}")
            else:
                # Not started: the launcher that queued it checks the state before starting.
                try:
                    run_dir.record(cellstate.cancelled("cancelled before it started"))
                except cellstate.IllegalTransition as ended:  # it finished between the two reads
                    done.append(f"{cell_id}: not cancelled: {ended}")
                    continue
                done.append(f"{cell_id}: cancelled before it started")
        return done


class _Pool:
    """Runs queued cells with at most `max_parallel` at once, drawing their progress."""

    def __init__(self, launcher: LocalLauncher, sweep: SweepDir, ids: list[str], max_parallel: int) -> None:
        self.launcher, self.sweep, self.max_parallel = launcher, sweep, max_parallel
        self.pending = deque(ids)
        self.needs = sweep_needs(sweep)
        # The cluster profile's local model folders, handed to every cell (gridrun/modelfiles.py).
        self.env = model_dirs_env(sweep.read().cluster.get("model_dirs") or {})
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.stop_signal = 0
        self.killing = False
        self.outcomes: dict[str, str] = {}

    def run(self) -> int:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        # Ctrl-C, SIGTERM and a closed terminal (SIGHUP) only set a flag, read between polls:
        # an exception could land between starting a child and recording it, and the child
        # would outlive us (cells run in sessions of their own, so the hangup reaches only us).
        previous = {sig: signal.signal(sig, self._on_stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console(),
        )
        self.overall = self.progress.add_task(f"sweep {self.sweep.name}", total=len(self.pending), note="")
        self.bars: dict[str, Any] = {}
        try:
            with self.progress:
                while (self.pending or self.running) and not self.stopping:
                    self._start_more()
                    self._reap()
                    self._draw()
                    time.sleep(self.launcher.poll_s)
                if self.stopping:
                    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                        self.progress.console.print("[yellow]stopping: SIGTERM to running cells (Ctrl-C again: SIGKILL)[/]")
                    self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.stopping:
            return 128 + self.stop_signal  # the shell's code for it: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
        return 0 if all(state in FINISHED_STATES for state in self.outcomes.values()) else 1

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.killing = self.stopping
        self.stopping = True
        self.stop_signal = self.stop_signal or signum

    # --- starting ------------------------------------------------------------------------
    def _next(self) -> str | None:
        """The first pending cell whose needs are done (cells given up on are finished here)."""
        for cell_id in list(self.pending):
            # Observed, not as written: a need whose own process died reads failed, not running.
            needed = observe({need: live_state(self.sweep.cell(need)) for need in self.needs.get(cell_id, [])})
            states = {need: record.state for need, record in needed.items()}
            given_up = [need for need, state in states.items() if state in BLOCKING_STATES]
            if given_up:
                self.pending.remove(cell_id)
                need = given_up[0]
                self._finished(cell_id, StateRecord.derived(CellState.BLOCKED, f"{need} is {states[need]}: resubmit it"))
            elif all(state in FINISHED_STATES for state in states.values()):
                self.pending.remove(cell_id)
                return cell_id
        return None

    def _start_more(self) -> None:
        while self.pending and len(self.running) < self.max_parallel:
            cell_id = self._next()
            if cell_id is None:
                return
            with self.sweep.lock():
                run_dir = self.sweep.cell(cell_id)
                record = run_dir.read_state()
                if record.state != CellState.QUEUED or record.job_id != self.launcher.job_id:
                    # Cancelled, or taken over by another gridrun process, since it was queued.
                    self._finished(cell_id, record)
                    continue
                self.running[cell_id] = self._spawn(run_dir, record)
                run_dir.record(cellstate.handed_over(pid=self.running[cell_id].pid))
            total = max(record.total_steps or 0, 1)
            self.bars[cell_id] = self.progress.add_task(cell_id, total=total, note="starting")

    def _spawn(self, run_dir: RunDir, record: StateRecord) -> subprocess.Popen[bytes]:
        # The cell's CPU share (grid.cluster.cpus_per_cell) sizes its thread pools.
        return start_cell(
            run_dir.root.resolve(), (run_dir.stdout_log, run_dir.stderr_log), f"attempt {record.attempt}",
            cell_env(self.launcher.job_id, _cell_cpus(run_dir), self.env), start_new_session=True,
        )

    # --- finishing -----------------------------------------------------------------------
    def _reap(self) -> None:
        for cell_id, proc in list(self.running.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.running[cell_id]
            run_dir = self.sweep.cell(cell_id)
            record = run_dir.read_state()
            if record.active or record.state == CellState.DAMAGED:
                # It died before it could record why: record it here. A cell whose folder was
                # deleted (missing) or re-planned (planned) under it ends as it reads now.
                terminated = self.stopping or code in (-signal.SIGTERM, -signal.SIGINT, 143, 130)
                tail = log_tail(run_dir.stderr_log)
                why = f"{_describe_exit(code)} without recording a final state; see {run_dir.stderr_log}"
                ended = cellstate.cancelled if terminated else cellstate.failed
                record = run_dir.record(ended(why + (f"\n{tail}" if tail else "")))
            self._finished(cell_id, record)

    def _finished(self, cell_id: str, record: StateRecord) -> None:
        outcome = record.state.value
        self.outcomes[cell_id] = outcome
        if cell_id in self.bars:
            self.progress.remove_task(self.bars.pop(cell_id))
        self.progress.advance(self.overall)
        line = f"{outcome:<9} {cell_id}"
        if record.peak_val_acc is not None:
            line += f"  peak val acc {100 * record.peak_val_acc:.1f}% @ step {record.peak_step}"
        if record.peak_test_acc is not None:
            line += f" (test {100 * record.peak_test_acc:.1f}%)"
        if outcome == CellState.STOPPED and record.alert:
            line += f"  stopped at step {record.alert_step} by {record.alert.split(':', 1)[0]}"
        if outcome not in FINISHED_STATES and record.error:
            # The cell's folder is on its line already: its message goes on without it.
            error = record.error.replace(str(self.sweep.cell(cell_id).root), "its folder")
            error = error.replace("conf=<sweep>", f"conf={self.sweep.name}")
            line += f"  {error.strip().splitlines()[-1][:160]}"
        colors: dict[str, str] = {CellState.DONE: "green", CellState.STOPPED: "green", CellState.FAILED: "red", CellState.MISSING: "red",
                                  CellState.DAMAGED: "red"}
        color = colors.get(outcome, "yellow")
        self.progress.console.print(f"[{color}]{line}[/]", highlight=False)

    def _draw(self) -> None:
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        summary = [f"{len(self.running)} running", f"{len(self.pending)} waiting"]
        summary += [f"{n} {state}" for state, n in sorted(counts.items())]
        self.progress.update(self.overall, note=", ".join(summary))
        for cell_id, task in self.bars.items():
            run_dir = self.sweep.cell(cell_id)
            record = run_dir.read_state()
            note = record.state.value
            if record.last_val_acc is not None:
                note += f"  val {100 * record.last_val_acc:.1f}%"
            elif not record.step:
                # Before its first step a cell may build the toy world for minutes: say so.
                last = last_own_line(run_dir.stderr_log)
                note += f"  {last[:70]}" if last else ""
            total = max(record.total_steps or 0, 1)
            self.progress.update(task, completed=record.step, total=total, note=note)

    def _stop_all(self) -> None:
        with self.sweep.lock():
            while self.pending:
                cell_id = self.pending.popleft()
                run_dir = self.sweep.cell(cell_id)
                record = run_dir.read_state()
                if record.state == CellState.QUEUED and record.job_id == self.launcher.job_id:
                    record = run_dir.record(cellstate.cancelled("cancelled before it started"))
                self._finished(cell_id, record)
        for proc in self.running.values():
            _signal_cell(proc.pid, signal.SIGTERM)
        deadline = time.time() + self.launcher.term_timeout_s
        while self.running and time.time() < deadline and not self.killing:
            self._reap()
            time.sleep(0.1)
        for proc in self.running.values():
            _signal_cell(proc.pid, signal.SIGKILL)
        for proc in self.running.values():
            proc.wait()
        self._reap()
