"""The SLURM launcher (`launcher=slurm`): cells as submitit jobs, submitted and left to run.

    gridrun sweep conf=full_matrix cluster=paper launcher=slurm    queues the jobs and exits
    gridrun status conf=full_matrix                                 one sacct call for every cell

Submitting. Each cell's scheduler resources (its `job spec`) come from the cell's record in
sweep.json (GPU class, GPUs, CPUs, memory, time limit and partition, frozen at plan time)
and the sweep's cluster profile (conf/cluster/<name>.yaml: GPU types for --gpus-per-task,
constraints, account, qos, tasks per cell, extra #SBATCH lines, setup lines, per-cell
overrides). Cells with equal specs go out as one submitit job array, `--array` capped at
`grid.launcher.max_parallel` running at once and cut into chunks of the cluster's MaxArraySize.
Before anything is queued, `admit` checks each spec with `sbatch --test-only`, so a wrong
partition, account or gres is one line naming the fix, not a sweep of failed jobs.

Jobs. Every job runs `CellJob` (gridrun/grid/launchers/slurm_job.py) with the submitter's
python (`process.interpreter`): one task per GPU, bound per task (`--gpus-per-task=[type:]1`,
typed by the profile's `gpu_types`; never a job-wide `--gres`, under which every task would see
every GPU), each starting `python -P -m gridrun.cli run <run_dir>` as a data-parallel rank; a
`tasks_per_cell` other than the cell's GPU count is refused. SLURM's warning (USR2, by hand or
before the time limit) makes the trainer alone checkpoint after its step (gridrun/cellrun.py
`usr2_stops`); the job requeues itself (submitit's Checkpointable) and resumes there as the
cell's next attempt, within the cell's own budget (`requeue_budget`: the segments its planned
hours take at 1.5x, each the limit less the warning's lead and a restart; shown in the dry run;
`grid.launcher.max_num_timeout` sets one for every cell); past it the cell stops `preempted`.
The warning's lead per array (`warning_lead_s`): twice the slowest cell's estimated step plus
CHECKPOINT_S (120 s to write and fsync a checkpoint), at least `grid.launcher.signal_delay_s`;
a lead over half the time limit is refused, naming the profile's `time_limit_h`.
An array sbatch accepts hands its ids to `accepted` at once (dispatch.py writes them to the
cells' state.json), so a submission cut short keeps them; an array sbatch refuses (a per-user
job limit such as MaxSubmitJobs, which `sbatch --test-only` on one job does not see) stops
the submission with `PartlySubmitted`, naming the cells left out.

Watching. `reconcile` asks sacct (or squeue when accounting is off) about every active cell
at once. A cell's own state.json wins when it says done/failed/cancelled/preempted; the
scheduler speaks for cells whose job died without a word: CANCELLED -> cancelled,
TIMEOUT/PREEMPTED -> preempted, NODE_FAIL/OUT_OF_MEMORY/FAILED/BOOT_FAIL -> failed. `gridrun
resubmit --failed` (and --preempted, --cells) queues them again until a cell has failed
`grid.launcher.max_attempts` times (a preempted, cancelled or requeued attempt is no failure).

Dependencies. A cell that needs others (a transfer cell its sa_rl cell) is submitted after
them with `--dependency=afterok:<their jobs>` (none for needs already done): SLURM starts it
once they complete, and never when one fails (its job waits, DependencyNeverSatisfied;
`gridrun status` reads it blocked). Resubmitting the failed need submits the blocked cell
again, after cancelling its stale job.

Left out: several nodes per cell, heterogeneous jobs, clusters without `srun`. Standard
library until a job is submitted (`gridrun status` imports this module to reconcile).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import io
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridrun.grid import PACKAGE_DIR
from gridrun.grid.errors import GridError
from gridrun.grid.launchers.base import Accepted, Launcher, LauncherSettings, PartlySubmitted, launcher_settings
from gridrun.grid.launchers.cluster import CellOverride, ClusterSpec, cluster_spec
from gridrun.grid.launchers.observe import observe_cells, sweep_needs
from gridrun.grid.launchers.process import interpreter_line
from gridrun.modelfiles import model_dirs_env
from gridrun.seam import cellstate
from gridrun.seam.cellstate import CellState, StateRecord

if TYPE_CHECKING:
    from gridrun.grid.sweepdir import PlanEntry, SweepDir

log = logging.getLogger("gridrun")

# Environment forwarded to jobs explicitly (sbatch also exports the submitter's environment,
# but site configs may turn that off): jobs call scontrol (SLURM_CONF) to requeue themselves
# and share the toy-world cache and prepared data with the submitter.
# HF_HOME too: the hub cache `gridrun fetch` filled on the login node is the one jobs read.
FORWARDED_ENV = ("SLURM_CONF", "GRIDRUN_CACHE", "GRIDRUN_DATA", "GRIDRUN_LOG", "HF_HOME")
SETUP_SCRIPT = PACKAGE_DIR / "slurm" / "setup_node.sh"
# Scheduler states of a job that is still on its way (sacct and squeue spellings).
SCHEDULER_ACTIVE = (
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "CONFIGURING",
    "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED", "RESV_DEL_HOLD",
)
# A finished job whose cell still reads active: what the cell is, and why (the trainer could
# not say it: killed, out of memory, lost node, time limit).
SCHEDULER_FINAL: dict[str, tuple[str, str]] = {
    "CANCELLED": ("cancelled", "job {job} was cancelled (scancel); resume it with `gridrun resubmit --cells {cell}`"),
    "TIMEOUT": ("preempted", "job {job} hit its time limit; resume it with `gridrun resubmit --preempted`"),
    "PREEMPTED": ("preempted", "job {job} was preempted; resume it with `gridrun resubmit --preempted`"),
    "NODE_FAIL": ("failed", "job {job}: its node failed (NODE_FAIL); resume it with `gridrun resubmit --failed`"),
    "OUT_OF_MEMORY": (
        "failed",
        (
            "job {job} ran out of memory (OUT_OF_MEMORY): raise mem_gb_per_cell in the cluster profile, "
            "re-plan, then `gridrun resubmit --failed`"
        ),
    ),
    "BOOT_FAIL": ("failed", "job {job}: its node failed to boot (BOOT_FAIL); `gridrun resubmit --failed`"),
    "DEADLINE": ("failed", "job {job} missed its deadline; `gridrun resubmit --failed`"),
    "FAILED": ("failed", "job {job} failed (exit {exit}) before the trainer recorded why; see {logs}"),
    "COMPLETED": ("failed", "job {job} ended without the trainer recording a final state; see {logs}"),
}
# A job that finished this recently may still be writing its cell's final state.
SETTLE_S = 30.0
# A job sbatch just accepted may not be in sacct's database yet.
SUBMIT_LAG_S = 120.0


@dataclass
class SlurmSettings(LauncherSettings):
    """launcher=slurm: its settings' one home (gridrun/grid/compose.py stores them with Hydra
    at their defaults; conf/launcher/slurm.yaml places them and names the launcher)."""

    name: str = "slurm"
    # Array elements running at once per job array (sbatch --array=0-N%max_parallel);
    # `gridrun sweep --max-parallel N` overrides it.
    max_parallel: int | None = 64
    # The least seconds between SLURM's warning signal (USR2, to the trainer only) and the time
    # limit: the trainer finishes its current step, checkpoints, and the job requeues itself.
    # Each array's lead is derived from its cells' estimated step (`warning_lead_s`); this is its floor.
    signal_delay_s: int = 300
    # Requeues at the time limit every cell may take (submitit's max_num_timeout); then it stops
    # as `preempted` (`gridrun resubmit --preempted` resumes it). Preemptions do not count.
    # null: each cell's own budget, from its planned hours (`requeue_budget`).
    max_num_timeout: int | None = None
    # Failed attempts of one cell after which `gridrun resubmit` refuses it; preempted,
    # cancelled and requeued attempts are no failures.
    max_attempts: int = 5


def _command_timeout() -> float:
    return float(os.environ.get("GRIDRUN_SLURM_TIMEOUT", "60"))


def _run(args: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client; a missing binary or a hang is one line naming the fix."""
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=_command_timeout(), check=False)
    except FileNotFoundError:
        raise GridError(
            f"{args[0]} is not on PATH ({what}): run gridrun on a SLURM login node, start the test cluster "
            "with `eval \"$(slurm/testcluster/up.sh)\"`, or use launcher=local"
        ) from None
    except subprocess.TimeoutExpired:
        raise GridError(
            f"`{' '.join(args[:3])} ...` did not answer in {_command_timeout():.0f}s ({what}): is slurmctld up "
            "(`scontrol ping`)? Raise the wait with GRIDRUN_SLURM_TIMEOUT=<seconds>"
        ) from None
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise GridError(f"{args[0]} failed ({what}): {detail[-1] if detail else f'exit {result.returncode}'}")
    return result


