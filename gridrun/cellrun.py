"""`gridrun run <run_dir>`: one cell's process, from its lock to its exit code.

Everything a cell's process owns beyond the training loop is here: the run directory's lock
(one process per cell), state.json's transitions for the run as a whole (started, done,
failed, cancelled, preempted), the signals (SIGTERM/SIGINT cancel; SLURM's SIGUSR2 asks the
trainer, and only it, to stop after its step), the exit codes the launchers read (0 done, 1
failed, 75 preempted: requeue, 143 cancelled), and the base model resolved to files.

A cell's config.yaml says `model.name_or_path: toy` or a hub id (and its fingerprint hashes
exactly that); the directory the toy world is built in, like the local folder a cluster
profile names for a hub id, is a run-time fact of this machine, found (or built) here and
handed to the trainer. This module sits above the training half and the toy world so that
neither imports the other (tests/test_seam.py checks): the toy world's build uses the
trainer's parts, the trainer never sees the toy recipe.

Left out: the loop (gridrun/train/trainer.py) and the build (gridrun/toy/build.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from gridrun.modelfiles import model_dirs_from_env, model_source
from gridrun.seam import cellstate
from gridrun.seam.errors import UserError
from gridrun.seam.runconfig import ModelSpec, RunConfig, ToySpec, load_config
from gridrun.seam.rundir import RUN_DISK_FIXES, NotARunDir, RunDir, disk_error
from gridrun.train.distributed import Dist, require_gpus
from gridrun.train.trainer import Preempted, Trainer

log = logging.getLogger("gridrun")
# The launcher's id of the job running this cell, written into the run's lock file.
JOB_ID_ENV = "GRIDRUN_JOB_ID"


class Cancelled(BaseException):
    """Raised from the SIGTERM/SIGINT handler so that state.json says why the run stopped."""


def model_files(spec: ModelSpec) -> str:
    """What the trainer loads the base model from: the toy world's directory (built once,
    cached by recipe) for `name_or_path: toy`; the local folder the cluster profile's
    model_dirs names for the hub id ($GRIDRUN_MODEL_DIRS, set by the launcher), else
    name_or_path itself (a hub id resolves in the hub cache). `init=random` reads only a
    tokenizer, the default toy world's, mapped into the architecture's vocabulary."""
    if spec.name_or_path == "toy" or spec.init == "random":
        from gridrun.toy.build import ensure_toy_world

        return str(ensure_toy_world(spec.toy or ToySpec()))
    return model_source(spec.name_or_path, model_dirs_from_env())


def write_merged(config: RunConfig, adapter: Path, out: Path) -> None:
    """`gridrun export --merged`: the base model with `adapter` merged in, saved with its
    tokenizer into `out` (loads the model; handed to gridrun/export.py's `export`)."""
    from peft import PeftModel

    from gridrun.train.model import load_base

    base, tokenizer = load_base(config.model, model_files(config.model))
    PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def usr2_stops(dist: Dist) -> Iterator[None]:
    """SIGUSR2 (SLURM's warning, sent to every process of the job step) asks this trainer,
    and only it, to stop after its current step.

    It is blocked in this thread, so every thread started and every process spawned from
    here on (vLLM's engine core, which handles only SIGTERM/SIGINT; sandboxed programs)
    inherits it blocked, across fork and exec: for them it stays pending and never acts (a
    handler, unlike a blocked mask, would be reset to the default, fatal action by exec).
    `Dist.should_stop` takes it at the next step boundary; the handler catches one that a
    thread started earlier receives."""
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: setattr(dist, "stop_requested", True))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})
        signal.signal(signal.SIGUSR2, previous)


def _raise_cancelled(signum: int, frame: Any) -> None:
    raise Cancelled(signal.Signals(signum).name)


def run_cell(path: Path) -> int:
    """Run the cell in `path` to its end under its lock and state; the process exit code. The
    base model's files are resolved inside (`model_files` may build the toy world for minutes:
    the cell is running by then, and a failure is recorded)."""
    # Small CPU models lose an order of magnitude to thread oversubscription when cells share
    # cores; the local launcher parallelises across cells instead. GRIDRUN_THREADS overrides.
    torch.set_num_threads(int(os.environ.get("GRIDRUN_THREADS", "1")))
    run_dir = RunDir(path).require_runnable()
    config = load_config(run_dir.config_yaml)
    dist = Dist.from_env()
    # One process per cell: rank 0 holds the run dir's lock for the job's life (the other
    # ranks run under it); a second `gridrun run` of the cell stops here, naming the holder.
    lock = contextlib.ExitStack()
    if dist.is_main:
        try:
            lock.enter_context(run_dir.hold(job_id=os.environ.get(JOB_ID_ENV)))
        except BaseException:
            dist.close()
            raise
    with lock:
        # Rank 0 alone writes state.json; another rank writes its failure to ranks/rank<r>.error,
        # which rank 0, stopped by the job's end (srun --kill-on-bad-exit), records instead.
        record: Callable[[cellstate.Transition], object] = run_dir.record if dist.is_main else (lambda change: None)
        started = time.time()
        record(cellstate.started(os.getpid(), socket.gethostname(), config.steps_to_train))

        def fail(error: str) -> int:
            try:
                if dist.is_main:
                    # A collective that broke because another rank died (gloo: connection closed)
                    # is not the cause: that rank's own error is.
                    run_dir.record(cellstate.failed(run_dir.ranks_failure(started) or error))
                else:
                    run_dir.write_rank_error(dist.rank, error)
            except NotARunDir as gone:  # the cell's folder was deleted under the run: write nothing
                log.error("%s", gone)
            return 1
        previous = {s: signal.signal(s, _raise_cancelled) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            require_gpus(run_dir.gpus_to_train_on())
            with usr2_stops(dist):
                stopped = Trainer(config, run_dir, model_files(config.model), dist).fit()
        except Cancelled as stop:
            other = run_dir.ranks_failure(started) if dist.is_main else None
            if other is not None:
                record(cellstate.failed(other))
                log.error("%s", other)
                return 1
            record(cellstate.cancelled(f"stopped by {stop}"))
            return 143
        except Preempted as stop:
            record(cellstate.preempted(str(stop)))
            log.info("%s", stop)
            return cellstate.EXIT_PREEMPTED
        except NotARunDir as gone:  # the cell's folder was deleted under the run: write nothing more
            log.error("%s", gone)
            return 1
        except cellstate.IllegalTransition as moved:
            return _superseded(moved)
        except UserError as refused:  # a fix for the user, not a bug: one line
            log.error("%s", refused)
            return fail(str(refused))
        except Exception as err:  # noqa: BLE001 - any failure is recorded in state.json, then the exit code says it
            # A full or read-only disk is one line naming the file and the fix; a bug, its traceback's tail.
            disk = disk_error(err, RUN_DISK_FIXES) if isinstance(err, OSError) else None
            tail = [disk] if disk else traceback.format_exc().strip().splitlines()[-12:]
            log.error("run failed:%s%s", " " if disk else "\n", "\n".join(tail))
            return fail("\n".join(tail))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            dist.close()
        try:
            record(stopped if stopped is not None else cellstate.done())
        except cellstate.IllegalTransition as moved:
            return _superseded(moved)
        return 0


def _superseded(moved: cellstate.IllegalTransition) -> int:
    """The cell was queued again while this run ran (`gridrun resubmit` of a job read lost):
    the new attempt owns state.json, so this run stops writing it; its checkpoints stay for
    the new attempt to resume from."""
    log.error("the cell was queued again while this run ran (%s): stopping without recording; its newest "
              "checkpoint is there for the new attempt", moved)
    return 1
