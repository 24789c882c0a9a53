"""What a SLURM job of the launcher runs (`CellJob`): one cell, one rank per task.

Each task of the job (submitit starts them with srun) runs `python -P -m gridrun.cli run
<run_dir>` as a child process (gridrun/grid/launchers/process.py: the installed gridrun,
never the job's cwd; thread pools sized to SLURM_CPUS_PER_TASK), with its rank from
submitit's JobEnvironment in torchrun's
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; gridrun/train/distributed.py
reads them), and sees exactly its own GPU (CUDA_VISIBLE_DEVICES: `process.bind_gpu`), which
its trainer and its rollout engine share. Rank 0's output is appended to the cell's logs/stdout.log and logs/stderr.log,
other ranks' to logs/rank<r>.*.log. The trainer writes state.json; rank 0's task here only
writes what the trainer cannot:

- a requeue by the scheduler opens the cell's next attempt (queued, `requeues` + 1), whether
  it came from SLURM's warning signal (submitit's USR2 handler calls `checkpoint`, which lets
  the trainer finish its step and checkpoint, then requeues the job) or from `scontrol
  requeue` / a preemption (SIGTERM: the trainer records cancelled, and `scontrol show job`'s
  Restarts tells the two apart); a job that restarts finds the same thing out at its start.
  The ended attempt's record names the checkpoint the next one resumes from (the newest
  complete one once the trainer has exited), or says it restarts from step 0;
- a trainer that died without a word (SIGKILL, out of memory) is recorded failed;
- the cell's requeue budget (`timeouts_left`: requeues at the time limit, from its planned
  hours, gridrun/grid/launchers/slurm.py `requeue_budget`) travels with the job; once it is
  spent the cell stops as preempted;
- a requeue SLURM refuses after its warning (JobRequeue=0, --no-requeue) leaves the cell
  preempted with a line naming `gridrun resubmit --preempted` (`requeue_refused`); the
  refusal does not raise out of `CellJob`;
- a failed rank: every job step runs `srun --kill-on-bad-exit=1`; a rank other than 0 whose
  trainer fails writes its error tail to ranks/rank<r>.error and its task exits non-zero,
  while rank 0's task polls for that file every RANK_POLL_S (2 s), stops its own trainer and
  records the cell failed with `rank <r> failed: <tail>`, not a collective's timeout;
- a stopped rank: on SLURM's warning every rank stops after the same step (EXIT_PREEMPTED),
  and only rank 0 checkpoints and requeues. Another rank's task, done first, exits 0: a
  non-zero exit would have srun kill rank 0 in the middle of its save.

The child starts with SIGUSR2 ignored until the trainer installs its handler (the default
action would kill it). Imports submitit and the standard library, never torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import UncompletedJobError

from gridrun.grid.launchers.process import GpuBindingError, bind_gpu, cell_env, log_tail, start_cell
from gridrun.seam import cellstate
from gridrun.seam.cellstate import FINISHED_STATES, CellState
from gridrun.seam.rundir import RunDir

# Seconds kept back from signal_delay_s for the requeue itself once the trainer stopped.
REQUEUE_MARGIN_S = 20.0
# Seconds the trainer gets to stop after SIGTERM before it is killed.
TERM_WAIT_S = 10.0
# Seconds between rank 0's looks for another rank's failure (well inside SLURM's KillWait).
RANK_POLL_S = 2.0


def _ignore_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _exited(pid: int) -> bool:
    """Whether a child of this process has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_exit(pid: int, timeout: float, nudge: signal.Signals | None = None) -> bool:
    """Wait for a child to exit; `nudge` is sent every few seconds meanwhile (a trainer still
    starting up ignores SIGUSR2 until its handler is installed)."""
    deadline = time.monotonic() + timeout
    next_nudge = time.monotonic()
    while not _exited(pid):
        if time.monotonic() > deadline:
            return False
        if nudge is not None and time.monotonic() >= next_nudge:
            os.kill(pid, nudge)
            next_nudge = time.monotonic() + 5.0
        time.sleep(0.2)
    return True


def slurm_restarts(raw_job_id: str) -> int | None:
    """The scheduler's restart count of a job (`scontrol show job`), None if unknown."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", raw_job_id], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in out.split():
        if word.startswith("Restarts="):
            return int(word.split("=", 1)[1])
    return None


def timed_out(started: float, time_min: int) -> bool:
    """submitit's rule for a USR2 (core/job_environment.py, SignalHandler.has_timed_out): a
    timeout once the job ran min(80%, limit - 10 min) of its limit, else a preemption."""
    limit = time_min * 60
    return time.time() - started >= min(limit * 0.8, limit - 600)


def requeue_refused(err: subprocess.CalledProcessError) -> str:
    """The state's words for a job that SLURM would not requeue after its warning."""
    return (
        f"stopped on SLURM's warning with a checkpoint, but SLURM refused to requeue the job "
        f"({' '.join(map(str, err.cmd))}: exit {err.returncode}; requeue is off on this cluster or for this job, "
        "JobRequeue=0 or --no-requeue): resume it with `gridrun resubmit --preempted`"
    )