# sbatch under a deadline: coreutils' timeout ends a hung client; its exit 124 becomes the line.
_SBATCH_WITH_DEADLINE = (
    'timeout --kill-after=5 "$0" sbatch "$@"; status=$?; [ "$status" -eq 124 ] && echo "sbatch did not answer in $0 s '
    '(submitting): is slurmctld up (scontrol ping)? Raise the wait with GRIDRUN_SLURM_TIMEOUT=<seconds>" >&2; '
    'exit "$status"'
)


@contextlib.contextmanager
def _sbatch_deadline() -> Iterator[None]:
    """submitit's sbatch call under a deadline while gridrun submits (submitit sets none): a
    hung sbatch fails the submission after the SLURM client timeout, in one line. submitit
    submits an array through a SlurmExecutor of its own making, so the class's command is
    wrapped for the submission's duration, not one executor's."""
    from submitit.slurm import slurm as submitit_slurm

    plain = submitit_slurm.SlurmExecutor._make_submission_command

    def with_deadline(executor: Any, submission_file_path: Path) -> list[str]:
        command: list[str] = plain(executor, submission_file_path)
        return ["sh", "-c", _SBATCH_WITH_DEADLINE, f"{_command_timeout():g}", *command[1:]]

    submitit_slurm.SlurmExecutor._make_submission_command = with_deadline  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        submitit_slurm.SlurmExecutor._make_submission_command = plain  # type: ignore[method-assign, assignment]


