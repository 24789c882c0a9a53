"""The run directory: the seam between the grid and the trainer.

`RunDir` is the one owner of every path inside a cell's directory; no other code formats
those paths. Both halves import it, so it imports only the standard library (and the seam
modules beside it).

    cells/<cell_id>/
      config.yaml  cell.json  state.json  metrics.jsonl  .run.lock
      checkpoints/step_XXXXXX/  adapters/<name>/ roles.json ... (COMPLETE marker last)
      samples/step_XXXXXX.jsonl  logs/  wandb/  exports/step_XXXXXX/ (`gridrun export`)
      records/{val,test}_step_XXXXXX.json  (per-problem outcomes: gridrun/seam/records.py)

`RunDir.record` is the one writer of state.json: it applies a named transition of
gridrun/seam/cellstate.py, which refuses a change the cell's state machine does not allow.
Reading is tolerant: a damaged state.json or cell.json (bytes that are not UTF-8 JSON, a
value of the wrong type) makes the cell read as the `damaged` state, whose `error` names the
file and the fix, and never raises; damaged metrics.jsonl rows are skipped and reported by
`metrics_damage` (an accuracy outside [0, 1], NaN and Infinity included, damages its row).
A folder without config.yaml (deleted, even under its run) reads `missing`, and `record`
refuses to write into it, as do all of a run's writers (`check_present`): while a RunDir
holds the run, the folder must be the very one it held, not one planned again at its path.
A config.yaml whose bytes do not match the hash cell.json recorded
at plan time (`config_sha256`) reads `damaged`, and `require` refuses it: a cut that still
parses would train with defaults. The check fails closed: a cell.json that is damaged, holds
a null where a planned value belongs, or records no hash vouches for nothing, so its cell
reads `damaged` too until `gridrun plan` writes the record again (only a run dir without any
cell.json, made by hand, is run unchecked). `hold` is the run's exclusive lock (one `gridrun run` per cell);
`held` probes it, the truth about whether a cell that reads running still runs.
Left out: repairing a damaged file (the messages say how), locking between ranks of one job
(rank 0 holds the lock for all of them), and what a metric means (an accuracy, a run's peak:
gridrun/seam/accuracy.py).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gridrun.seam.accuracy import is_accuracy
from gridrun.seam.cellstate import FINISHED_STATES, RECORDED, STATE_FIELDS, CellState, StateRecord, Transition
from gridrun.seam.errors import UserError
from gridrun.seam.records import SPLITS, ValidationRecord

COMPLETE_MARKER = "COMPLETE"
# A checkpoint's role -> adapter map (null: the base model), beside its adapters/ folder.
ROLES_FILE = "roles.json"

_NUMBER = (int, float)
# cell.json's fields that readers use (resources: the local launcher's thread count).
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "kind": (str,),
    "fingerprint": (str,),
    "coords": (dict,),
    "resources": (dict,),
    "config_sha256": (str,),  # config.yaml's bytes as planned
    "schema": (int,),  # the run schema's version it was planned under (gridrun/seam/runconfig.py; absent: 1)
}
# cell.json's fields that vouch for config.yaml: present only with a value (null is damage).
RECORD_NOT_NULL = ("id", "fingerprint", "config_sha256", "schema")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


# ranks/rank<r>.json, written by each rank of a run (gridrun/train/trainer.py) and read by
# `gridrun canary`: where the rank ran and what its last steps cost. `steps` holds up to the
# last RANK_STEPS_KEPT steps, each {step, stages: [{requests, seconds, tokens}], rollout_s,
# update_s, update_tokens, gather_s, and the GPU memory at each hand-over, GiB (null on CPU):
# free_gpu_gb_awake (before the engine sleeps), free_gpu_gb_asleep (before the update),
# free_gpu_gb_updated (after it), trainer_peak_gb (the trainer's reserved peak in it),
# free_gpu_gb_released (the trainer's cache returned, before the wake), trainer_kept_gb (what
# the trainer keeps beside the engine), free_gpu_gb_woken (after the wake)}.
RANK_FIELDS: dict[str, tuple[type, ...]] = {
    "rank": (int,),
    "world": (int,),
    "host": (str,),
    # The process's CUDA_VISIBLE_DEVICES, which its rollout engine inherits (None: unset).
    "cuda_visible_devices": (str,),
    # The trainer's torch device, e.g. cuda:0 (the one visible GPU) or cpu.
    "device": (str,),
    "gpu_uuid": (str,),
    "gpu_name": (str,),
    "gpu_total_gb": _NUMBER,
    "engine": (str,),
    "steps": (list,),
}
RANK_STEPS_KEPT = 20


def config_digest(data: bytes) -> str:
    """The hash cell.json records of config.yaml's bytes (`config_sha256`)."""
    return hashlib.sha256(data).hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates 0600 files; run dirs are read by colleagues on shared clusters.