class CellJob(submitit.helpers.Checkpointable):
    """Runs one cell in a SLURM job; requeues itself on SLURM's warning signal."""

    def __init__(self, run_dir: str, time_min: int, signal_delay_s: int, timeouts_left: int | None = None) -> None:
        self.run_dir = run_dir
        self.time_min = time_min
        self.signal_delay_s = signal_delay_s
        # Requeues at the time limit this cell may still take (None: submitit's count alone).
        self.timeouts_left = timeouts_left
        self._child: subprocess.Popen[bytes] | None = None
        self._started = time.time()
        # Set by `checkpoint` when the trainer had finished anyway: nothing to requeue.
        self._finished_state: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The child process handle and start time belong to one run, not to the pickle.
        return {"run_dir": self.run_dir, "time_min": self.time_min, "signal_delay_s": self.signal_delay_s,
                "timeouts_left": self.timeouts_left}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    # --- the job ---------------------------------------------------------------------------
    def __call__(self) -> int:
        self._started = time.time()
        env = submitit.JobEnvironment()
        rank, job_id = env.global_rank, env.job_id
        run_dir = RunDir(self.run_dir)
        restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if not self._should_run(run_dir, job_id, restart, record=rank == 0):
            return 0
        # submitit's rendezvous: the first host, a port drawn from the job id (so every task of
        # the job agrees and cells sharing a node differ), this task's ranks.
        dist = submitit.helpers.TorchDistributedEnvironment()
        try:
            gpu = bind_gpu(os.environ, dist.local_rank, dist.local_world_size)
        except GpuBindingError as err:
            if rank == 0:
                run_dir.record(cellstate.failed(str(err)))
            raise
        torchrun = {
            "MASTER_ADDR": dist.master_addr,
            "MASTER_PORT": str(dist.master_port),
            "RANK": str(dist.rank),
            "WORLD_SIZE": str(dist.world_size),
            "LOCAL_RANK": str(dist.local_rank),
            # Exactly this task's GPU: the trainer and its engine both run on it.
            **gpu,
        }
        cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or 0) or None
        out_path, err_path = run_dir.rank_logs(rank)
        self._child = start_cell(
            run_dir.root, (out_path, err_path), f"job {job_id} rank {rank}/{dist.world_size} (restart {restart})",
            cell_env(job_id, cpus, torchrun),
            # The job process runs no threads: preexec_fn is safe here.
            preexec_fn=_ignore_usr2,
        )
        try:
            code = self._wait_child(run_dir, rank)
        except SystemExit:
            # submitit's USR2 handler requeued the job (rank 0) and is exiting this run.
            if rank == 0:
                self._record_requeue(run_dir, restart, self._why_requeued())
            raise
        except subprocess.CalledProcessError as refused:
            # submitit's `scontrol requeue` after the trainer checkpointed: a site (or a job)
            # without requeue refuses it. The cell stops, resumable, instead of failing here.
            if rank == 0:
                run_dir.record(cellstate.preempted(requeue_refused(refused)))
            return 0
        except UncompletedJobError:
            if self._finished_state is not None:
                # The warning came as the trainer ended: the cell is done (or failed).
                return self._finish(run_dir, rank, restart, self._child.wait(), err_path)
            # No requeue (`checkpoint`): the cell's requeue budget is spent.
            if rank == 0:
                run_dir.record(cellstate.preempted(
                    f"stopped at its time limit after {self.time_min} min, with its requeue budget spent (the "
                    "requeues its planned hours need, or grid.launcher.max_num_timeout); resume it with "
                    "`gridrun resubmit --preempted`"
                ))
            raise
        if rank == 0:
            return self._finish(run_dir, rank, restart, code, err_path)
        if code == cellstate.EXIT_PREEMPTED:
            # Stopped with every rank after the same step: rank 0, still saving the checkpoint,
            # requeues the job. This task's end must not end the step (srun --kill-on-bad-exit).
            return 0
        if code != 0:
            # A failed task ends the job's step at once (srun --kill-on-bad-exit): rank 0
            # records this rank's error (ranks/rank<r>.error) instead of waiting in a collective.
            raise RuntimeError(f"rank {rank} of cell {run_dir.root.name} exited with code {code}; see {err_path}")
        return code

    def _wait_child(self, run_dir: RunDir, rank: int) -> int:
        """The trainer's exit code. Rank 0 stops its trainer as soon as another rank records
        a failure (ranks/rank<r>.error), before srun --kill-on-bad-exit kills this task too,
        so that the cell's state says why (`_finish`), not a collective's timeout."""
        child = self._child
        assert child is not None
        while True:
            try:
                return child.wait(timeout=RANK_POLL_S)
            except subprocess.TimeoutExpired:
                if rank == 0 and run_dir.ranks_failure(self._started) is not None:
                    child.terminate()
                    if not _wait_exit(child.pid, TERM_WAIT_S):
                        child.kill()
                    return child.wait()

    # submitit declares a DelayedSubmission return, and reads None as "do not requeue"
    # (submitit/core/job_environment.py: _checkpoint).
    def checkpoint(self) -> submitit.helpers.DelayedSubmission | None:  # type: ignore[override]
        """SLURM's warning signal (rank 0, in submitit's handler): let the trainer finish its
        step and checkpoint, then hand submitit the same job to requeue (None, no requeue,
        when the trainer ended the cell meanwhile, or when the warning is the time limit's and
        the cell's requeue budget is spent)."""
        # Judged on arrival, as submitit's handler judges it, not after the trainer's stop.
        timeout = timed_out(self._started, self.time_min)
        # This runs inside a signal handler that interrupted `Popen.wait()` (which holds its
        # lock), so the child is watched with waitid(WNOWAIT): nothing is reaped here.
        child = self._child
        grace = max(5.0, self.signal_delay_s - REQUEUE_MARGIN_S)
        if child is not None and not _wait_exit(child.pid, grace, signal.SIGUSR2):
            # Still inside a long step: the newest complete checkpoint will do.
            os.kill(child.pid, signal.SIGTERM)
            if not _wait_exit(child.pid, TERM_WAIT_S):
                os.kill(child.pid, signal.SIGKILL)
        final = RunDir(self.run_dir).read_state().state
        if final in (*FINISHED_STATES, CellState.FAILED):
            self._finished_state = final
            return None
        left = self.timeouts_left
        if timeout and left is not None and left < 1:
            return None  # the requeue budget is spent: `__call__` records the cell preempted
        return submitit.helpers.DelayedSubmission(
            CellJob(self.run_dir, self.time_min, self.signal_delay_s, None if left is None else left - timeout)
        )

    # --- state bookkeeping (rank 0) --------------------------------------------------------
    def _should_run(self, run_dir: RunDir, job_id: str, restart: int, record: bool) -> bool:
        """Whether this job runs the cell (every rank decides alike from state.json); rank 0
        (`record`) opens the next attempt of a requeue its last run could not record."""
        state = run_dir.read_state()
        if state.job_id not in (None, job_id):
            print(f"gridrun: cell now belongs to job {state.job_id}, not {job_id}: exiting", flush=True)
            return False
        if state.state in FINISHED_STATES:
            print(f"gridrun: cell is {state.state}: nothing to run", flush=True)
            return False
        if restart > state.slurm_restarts:
            if record:
                self._record_requeue(run_dir, restart - 1, "requeued by the scheduler")
            return True
        if state.state == CellState.CANCELLED:
            print("gridrun: cell was cancelled before it started: nothing to run", flush=True)
            return False
        return True

    def _record_requeue(self, run_dir: RunDir, restart: int, why: str) -> None:
        """Open the next attempt of a job that SLURM requeued (its restart `restart` + 1). Its
        trainer has exited (or not started): the newest complete checkpoint is the one the
        next attempt resumes from, and the ended attempt's record names it."""
        state = run_dir.read_state()
        if state.slurm_restarts > restart or state.state in FINISHED_STATES:
            return  # recorded already, or nothing left to run
        latest = run_dir.latest_checkpoint()
        resumes = (f"resumes from the checkpoint of step {latest[0]}" if latest
                   else "restarts from step 0: no complete checkpoint")
        # The attempt SLURM ended goes to the history as preempted, whatever it last recorded.
        ended = state.with_(state=CellState.PREEMPTED, error=f"{why}; {resumes}", finished_at=time.time())
        run_dir.record(cellstate.queued(
            ended,
            state.launcher or "slurm",
            job_id=state.job_id,
            requeues=state.requeues + 1,
            slurm_restarts=restart + 1,
        ))

    def _why_requeued(self) -> str:
        if timed_out(self._started, self.time_min):
            return f"requeued near its {self.time_min} min time limit (SIGUSR2)"
        return "preempted (SIGUSR2) and requeued"

    def _finish(self, run_dir: RunDir, rank: int, restart: int, code: int, err_path: Path) -> int:
        """Rank 0 after its trainer exited: record what the trainer could not; fail the job
        (so that sacct agrees) when the cell failed."""
        state = run_dir.read_state()
        if state.state == CellState.CANCELLED:
            restarts = slurm_restarts(os.environ.get("SLURM_JOB_ID", ""))
            if restarts is not None and restarts > restart:
                # SIGTERM of a requeue (scontrol requeue, preemption), not of scancel.
                self._record_requeue(run_dir, restart, "requeued by the scheduler (SIGTERM)")
            return code
        if state.state in (*FINISHED_STATES, CellState.PREEMPTED):
            return code
        if state.state == CellState.RUNNING:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            tail = log_tail(err_path)
            # Killed in a collective when another rank failed: that rank's error is the cause.
            other = run_dir.ranks_failure(state.started_at or self._started)
            run_dir.record(cellstate.failed(other or (
                f"trainer {how} without recording a final state (out of memory?)" + (f"\n{tail}" if tail else "")
            )))
        error = (run_dir.read_state().error or "").strip().splitlines()
        raise RuntimeError(f"cell {run_dir.root.name} failed: {error[-1] if error else f'exit code {code}'}")