# --- shared storage -------------------------------------------------------------------------
# Folders every machine keeps to itself: a path under one is on the login node only.
NODE_LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
# Filesystems that live in one machine's memory.
NODE_LOCAL_FS = ("tmpfs", "ramfs")


def _mount_type(path: Path) -> str | None:
    """The filesystem type of the mount holding `path` (/proc/self/mounts), if it can be read."""
    try:
        mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return None
    best = max((m for m in mounts if len(m) > 2 and path.is_relative_to(m[1])), key=lambda m: len(m[1]), default=None)
    return best[2] if best else None


def node_local(path: Path) -> str | None:
    """Why `path` is on this machine only (under /tmp, $TMPDIR or a tmpfs), or None."""
    resolved = path.expanduser().resolve()
    tmpdir = os.environ.get("TMPDIR", "").rstrip("/")
    for root in (*NODE_LOCAL_ROOTS, *([tmpdir] if tmpdir else [])):
        if resolved.is_relative_to(Path(root).resolve()):
            return f"under {root}"
    fs = _mount_type(resolved)
    return f"on a {fs} filesystem" if fs in NODE_LOCAL_FS else None


def shared_paths(results: Path, cluster: ClusterSpec, env: Mapping[str, str] | None = None) -> dict[str, Path]:
    """What a job on another node reads at the path the login node has: the venv's python
    (the job script runs it by absolute path), the results root, the hub cache's HF_HOME
    and the profile's local model folders."""
    env = os.environ if env is None else env
    paths = {
        "the venv's python (the job script runs it by this path)": Path(sys.executable).parent,
        "the results root (--results-dir)": results,
        "HF_HOME (the models `gridrun fetch` put there)": Path(env.get("HF_HOME") or "~/.cache/huggingface"),
    }
    paths.update({f"model_dirs' folder of {repo}": Path(folder) for repo, folder in cluster.model_dirs.items()})
    return paths


def check_shared(results: Path, cluster: ClusterSpec, env: Mapping[str, str] | None = None) -> None:
    """Refuse to submit when a path a job needs is on the login node only (one line naming it)."""
    for what, path in shared_paths(results, cluster, env).items():
        why = node_local(path)
        if why is not None:
            raise GridError(
                f"{what} is {path}, {why}: a job on a compute node cannot see it. Put it on storage every node "
                f"mounts at the same path (docs/install.md, 'A GPU cluster'), or set check_shared_paths: false in "
                f"conf/cluster/{cluster.name}.yaml if this cluster is one node"
            )


# --- job specs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSpec:
    """One cell's scheduler resources; cells with equal specs share a job array."""

    partition: str
    time_min: int
    ntasks: int
    cpus_per_task: int
    mem: str
    # --gpus-per-task ([type:]1): each task (rank) is bound to its own GPU by the scheduler.
    gpus_per_task: str | None
    constraint: str | None
    account: str | None
    qos: str | None
    # Extra `#SBATCH --key[=value]` lines, as (key, value) pairs (value None: a bare flag).
    extra: tuple[tuple[str, str | None], ...]
    setup: tuple[str, ...]

    def parameters(self) -> dict[str, Any]:
        """submitit SlurmExecutor parameters (sbatch options, setup lines)."""
        params: dict[str, Any] = {
            "partition": self.partition,
            "time": self.time_min,
            "nodes": 1,
            "ntasks_per_node": self.ntasks,
            "cpus_per_task": self.cpus_per_task,
            "mem": self.mem,
            "setup": list(self.setup),
            # Any rank's failure ends every rank at once: the others would wait out the
            # collective's timeout (30 min) and record its error instead of the real one.
            "srun_args": ["--kill-on-bad-exit=1"],
        }
        for key in ("gpus_per_task", "constraint", "account", "qos"):
            if getattr(self, key):
                params[key] = getattr(self, key)
        if self.extra:
            params["additional_parameters"] = {key: True if value is None else value for key, value in self.extra}
        return params

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _time_min(hours: float | None) -> int:
    """sbatch's --time, minutes, of a time limit in hours."""
    return max(1, math.ceil(float(hours or 0) * 60))


def _mem(gb: float) -> str:
    return f"{int(gb)}G" if float(gb) == int(gb) else f"{math.ceil(float(gb) * 1024)}M"


def _extra(lines: Iterable[str], where: str) -> tuple[tuple[str, str | None], ...]:
    pairs = []
    for line in lines or ():
        text = str(line).strip()
        if text.startswith("#SBATCH"):
            text = text[len("#SBATCH") :].strip()
        if not text.startswith("--") or " " in text.split("=", 1)[0]:
            raise GridError(f"{where}: sbatch_extra entry '{line}' must be one long option, e.g. --exclusive or --mail-type=FAIL")
        key, eq, value = text[2:].partition("=")
        pairs.append((key, value if eq else None))
    return tuple(pairs)