_FILE_MODE = 0o666 & ~_umask()


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` of the text in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, rename: readers see old or new,
    and a failed write (a full disk) leaves no temp file and names `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        # A full disk fails the write with no file name: name the file being written.
        raise OSError(err.errno, err.strerror, str(path)) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# errno -> the fix, for a disk that refuses a write into a cell's folder under `gridrun run`.
_FREE_SPACE = "free space there, then run the cell again: it resumes from its newest complete checkpoint"
_COPY_IT = "or copy the cell's folder to a disk you can write and run it there"
RUN_DISK_FIXES = {
    errno.ENOSPC: _FREE_SPACE,
    errno.EDQUOT: _FREE_SPACE,
    errno.EROFS: f"remount it read-write, {_COPY_IT}",
    errno.EACCES: f"fix its permissions, {_COPY_IT}",
    errno.EPERM: f"fix its permissions, {_COPY_IT}",
}


def disk_error(err: OSError, fixes: Mapping[int, str]) -> str | None:
    """One line naming the file, the reason and the fix (`fixes`: errno -> fix) for an error
    of the disk; None for other errors (a bug, shown with its traceback)."""
    fix = fixes.get(err.errno or 0)
    if fix is None:
        return None
    where = f" {err.filename}" if err.filename else ""
    return f"cannot write{where}: {err.strerror}: {fix}"


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


class NotARunDir(UserError, ValueError):
    """Raised for a directory that holds no planned cell."""


class DamagedFile(UserError, ValueError):
    """A file of a run dir that cannot be read as what it should be; the message names the fix."""


class FinalState(UserError):
    """`gridrun run` of a cell that is done or stopped."""


class RunLocked(UserError, RuntimeError):
    """Another process holds the run's lock (it is running the cell)."""


def _take(fd: int, patience_s: float = 2.0) -> bool:
    """The exclusive lock on `fd`, or False when a run holds it. A refusal while only probes
    (`RunDir.held`'s shared locks, held for microseconds) are on it is retried, not reported."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # an exclusive holder: a run
        fcntl.flock(fd, fcntl.LOCK_UN)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def read_json_file(path: Path, fields: dict[str, tuple[type, ...]], fix: str) -> dict[str, Any] | None:
    """A JSON object whose `fields` have their types (or are null); None when the file is
    absent; DamagedFile, naming the path and `fix`, for anything else."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise DamagedFile(f"{path} cannot be read ({err.strerror}): {fix}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise DamagedFile(f"{path} is damaged (not UTF-8 text): {fix}") from None
    except ValueError:
        raise DamagedFile(f"{path} is damaged (not JSON): {fix}") from None
    if not isinstance(data, dict):
        raise DamagedFile(f"{path} is damaged (a JSON {type(data).__name__}, not an object): {fix}")
    for key, value in data.items():
        types = fields.get(key)
        # Exact types: json gives no subclasses, and a bool is never a count or a time here.
        if types is not None and value is not None and type(value) not in types:
            raise DamagedFile(f"{path} is damaged ({key} is {value!r}, not {types[0].__name__}): {fix}")
    return data


def _positive(count: Any) -> int | None:
    """`count` when it is a positive int (not a bool), else None."""
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