def setup_lines(cluster: ClusterSpec, env: Mapping[str, str]) -> tuple[str, ...]:
    """What a job runs before its tasks start: the forwarded environment, the node setup
    script (venv, data, caches; sources gridrun/slurm/sites/<cluster>.sh), the profile's own lines."""
    lines = [f"export {name}={shlex.quote(env[name])}" for name in FORWARDED_ENV if env.get(name)]
    lines.append(f"export GRIDRUN_CLUSTER={shlex.quote(cluster.name)}")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in model_dirs_env(cluster.model_dirs).items()]
    lines.append(f"source {shlex.quote(str(SETUP_SCRIPT))}")
    lines += [str(line) for line in cluster.setup]
    return tuple(lines)


def cell_settings(cell: Mapping[str, Any], profile: ClusterSpec) -> CellOverride:
    """A cell's scheduler settings (its sweep.json entry): its resources, worked out at plan
    time from this profile (the GPU class's partition), then the profile's cell_overrides."""
    res = dict(cell.get("resources") or {})
    settings = CellOverride(
        partition=res.get("partition"),
        time_limit_h=res.get("time_limit_h", profile.time_limit_h),
        cpus_per_cell=res.get("cpus", profile.cpus_per_cell),
        mem_gb_per_cell=res.get("mem_gb", profile.mem_gb_per_cell),
        constraint=profile.constraints.get(str(res.get("gpu_class"))),
        qos=profile.qos,
        account=profile.account,
        tasks_per_cell=profile.tasks_per_cell,
        sbatch_extra=list(profile.sbatch_extra),
    )
    for pattern, override in profile.cell_overrides.items():
        if fnmatch.fnmatchcase(cell["id"], pattern):
            settings = replace(settings, **{k: v for k, v in asdict(override).items() if v is not None})
    return settings