class RunDir:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        # (device, inode) of the folder while this object holds the run (`hold`).
        self._identity: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    # --- paths -------------------------------------------------------------------------
    @property
    def config_yaml(self) -> Path:
        return self.root / "config.yaml"

    @property
    def cell_json(self) -> Path:
        return self.root / "cell.json"

    @property
    def state_json(self) -> Path:
        return self.root / "state.json"

    @property
    def run_lock(self) -> Path:
        """Locked (flock) by the process running the cell; holds its pid, host and job id."""
        return self.root / ".run.lock"

    @property
    def metrics_jsonl(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step:06d}"

    def export(self, step: int) -> Path:
        """`gridrun export`'s default folder for the adapters of `step`."""
        return self.root / "exports" / f"step_{step:06d}"

    @property
    def samples_dir(self) -> Path:
        return self.root / "samples"

    def samples(self, step: int) -> Path:
        return self.samples_dir / f"step_{step:06d}.jsonl"

    @property
    def records_dir(self) -> Path:
        return self.root / "records"

    def record_file(self, split: str, step: int) -> Path:
        """The per-problem record of one evaluation (`split`: val or test)."""
        return self.records_dir / f"{split}_step_{step:06d}.json"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def stdout_log(self) -> Path:
        return self.logs_dir / "stdout.log"

    @property
    def stderr_log(self) -> Path:
        return self.logs_dir / "stderr.log"

    def rank_logs(self, rank: int) -> tuple[Path, Path]:
        """stdout and stderr of one rank of a multi-task job (rank 0 writes the two above)."""
        if rank == 0:
            return self.stdout_log, self.stderr_log
        return self.logs_dir / f"rank{rank}.stdout.log", self.logs_dir / f"rank{rank}.stderr.log"

    @property
    def wandb_dir(self) -> Path:
        return self.root / "wandb"

    # --- ranks -------------------------------------------------------------------------
    @property
    def ranks_dir(self) -> Path:
        return self.root / "ranks"

    def rank_record(self, rank: int) -> Path:
        """One rank's own record (each rank writes its own; rank 0 also writes the rest)."""
        return self.ranks_dir / f"rank{rank}.json"

    def write_rank_record(self, rank: int, record: Mapping[str, Any]) -> None:
        self.check_present("stopped writing its rank record")  # a deleted cell stays deleted
        self.ranks_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.rank_record(rank), dict(record))

    def read_rank_records(self) -> list[dict[str, Any]]:
        """Every rank's readable record, by rank (RANK_FIELDS; a damaged one is skipped)."""
        records = []
        for path in sorted(self.ranks_dir.glob("rank*.json")):
            try:
                record = read_json_file(path, RANK_FIELDS, "it is rewritten by its rank at the next step")
            except DamagedFile:
                continue
            if record is not None:
                records.append(record)
        return sorted(records, key=lambda r: int(r.get("rank") or 0))

    def rank_error(self, rank: int) -> Path:
        """The error of a rank > 0 whose trainer failed (rank 0 writes state.json; the job
        then ends every rank: rank 0 records this instead of its own stop)."""
        return self.ranks_dir / f"rank{rank}.error"

    def write_rank_error(self, rank: int, error: str) -> None:
        self.check_present("stopped writing its rank error")
        self.ranks_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.rank_error(rank), error)

    def ranks_failure(self, since: float) -> str | None:
        """`rank <r> failed: <error>` of the first rank > 0 that failed after `since` (the
        attempt's start), None if none did."""
        for path in sorted(self.ranks_dir.glob("rank*.error")):
            try:
                if path.stat().st_mtime >= since:
                    return f"{path.stem.replace('rank', 'rank ')} failed: {path.read_text(errors='replace').strip()}"
            except OSError:
                continue
        return None

    # --- validation --------------------------------------------------------------------
    def require(self) -> RunDir:
        """Fail with the fix when this is not a planned cell's directory, or its config.yaml
        is not the file planned (`config_damage`)."""
        self.require_folder()
        damage = self.config_damage()
        if damage:
            raise DamagedFile(damage)
        return self

    def require_folder(self) -> RunDir:
        """Fail with the fix when this is not a cell's folder with a config.yaml of text (what
        `gridrun show` needs to show a cell, damaged or not)."""
        if self.root.exists() and not self.root.is_dir():
            raise NotARunDir(
                f"{self.root} is a file, not a cell directory: pass one such as results/<sweep>/cells/<cell_id>"
            )
        if not self.root.is_dir():
            raise NotARunDir(f"{self.root} does not exist: plan it with `gridrun plan conf=<sweep>`")
        if not self.config_yaml.is_file():
            raise NotARunDir(
                f"{self.root} is not a run dir (no config.yaml): pass a cell directory "
                "such as results/<sweep>/cells/<cell_id>"
            )
        try:
            self.config_yaml.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise DamagedFile(
                f"{self.config_yaml} is damaged (not UTF-8 text): re-plan its sweep "
                "(`gridrun plan conf=<sweep>`, with --replace if it says so) to write it again"
            ) from None
        return self

    def require_runnable(self) -> RunDir:
        """`require`, and refuse a cell whose state is final (done, stopped): `gridrun run`
        trains it no further, as `resubmit` does not take it."""
        self.require()
        final = self._read_state_file().state  # require() has vetted config.yaml: state.json alone
        if final in FINISHED_STATES:
            raise FinalState(f"{self.root.name} is {final}, which is final: `gridrun run` trains it no further (to run "
                             "it again, re-plan its sweep with --replace, which keeps the old run under replaced/)")
        return self

    def config_damage(self) -> str | None:
        """Why config.yaml cannot be trusted as the file planned, with the fix: its bytes do
        not match cell.json's `config_sha256`, or cell.json cannot vouch for them (damaged, or
        without a hash); None when it matches, or for a run dir with no cell.json at all (made
        by hand: there is no plan to hold it to)."""
        try:
            record = self.read_record()
        except DamagedFile as err:
            return str(err)
        if record is None:
            return None
        expected = record.get("config_sha256")
        if not isinstance(expected, str) or not SHA256_HEX.fullmatch(expected):
            return (f"{self.cell_json} records no hash of config.yaml (config_sha256), so nothing vouches for it: "
                    "re-plan its sweep (`gridrun plan conf=<sweep>`) to record it")
        try:
            if config_digest(self.config_yaml.read_bytes()) == expected:
                return None
        except OSError:
            return None  # config.yaml gone or unreadable: `missing` and `require` say so
        return (
            f"{self.config_yaml} is damaged (it is not the file planned: its hash differs from the one in "
            f"{self.cell_json.name}; truncated or edited?): re-plan its sweep (`gridrun plan conf=<sweep>`) "
            "to write it again"
        )

    # --- state -------------------------------------------------------------------------
    def _state_fix(self) -> str:
        return (
            f"delete it (`rm {self.state_json}`) and the cell reads as planned, resuming from its newest "
            "checkpoint when dispatched again"
        )

    def missing(self) -> str | None:
        """Why this is no longer a planned cell's folder (deleted, or its config.yaml is), with
        the fix; None while config.yaml is there."""
        if self.config_yaml.is_file():
            return None
        if not self.root.exists():
            return f"{self.root} is gone (deleted?): `gridrun plan conf=<sweep>` plans the cell again"
        return (
            f"{self.config_yaml} is gone (deleted?): `gridrun plan conf=<sweep>` writes it again (a folder that "
            "still holds metrics or checkpoints needs --replace, which moves it to replaced/)"
        )

    def _folder_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.root)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def check_present(self, doing: str = "stopped writing") -> None:
        """NotARunDir, naming the fix, unless this is still the planned cell's folder: config.yaml
        is there and, while this object holds the run, it is the folder it held. Every writer
        of a run's files calls it first, so a folder deleted under its run stays deleted."""
        gone = self.missing()
        if gone:
            raise NotARunDir(f"{doing}: {gone}")
        if self._identity is not None and self._folder_identity() != self._identity:
            raise NotARunDir(
                f"{doing}: {self.root} was deleted and planned again under this run, whose results are not the new "
                "cell's: run the new cell (`gridrun sweep conf=<sweep>`)"
            )

    def read_state(self) -> StateRecord:
        """state.json, `planned` when absent, the `damaged` state naming the file and fix (a
        config.yaml that is not the one planned included), or `missing` when the folder or its
        config.yaml is gone (whatever state.json says)."""
        record = self._read_state_file()
        if record.state in (CellState.MISSING, CellState.DAMAGED):
            return record
        damage = self.config_damage()
        return record.with_(state=CellState.DAMAGED, error=damage) if damage else record

    def _read_state_file(self) -> StateRecord:
        gone = self.missing()
        if gone:
            return StateRecord.derived(CellState.MISSING, gone)
        recorded = sorted(state.value for state in RECORDED)
        try:
            data = read_json_file(self.state_json, STATE_FIELDS, self._state_fix())
            if data is not None and data.get("state") not in recorded:
                raise DamagedFile(
                    f"{self.state_json} is damaged (state {data.get('state')!r} is none of "
                    f"{', '.join(recorded)}): {self._state_fix()}"
                )
        except DamagedFile as err:
            return StateRecord.derived(CellState.DAMAGED, str(err))
        return StateRecord.from_json(data) if data is not None else StateRecord.derived(CellState.PLANNED)

    def read_record(self) -> dict[str, Any] | None:
        """cell.json (the plan's record of the cell), None when absent; DamagedFile if damaged."""
        fix = "re-plan the sweep (`gridrun plan conf=<sweep>`) to write it again from config.yaml"
        record = read_json_file(self.cell_json, RECORD_FIELDS, fix)
        for key in RECORD_NOT_NULL:
            if record is not None and key in record and record[key] is None:
                raise DamagedFile(f"{self.cell_json} is damaged ({key} is null): {fix}")
        if record is not None and isinstance(record.get("schema"), int) and record["schema"] < 1:
            raise DamagedFile(f"{self.cell_json} is damaged (schema {record['schema']} is not a version): {fix}")
        return record

    def _planned_resources(self) -> dict[str, Any]:
        """cell.json's resources ({} when cell.json is absent or damaged: a run dir made by hand)."""
        try:
            return dict((self.read_record() or {}).get("resources") or {})
        except DamagedFile:
            return {}

    def planned_count(self, resource: str) -> int | None:
        """A positive count the plan gave this cell (cell.json's resources: "cpus", "gpus");
        None when it gave none, or cell.json is absent or damaged (a run dir made by hand)."""
        return _positive(self._planned_resources().get(resource))

    def gpus_to_train_on(self) -> int:
        """GPUs the cell's trainer must be able to use: cell.json's resources.gpus, 0 where the
        plan asked for them for their binding only (`gridrun canary --cpu` on SLURM)."""
        resources = self._planned_resources()
        return 0 if resources.get("binding_only") is True else (_positive(resources.get("gpus")) or 0)

    def inspect(self) -> StateRecord:
        """The state as `gridrun show` shows it: state.json's, unless state.json or cell.json
        is damaged, then `damaged` with the first damaged file's message as the error.
        (`gridrun status` reads state.json alone: cell.json is `plan`'s to repair.)"""
        record = self.read_state()
        if record.state == CellState.DAMAGED:
            return record
        try:
            self.read_record()
        except DamagedFile as err:
            return record.with_(state=CellState.DAMAGED, error=str(err))
        return record

    def record(self, change: Transition) -> StateRecord:
        """The one writer of state.json: apply a named transition (gridrun/seam/cellstate.py) to
        the record read now and write it atomically; IllegalTransition, writing nothing, when
        the state read may not take it. Fields the transition does not name are kept.

        A damaged state.json is moved aside (state.json.damaged-<time>), never merged into;
        the transition then writes what it knows (there is no state to judge it from). A
        missing cell (its folder deleted, even under a running trainer) is NotARunDir, and
        nothing is written: a write would bring back a folder with no config.yaml."""
        self.check_present(f"cannot record {change.name}")
        current = self._read_state_file()  # a damaged config.yaml leaves state.json's history as is
        if current.state == CellState.MISSING:
            raise NotARunDir(f"cannot record {change.name}: {current.error}")
        damaged = current.state == CellState.DAMAGED
        if damaged:
            self.state_json.rename(self.root / f"{self.state_json.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        data = change.apply(None if damaged else current.to_json())
        data["updated_at"] = time.time()
        atomic_write_json(self.state_json, data)
        return StateRecord.from_json(data)

    # --- the run's lock ------------------------------------------------------------------
    @contextmanager
    def hold(self, job_id: str | None = None) -> Iterator[None]:
        """Hold the run's exclusive lock for the block; RunLocked naming the holder if taken.

        flock belongs to the open file, so the OS releases it when the holder dies (kill -9
        included) and a stale lock file is harmless. The holder writes its pid, host and job
        id into the file for the refusal message."""
        import socket  # here: `gridrun status` imports this module and never locks

        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_lock, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        try:
            if not _take(fd):
                raise RunLocked(self._holder_message(fd))
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "job_id": job_id, "since": time.time()}
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
            except OSError as err:
                raise OSError(err.errno, err.strerror, str(self.run_lock)) from err
            self._identity = self._folder_identity()
            yield
        finally:
            self._identity = None
            os.close(fd)

    def held(self) -> bool:
        """Whether a live process holds the run's lock now: the truth about a cell that reads
        running (a process killed with -9 cannot update state.json, but the OS drops its lock).
        A shared lock, taken and dropped at once, probes it; `hold` waits out such probes.
        flock is per host on some shared file systems: trust a free lock for this host's runs."""
        try:
            fd = os.open(self.run_lock, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the probe's shared lock
        return False

    def _holder_message(self, fd: int) -> str:
        try:
            holder = json.loads(os.pread(fd, 4096, 0).decode())
            who = f"process {holder['pid']} on {holder['host']}" + (
                f" (job {holder['job_id']})" if holder.get("job_id") else ""
            )
        except (ValueError, KeyError, TypeError):
            who = "another process"  # it took the lock and has not written its name yet
        return (
            f"{self.root} is already being run by {who}: wait for it to end, or stop it "
            "(`gridrun cancel conf=<sweep> --cells <id>`) before running the cell again"
        )

    # --- metrics -----------------------------------------------------------------------
    def append_metrics(self, rows: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        if not lines:
            return
        if self._identity is not None:  # the run's own writer (tools and tests append to bare folders)
            self.check_present()
        try:
            with open(self.metrics_jsonl, "a") as handle:
                handle.write(lines)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:  # a full disk names no file: name it
            raise OSError(err.errno, err.strerror, str(self.metrics_jsonl)) from err

    def _metric_lines(self) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
        """(line number, row or None, why not) for each line of metrics.jsonl."""
        try:
            raw = self.metrics_jsonl.read_bytes()
        except FileNotFoundError:
            return
        for number, line in enumerate(raw.splitlines(), 1):
            yield (number, *_metric_row(line))

    def read_metrics(self) -> list[dict[str, Any]]:
        """The readable rows of metrics.jsonl, in order; damaged lines are skipped (a line torn
        by a kill mid-write is one: rows after it are rewritten on resume)."""
        return [row for _, row, _ in self._metric_lines() if row is not None]

    def metrics_damage(self) -> str | None:
        """What is wrong with metrics.jsonl, if anything but a torn last line, with the fix."""
        return self.read_metrics_checked()[1]

    def read_metrics_checked(self) -> tuple[list[dict[str, Any]], str | None]:
        """(`read_metrics()`, `metrics_damage()`) from one read of the file."""
        lines = list(self._metric_lines())
        rows = [row for _, row, _ in lines if row is not None]
        bad = [(number, why) for number, row, why in lines[:-1] if row is None]
        if lines and lines[-1][1] is None and lines[-1][2] != "torn":
            bad.append((lines[-1][0], lines[-1][2]))
        if not bad:
            return rows, None
        number, why = bad[0]
        more = f" and {len(bad) - 1} more line(s)" if len(bad) > 1 else ""
        return rows, (
            f"{self.metrics_jsonl} line {number}{more} is damaged ({why}): those rows are skipped; "
            "restore the file, or delete the damaged lines to silence this"
        )

    def truncate_metrics(self, last_step: int, drop_splits: Collection[str] = ()) -> list[dict[str, Any]]:
        """Keep rows up to `last_step` (resuming from a checkpoint replays what came after),
        and none of `drop_splits` (the test row, which training on past its step replaces);
        returns the rows kept."""
        kept = [row for row in self.read_metrics()
                if row.get("step", 0) <= last_step and row.get("split") not in drop_splits]
        atomic_write_text(self.metrics_jsonl, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        return kept

    def set_metrics_aside(self) -> Path | None:
        """Move metrics.jsonl to the first free `metrics.jsonl.replaced-<n>` (a restart from
        step 0 whose earlier rows no checkpoint matches); None when it holds no rows."""
        if not self.read_metrics():
            self.metrics_jsonl.unlink(missing_ok=True)
            return None
        n = 1
        while (aside := self.metrics_jsonl.with_name(f"{self.metrics_jsonl.name}.replaced-{n}")).exists():
            n += 1
        os.replace(self.metrics_jsonl, aside)
        return aside

    # --- per-problem records -----------------------------------------------------------
    def write_record(self, record: ValidationRecord) -> None:
        if self._identity is not None:  # the run's own writer (tools and tests write to bare folders)
            self.check_present()
        self.records_dir.mkdir(exist_ok=True)
        atomic_write_text(self.record_file(record.split, record.step), json.dumps(record.to_json(), separators=(",", ":")))

    def read_records(self, split: str) -> tuple[dict[int, ValidationRecord], list[str]]:
        """step -> record of one split, and a line per file that could not be read (that
        record is left out, nothing else is affected; the aggregate rows still hold its number)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}")
        found: dict[int, ValidationRecord] = {}
        damage: list[str] = []
        paths = sorted(self.records_dir.glob(f"{split}_step_*.json")) if self.records_dir.is_dir() else []
        for path in paths:
            try:
                record = ValidationRecord.from_json(json.loads(path.read_bytes().decode("utf-8")))
            except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:  # JSONDecodeError: a ValueError
                damage.append(f"{path} is damaged ({err}): its evaluation is compared unpaired; "
                              "restore it or delete it to silence this")
                continue
            if path != self.record_file(record.split, record.step):
                damage.append(f"{path} holds the record of {record.split} step {record.step}: left out; "
                              "restore the right file or delete it")
                continue
            found[record.step] = record
        return found, damage

    def drop_records_after(self, last_step: int, drop_splits: Collection[str] = ()) -> None:
        """Remove the records of steps after `last_step` (a resume replays them) and every
        record of `drop_splits`."""
        if not self.records_dir.is_dir():
            return
        for path in self.records_dir.glob("*_step_*.json"):
            try:
                step = int(path.stem.rsplit("_", 1)[1])
            except ValueError:
                continue
            if step > last_step or path.stem.split("_step_", 1)[0] in drop_splits:
                path.unlink(missing_ok=True)

    # --- checkpoints -------------------------------------------------------------------
    def complete_checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of checkpoints with their COMPLETE marker, oldest first."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for path in self.checkpoints_dir.iterdir():
            if path.name.startswith("step_") and (path / COMPLETE_MARKER).exists():
                try:
                    found.append((int(path.name[5:]), path))
                except ValueError:
                    continue
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        found = self.complete_checkpoints()
        return found[-1] if found else None


def adapter_dir(checkpoint: Path, adapter: str) -> Path:
    """A checkpoint's peft folder of one adapter (peft writes a non-"default" adapter into a
    subfolder named after it)."""
    return checkpoint / "adapters" / adapter


def _metric_row(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """A metrics row (flat: `step`, `split`, then /-namespaced numbers), or None and why not."""
    try:
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except ValueError:
        # A row cut short by a kill: JSON that opens and never closes.
        return None, "torn" if line.lstrip().startswith(b"{") and not line.rstrip().endswith(b"}") else "not JSON"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(row.get("split"), str):
        return None, "no integer step or no split"
    for key, value in row.items():
        if key != "split" and value is not None and not isinstance(value, _NUMBER):
            return None, f"{key} is {value!r}, not a number"
        # json reads NaN and Infinity; no accuracy is either, or outside [0, 1].
        if value is not None and is_accuracy(key) and not (isinstance(value, _NUMBER) and 0 <= value <= 1):
            return None, f"{key} is {value!r}, not an accuracy in [0, 1]"
    return row, ""