def job_spec(cell: Mapping[str, Any], cluster: Mapping[str, Any], env: Mapping[str, str] | None = None) -> JobSpec:
    """The job spec of one cell (its sweep.json entry) on this cluster profile (as sweep.json
    records it: checked against the schema again, so a hand-edited sweep.json is refused
    naming the key)."""
    env = os.environ if env is None else env
    profile = cluster_spec(cluster)
    where = f"conf/cluster/{profile.name}.yaml"
    res = dict(cell.get("resources") or {})
    gpu_class = res.get("gpu_class")
    settings = cell_settings(cell, profile)
    gpus = int(res.get("gpus") or 0)
    if not settings.partition:
        raise GridError(
            f"cluster profile '{profile.name}' names no partition for GPU class '{gpu_class}' (cell {cell['id']}): "
            f"add `partitions: {{{gpu_class}: <partition>}}` to {where}, or pick another cluster= or gpu="
        )
    assert settings.time_limit_h is not None and settings.cpus_per_cell is not None
    assert settings.mem_gb_per_cell is not None
    tasks = int(settings.tasks_per_cell or max(1, gpus))
    gpus_per_task = None
    if gpus:
        if tasks != gpus:
            raise GridError(
                f"cell {cell['id']}: {tasks} tasks for {gpus} GPUs, and each rank needs exactly its own GPU: "
                f"set tasks_per_cell: null (one task per GPU) in {where}"
            )
        # One GPU per task, bound by the scheduler (SLURM sets each task's CUDA_VISIBLE_DEVICES);
        # `--gres=gpu:N` alone would show every task both GPUs.
        gpu_type = profile.gpu_types.get(str(gpu_class))
        gpus_per_task = f"{gpu_type}:1" if gpu_type else "1"
    return JobSpec(
        partition=settings.partition,
        time_min=_time_min(settings.time_limit_h),
        ntasks=tasks,
        cpus_per_task=max(1, int(settings.cpus_per_cell) // tasks),
        mem=_mem(float(settings.mem_gb_per_cell)),
        gpus_per_task=gpus_per_task,
        constraint=settings.constraint or None,
        account=settings.account or None,
        qos=settings.qos or None,
        extra=_extra(settings.sbatch_extra or [], where),
        setup=setup_lines(profile, env),
    )


def rejection(spec: JobSpec, cluster: str, reason: str) -> str:
    """One line for a job spec sbatch refuses (`reason`, its last line), naming the fix."""
    fix = f"fix conf/cluster/{cluster}.yaml"
    if "partition" in reason.lower():
        names = _run(["sinfo", "-h", "-o", "%R"], "listing partitions", check=False).stdout.split()
        fix += f" (partitions here: {', '.join(sorted(set(names)))})" if names else ""
    elif spec.gpus_per_task:
        fix = (f"the cells ask {spec.ntasks} tasks with --gpus-per-task={spec.gpus_per_task} on one node: set "
               f"grid.gpu.gpus_per_cell (or gpu=) to what a node of '{spec.partition}' has, or " + fix)
    return f"sbatch rejects the jobs of partition '{spec.partition}' ({reason}): {fix}"


# Seconds a checkpoint takes to write and fsync (adapters and AdamW state: ~5 GB for a 4B
# cell's three adapters) on shared storage, on top of the step the warning interrupts.
CHECKPOINT_S = 120


def _step_s(cell: PlanEntry) -> float:
    """A cell's estimated step, seconds (the plan's est_hours over its steps)."""
    return float(cell.est_hours or 0) * 3600 / max(1, cell.total_steps or 1)


def warning_lead_s(cells: Iterable[PlanEntry], spec: JobSpec, settings: SlurmSettings) -> int:
    """Seconds before the time limit SLURM's warning (USR2) comes for an array of these cells
    (their sweep.json entries): the slowest cell's estimated step twice over (the step under
    way may be a validation step, which costs more than the mean the plan's est_hours gives),
    plus a checkpoint; `signal_delay_s` is the floor. An estimated lead past half the time
    limit leaves no time to train: refused, naming the setting to change."""
    step_s = max((_step_s(c) for c in cells), default=0.0)
    derived = math.ceil(2 * step_s + CHECKPOINT_S)
    lead = max(int(settings.signal_delay_s), derived)
    if derived == lead and lead * 2 > spec.time_min * 60:
        raise GridError(
            f"SLURM's warning must come {lead} s before the time limit (one estimated {step_s:.0f} s step plus a "
            f"checkpoint), more than half of the {spec.time_min} min limit: raise the cluster profile's time_limit_h"
        )
    return lead


# Seconds a segment after a requeue loses before it trains: the model loaded, the engine
# started, the checkpoint resumed, the adapters proven served.
RESTART_S = 300
# A cell may take this many times its planned hours and still finish within its requeue
# budget: most of the dry run's rates are modelled, not measured (gridrun/grid/cost.py).
HOURS_HEADROOM = 1.5


@dataclass(frozen=True)
class RequeueBudget:
    """How a cell's planned hours meet its time limit: the hours one job segment trains, the
    segments the plan takes, and the requeues at the time limit its job may take."""

    segment_h: float
    segments: int
    requeues: int
    # False: grid.launcher.max_num_timeout set it for every cell.
    derived: bool

    @property
    def needs_person(self) -> bool:
        """Its plan takes more segments than its requeues allow: it stops as preempted, and
        only `gridrun resubmit --preempted` finishes it."""
        return self.requeues < self.segments - 1


def requeue_budget(cell: PlanEntry, cluster: Mapping[str, Any], settings: SlurmSettings) -> RequeueBudget:
    """A cell's requeue budget (submitit's max_num_timeout), worked out here alone: the
    segments HOURS_HEADROOM times its planned hours take, less the first. A segment is the
    cell's time limit (cell_overrides included) less its own warning lead and RESTART_S."""
    limit_h = _time_min(cell_settings(cell.to_json(), cluster_spec(cluster)).time_limit_h) / 60
    lead_s = max(int(settings.signal_delay_s), math.ceil(2 * _step_s(cell) + CHECKPOINT_S))
    # A floor lead (signal_delay_s) may exceed a test cluster's few-minute limit: at least
    # half of a limit trains (warning_lead_s refuses a derived lead past half of it).
    segment_h = max(limit_h - (lead_s + RESTART_S) / 3600, limit_h / 2)
    hours = float(cell.est_hours or 0)
    segments = max(1, math.ceil(hours / segment_h))
    if settings.max_num_timeout is not None:
        return RequeueBudget(segment_h, segments, settings.max_num_timeout, derived=False)
    return RequeueBudget(segment_h, segments, max(1, math.ceil(HOURS_HEADROOM * hours / segment_h)) - 1, derived=True)


def requeue_budgets(cells: Iterable[PlanEntry], cluster: Mapping[str, Any], launcher: Mapping[str, Any]
                    ) -> dict[str, RequeueBudget]:
    """Each cell's requeue budget on a SLURM cluster profile (none on another): the dry run's.
    A dry run of launcher=local shows what launcher=slurm would give."""
    if not cluster_spec(cluster).partitions:
        return {}
    settings = launcher_settings(launcher, SlurmSettings) if launcher.get("name") == "slurm" else SlurmSettings()
    return {cell.id: requeue_budget(cell, cluster, settings) for cell in cells if cell.resources.get("partition")}


def requeue_lines(budgets: Mapping[str, RequeueBudget], cluster: Mapping[str, Any]) -> list[str]:
    """Under the dry run's table: how the budgets follow from the time limit, and the cells
    that would stop preempted before their plan's end (none, unless grid.launcher.max_num_timeout
    sets fewer requeues than they need)."""
    if not budgets:
        return []
    most = max(budgets, key=lambda cell_id: budgets[cell_id].requeues)
    segment_h = sorted(budget.segment_h for budget in budgets.values())
    source = (f"enough for {HOURS_HEADROOM}x its planned hours" if budgets[most].derived
              else "grid.launcher.max_num_timeout's for every cell")
    how = (f"time limit {cluster.get('time_limit_h')} h (cluster={cluster.get('name')}): segs are the jobs a cell's "
           f"planned hours take, each the limit less the warning's lead and {RESTART_S // 60} min to restart "
           f"({segment_h[0]:.1f}-{segment_h[-1]:.1f} h here); requeues is its budget of requeues at the limit, "
           f"{source}: up to {budgets[most].requeues} ({most})")
    stuck = [cell_id for cell_id, budget in budgets.items() if budget.needs_person]
    if not stuck:
        verdict = f"no cell needs a person: each finishes within its requeue budget at up to {HOURS_HEADROOM}x its hours"
    else:
        named = ", ".join(stuck[:3]) + (f" and {len(stuck) - 3} more" if len(stuck) > 3 else "")
        verdict = (f"[red]{len(stuck)} cell(s) need a person to finish[/] ({named}): grid.launcher.max_num_timeout "
                   "allows fewer requeues than their segments, so each stops preempted until `gridrun resubmit "
                   "--preempted`; leave it unset for each cell's own budget")
    return [how, verdict]


def executor_parameters(
    spec: JobSpec, settings: SlurmSettings, job_name: str, dependency: str | None = None, lead_s: int | None = None
) -> dict[str, Any]:
    """Everything handed to `SlurmExecutor.update_parameters` for one array of this spec
    (`dependency`: sbatch's --dependency, e.g. afterok:12_3; `lead_s`: `warning_lead_s` of
    its cells, else `signal_delay_s`)."""
    params = {
        **spec.parameters(),
        "job_name": job_name,
        "signal_delay_s": settings.signal_delay_s if lead_s is None else lead_s,
        "array_parallelism": settings.max_parallel or SlurmSettings.max_parallel,
    }
    if dependency:
        params["additional_parameters"] = {**params.get("additional_parameters", {}), "dependency": dependency}
    return params


def sbatch_script(parameters: Mapping[str, Any], folder: Path, python: str = sys.executable, array: int | None = None) -> str:
    """The sbatch script submitit writes for these parameters (what `submit` sends)."""
    from submitit.slurm.slurm import _make_sbatch_string

    # What submitit's executor writes, given `python=interpreter_line()` as in `submit`.
    command = " ".join([interpreter_line(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, map_count=array, **parameters)


@functools.lru_cache(maxsize=1)
def max_array_size() -> int:
    """The cluster's MaxArraySize (array indices run 0 .. MaxArraySize-1)."""
    out = _run(["scontrol", "show", "config"], "reading MaxArraySize").stdout
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(found.group(1)) if found else 1001


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), max(1, size))]


# --- the launcher ---------------------------------------------------------------------------
def require_sbatch() -> None:
    """GridError, naming the fix, where this machine cannot submit (the launcher and the
    preflight both ask before anything else): sbatch submits, and submitit refuses to build
    its executor where srun is not on PATH."""
    missing = [command for command in ("sbatch", "srun") if shutil.which(command) is None]
    if missing:
        raise GridError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH: run launcher=slurm on a "
            "SLURM login node, start the test cluster with `eval \"$(slurm/testcluster/up.sh)\"`, or use launcher=local"
        )


def require_slurm_profile(cluster: Mapping[str, Any]) -> None:
    """GridError, naming the fix, for a cluster profile with no SLURM partitions."""
    if not cluster_spec(cluster).partitions:
        raise GridError(
            f"launcher=slurm needs a SLURM cluster profile, and cluster={cluster.get('name')} has no partitions: "
            "set cluster=testcluster, cluster=paper or your own conf/cluster/<name>.yaml"
        )


class SlurmLauncher(Launcher):
    name = "slurm"
    # A killed job may be requeued by SLURM: sacct, not a free run lock, says whether it is lost.
    lock_is_liveness = False
    settings_type = SlurmSettings

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.typed: SlurmSettings = launcher_settings(settings, SlurmSettings)
        self.max_attempts = self.typed.max_attempts
        self.signal_delay_s = self.typed.signal_delay_s

    def _specs(self, sweep: SweepDir, ids: list[str]) -> dict[str, JobSpec]:
        data = sweep.read()
        cluster = data.cluster
        require_slurm_profile(cluster)
        cells = data.entries()
        return {cell_id: job_spec(cells[cell_id].to_json(), cluster) for cell_id in ids}

    # --- the Launcher interface ----------------------------------------------------------
    def admit(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        require_sbatch()
        specs = self._specs(sweep, ids)
        cluster = cluster_spec(sweep.read().cluster)
        for spec in {spec.key(): spec for spec in specs.values()}.values():
            self._test_only(spec, cluster)
        if cluster.check_shared_paths:
            check_shared(sweep.root, cluster)
        admitted = []
        # As observed: a job lost while its cell read running is a failure.
        for cell_id, record in observe_cells(sweep, ids).items():
            if record.failures >= self.max_attempts:
                log.warning(
                    "not resubmitting %s: it has failed %d times (grid.launcher.max_attempts=%d); find out why with "
                    "`gridrun status --failed`, then raise the cap by re-planning the sweep with "
                    "grid.launcher.max_attempts=%d (cells stay as they are) or start it afresh with --replace",
                    cell_id, record.failures, self.max_attempts, self.max_attempts + 3,
                )
                continue
            admitted.append(cell_id)
        return admitted

    def _test_only(self, spec: JobSpec, cluster: ClusterSpec) -> None:
        """sbatch --test-only: the scheduler's verdict on this spec, before anything is queued."""
        params = executor_parameters(spec, self.typed, "gridrun-check")
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "check.sh"
            script.write_text(sbatch_script(params, Path(tmp)))
            result = _run(["sbatch", "--test-only", str(script)], "checking the job spec", check=False)
        if result.returncode == 0:
            return
        reason = (result.stderr or result.stdout).strip().splitlines()
        raise GridError(rejection(spec, cluster.name, reason[-1] if reason else f"exit {result.returncode}"))

    def submit(self, sweep: SweepDir, ids: list[str], accepted: Accepted | None = None) -> dict[str, str]:
        """Each array's ids go to `accepted` as sbatch takes it; an array sbatch refuses
        (a per-user job limit) stops the submission: PartlySubmitted names what was left."""
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        specs = self._specs(sweep, ids)
        needs = sweep_needs(sweep)
        submitted: dict[str, str] = {}
        # Needs first (queue() orders them so): their job ids are the dependents' afterok.
        for wave in ([c for c in ids if not needs.get(c)], [c for c in ids if needs.get(c)]):
            groups: dict[tuple[str, str | None], list[str]] = {}
            for cell_id in wave:
                dependency = self._dependency(sweep, needs.get(cell_id, []), submitted)
                groups.setdefault((specs[cell_id].key(), dependency), []).append(cell_id)
                self._cancel_stale_job(sweep, cell_id)
            for (_, dependency), cells in groups.items():
                for chunk in chunks(cells, max_array_size()):
                    try:
                        # submitit prints a refusal's stderr too; the one line below carries it.
                        with contextlib.redirect_stderr(io.StringIO()):
                            batch = self._submit_array(sweep, chunk, specs[chunk[0]], dependency)
                    except (FailedJobError, FailedSubmissionError, OSError) as err:  # refused, unreadable, or not run
                        lines = [line for line in str(err).strip().splitlines() if line.strip()]
                        raise PartlySubmitted(
                            [c for c in ids if c not in submitted], lines[-1] if lines else type(err).__name__
                        ) from err
                    submitted.update(batch)
                    if accepted is not None:
                        accepted(batch)
        return submitted

    @staticmethod
    def _dependency(sweep: SweepDir, needs: list[str], submitted: Mapping[str, str]) -> str | None:
        """afterok on the jobs of the needs not done yet (None: nothing to wait for)."""
        jobs = []
        for need in needs:
            record = sweep.cell(need).read_state()
            job = submitted.get(need) or (record.job_id if record.state != CellState.DONE else None)
            if job:
                jobs.append(str(job))
        return "afterok:" + ":".join(jobs) if jobs else None

    @staticmethod
    def _cancel_stale_job(sweep: SweepDir, cell_id: str) -> None:
        """A resubmitted cell's previous job, if it never started (a blocked cell's job waits
        forever on a dependency that failed): cancelled, so the queue holds one job per cell."""
        history = sweep.cell(cell_id).read_state().attempts
        if history and history[-1].get("job_id") and not history[-1].get("started_at"):
            _run(["scancel", str(history[-1]["job_id"])], "cancelling a stale job", check=False)

    def _submit_array(self, sweep: SweepDir, cells: list[str], spec: JobSpec, dependency: str | None) -> dict[str, str]:
        """One job array (at most MaxArraySize cells) of cells sharing a spec and a dependency."""
        import submitit

        from gridrun.grid.launchers.slurm_job import CellJob

        data = sweep.read()
        entries = data.entries()
        budgets = {c: requeue_budget(entries[c], data.cluster, self.typed).requeues for c in cells}
        # Each job counts its own cell's budget (CellJob.timeouts_left); submitit's one count per
        # array, at the array's largest, never refuses first.
        executor = submitit.SlurmExecutor(
            folder=sweep.jobs_dir / "%j", max_num_timeout=max(budgets.values()), python=interpreter_line()
        )
        lead = warning_lead_s([entries[c] for c in cells], spec, self.typed)
        executor.update_parameters(**executor_parameters(spec, self.typed, f"gridrun-{sweep.name}", dependency, lead))
        jobs = []
        with _sbatch_deadline(), executor.batch():
            for cell_id in cells:
                job = CellJob(str(sweep.cell(cell_id).root.resolve()), spec.time_min, lead, budgets[cell_id])
                jobs.append(executor.submit(job))
        return {cell_id: job.job_id for cell_id, job in zip(cells, jobs)}

    @classmethod
    def reconcile(cls, states: Mapping[str, StateRecord]) -> dict[str, tuple[str, str]]:
        if not states:
            return {}
        jobs = {cell_id: record.job_id for cell_id, record in states.items() if record.job_id}
        try:
            seen = scheduler_states(list(jobs.values()))
        except GridError as err:
            log.warning("cannot ask SLURM about %d active cells (%s); showing their own state", len(jobs), err)
            return {}
        now = time.time()
        out: dict[str, tuple[str, str]] = {}
        for cell_id, record in states.items():
            job = jobs.get(cell_id)
            info = seen.get(job) if job else None
            if info is None:
                queued_at = record.queued_at or 0.0
                if now - queued_at < SUBMIT_LAG_S:
                    continue  # just submitted (or being submitted): the scheduler may not list it yet
                what = f"job {job}" if job else "no job id was recorded"
                why = f"lost: {what}; SLURM no longer knows it and the cell recorded no final state"
                out[cell_id] = ("failed", why + "; resume it with `gridrun resubmit --failed`")
                continue
            word = info["state"]
            if word in SCHEDULER_ACTIVE:
                # A job held by a QOS limit or a dependency looks like a short wait without
                # SLURM's reason (PENDING (QOSMaxGRESPerUser)).
                reason = info.get("reason") or ""
                shown = f"{word} ({reason})" if word == "PENDING" and reason not in ("", "None") else word
                out[cell_id] = (record.state.value, shown)
                continue
            end = info.get("end") or 0.0
            if word in ("COMPLETED", "FAILED") and now - end < SETTLE_S:
                continue  # the trainer's own final write is on its way
            new_state, why = SCHEDULER_FINAL.get(word, ("failed", f"job {{job}} ended as {word}"))
            out[cell_id] = (
                new_state,
                why.format(job=job, cell=cell_id, exit=info.get("exit", "?"), logs=error_log(job, record)),
            )
        return out

    def cancel(self, sweep: SweepDir, ids: list[str]) -> list[str]:
        states = {cell_id: sweep.cell(cell_id).read_state() for cell_id in ids}
        jobs = {cell_id: record.job_id for cell_id, record in states.items() if record.job_id}
        if jobs:
            _run(["scancel", *sorted(set(jobs.values()))], "cancelling jobs")
        lines = []
        for cell_id, record in states.items():
            if record.state == CellState.QUEUED:
                # Never started: nothing will record it, so record it here.
                try:
                    sweep.cell(cell_id).record(cellstate.cancelled("cancelled before it started (gridrun cancel)"))
                except cellstate.IllegalTransition as ended:  # its job ran to the end meanwhile
                    lines.append(f"{cell_id}: not cancelled: {ended}")
                    continue
                lines.append(f"{cell_id}: cancelled job {jobs.get(cell_id, '-')} before it started")
            else:
                lines.append(f"{cell_id}: scancel {jobs.get(cell_id, '-')} (its trainer records cancelled)")
        return lines


def error_log(job: str | None, record: StateRecord) -> str:
    """The file that holds a failed job's error: the cell's logs/stderr.log once its trainer
    started, before that (setup, the environment, the job's own code) the job's stderr,
    which submitit writes under the sweep's jobs/ folder."""
    if record.state == CellState.RUNNING:
        return "logs/stderr.log in the cell dir"
    return f"jobs/{job}/{job}_0_log.err in the sweep dir"


# --- asking the scheduler -------------------------------------------------------------------
def by_job(columns: tuple[str, ...], rows: str) -> dict[str, dict[str, str]]:
    """`|`-separated rows of `columns` (JobID first; sacct -P -n, squeue -h) by job id, read
    by submitit's own sacct reader: array ranges expanded (`12_[3-5,7%2]` -> 12_3 12_4 12_5
    12_7, as sacct lists pending elements), job steps (`12.batch`) skipped."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    return SlurmInfoWatcher().read_info("|".join(columns) + "\n" + rows)


def _epoch(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def scheduler_states(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """job id -> {state, exit, end} from one sacct call; squeue when accounting is off (then
    finished jobs are simply absent)."""
    if not job_ids:
        return {}
    bases = sorted({job.split("_")[0] for job in job_ids})
    result = _run(
        ["sacct", "-X", "-P", "-n", "-j", ",".join(bases), "-o", "JobID,State,ExitCode,End,Reason"],
        "reading job states",
        check=False,
    )
    seen: dict[str, dict[str, Any]] = {}
    if result.returncode == 0:
        for job, row in by_job(("JobID", "State", "ExitCode", "End", "Reason"), result.stdout).items():
            state = row.get("State") or "UNKNOWN"
            seen[job] = {"state": state.split()[0], "exit": row.get("ExitCode", ""), "end": _epoch(row.get("End", "")),
                         "reason": row.get("Reason", "")}
    missing = [job for job in job_ids if job not in seen]
    if missing:
        # Accounting off, or slurmdbd has not caught up with fresh submissions: the queue knows.
        seen.update(_squeue(missing))
    return seen


def _squeue(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    args = ["squeue", "-h", "-r", "-o", "%i|%T|%r"]
    result = _run([*args, "-j", ",".join(sorted(set(job_ids)))], "reading the queue", check=False)
    if result.returncode != 0:
        # squeue refuses the whole list when one id is unknown: read the whole queue instead.
        result = _run(args, "reading the queue")
    seen = {
        job: {"state": row.get("State") or "UNKNOWN", "exit": "", "end": None, "reason": row.get("Reason", "")}
        for job, row in by_job(("JobID", "State", "Reason"), result.stdout).items()
    }
    return {job: seen[job] for job in job_ids if job in seen}
