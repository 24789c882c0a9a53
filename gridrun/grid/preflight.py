"""`gridrun preflight conf=<sweep>`: what a sweep's cells need, checked where they will run,
before anything is queued.

    gridrun preflight conf=<sweep> [hydra overrides] [--min-free-gb GB] [--timeout-min MIN]

`gridrun sweep` on a SLURM profile and `gridrun canary` run it first and queue nothing when
it fails (`--no-preflight` skips it). On a SLURM profile it is a tiny job on each partition
the cells use, with the cells' own job shape (one task per GPU, `--gpus-per-task`, the
profile's setup lines and the node setup script), whose tasks each run `probe` with the
python the cells' jobs will run; elsewhere `probe` runs here. Each failure is one line
naming its fix:

- the job's python runs gridrun (a task that prints no answer: the venv is not where the
  node looks, or does not import gridrun);
- torch imports, and sees a GPU where the cells take GPUs (`--cpu` canaries excepted);
- vLLM imports where a cell uses engine=vllm;
- each task sees exactly one GPU, a different one (what the cells' ranks will see);
- each GPU's compute mode admits the processes a cell runs on it (`compute_mode_failures`:
  engine=vllm runs two, the trainer and vLLM's engine core, which Exclusive_Process refuses);
- the sandbox runs a program with the interpreter the code task uses, where a cell has a
  sandboxed code task (`task.sandbox=bwrap`);
- each cell's model and prepared data are present (`inputs_missing`);
- the results root has room for the cells' checkpoints (`checkpoint_gb`).

The sandbox check runs the interpreter inside bubblewrap, which binds only `/usr`, `/etc` and
the interpreter's prefix and clears the environment. A python that finds its libpython only
through LD_LIBRARY_PATH (a site module's build) fails there, and bubblewrap's own probe fails
on it too; the system's /usr/bin/python3 starting in the sandbox tells the two apart, so the
line names the interpreter, not the sandbox. A python under /tmp cannot run in the sandbox at
all (its /tmp is a fresh tmpfs over the bound prefix), and is named the same way. A probe for
engine=vllm cells imports vLLM once per task (tens of seconds on a loaded node). The disk
check reads the dry run's per-cell estimate (gridrun/grid/disk.py `cell_disk`) through
`checkpoint_gb`; the model check is the plan's (gridrun/modelfiles.py).

A gridrun command rather than `setup_node.sh --check`: what to check comes from the plan
(engines, tasks, models, GPUs per cell, disk), and the answer must come back to the login
node as lines. Grid side: torch and vLLM are imported only by a child python of the probe.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridrun.grid.errors import GridError
from gridrun.modelfiles import missing_model, model_source

if TYPE_CHECKING:  # the probe on the node runs without the planner (Hydra) loaded
    from gridrun.grid.plan import PlannedCell

# The line each probing task prints its answer on (the job's output holds other lines).
MARK = "GRIDRUN-PREFLIGHT "
# The profile's extra sbatch options that say when a job runs or who hears of it, not where:
# left out of the preflight job (a `--begin` would hold it back with the cells).
WHEN_NOT_WHERE = ("begin", "dependency", "hold", "deadline", "mail-type", "mail-user", "requeue", "no-requeue",
                  "signal", "array", "job-name", "output", "error", "time", "time-min")
# Minutes a preflight job may take once it runs (imports of torch and vLLM on a cold node).
JOB_MIN = 10


@dataclass
class Needs:
    """What the cells of one job shape need on their node (the probe's input, as JSON)."""

    gpus: int = 0
    cuda: bool = False
    vllm: bool = False
    sandbox: bool = False
    # Pretrained models the cells load: hub ids or local folders.
    models: list[str] = field(default_factory=list)
    # [task, prepared data folder] of each task the cells train or evaluate on.
    data: list[list[str]] = field(default_factory=list)
    results: str = "results"
    disk_gb: float = 0.0

    def merge(self, other: Needs) -> Needs:
        return Needs(
            gpus=max(self.gpus, other.gpus), cuda=self.cuda or other.cuda, vllm=self.vllm or other.vllm,
            sandbox=self.sandbox or other.sandbox, models=sorted({*self.models, *other.models}),
            data=[list(d) for d in sorted({(d[0], d[1]) for d in (*self.data, *other.data)})],
            results=self.results, disk_gb=self.disk_gb + other.disk_gb,
        )


# --- what the cells need (login node) ----------------------------------------------------------
def checkpoint_gb(cell: PlannedCell) -> float:
    """Disk one cell's run directory takes at its peak (kept checkpoints, the peak and a save's
    temporary copy), as the dry run estimates it (gridrun/grid/disk.py); 0 where it has no estimate
    (the toy world: kilobytes)."""
    from gridrun.grid.disk import cell_disk

    estimate = cell_disk(cell.config)
    return 0.0 if estimate is None else estimate.results / 1e9


def needs_of(cell: PlannedCell, results: Path, cpu_ok: bool = False,
             model_dirs: dict[str, str] | None = None) -> Needs:
    """What one cell needs on its node; `cpu_ok`: its GPUs are asked for the binding only
    (a `--cpu` canary), its trainer runs on the CPU; `model_dirs`: the cluster profile's local
    model folders (a mapped model is checked in its folder)."""
    config = cell.config
    task = config.task
    data_path = getattr(task, "data_path", None)
    gpus = int(cell.resources.get("gpus") or 0)
    pretrained = config.model.init == "pretrained" and config.model.name_or_path != "toy"
    return Needs(
        gpus=gpus, cuda=bool(gpus) and not cpu_ok, vllm=config.engine.name == "vllm",
        sandbox=getattr(task, "sandbox", "none") == "bwrap",
        models=[model_source(config.model.name_or_path, model_dirs or {})] if pretrained else [],
        data=[[task.name, str(data_path)]] if data_path else [],
        results=str(results.absolute()), disk_gb=checkpoint_gb(cell),
    )


# --- the probe (on the node) -------------------------------------------------------------------
_STACK = """
import json, sys
want_vllm = sys.argv[1] == "1"
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["built_cuda"] = torch.version.cuda
    out["cuda"] = torch.cuda.is_available()
    out["devices"] = torch.cuda.device_count() if out["cuda"] else 0
    try:
        out["uuids"] = [str(torch.cuda.get_device_properties(i).uuid) for i in range(out["devices"])]
    except Exception:
        pass
except Exception as err:
    out["torch_error"] = f"{type(err).__name__}: {err}"
if want_vllm:
    try:
        import vllm
        out["vllm"] = vllm.__version__
    except Exception as err:
        out["vllm_error"] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def stack_failures(needs: Needs, python: str = sys.executable) -> list[str]:
    """torch (with CUDA where needed) and vLLM, imported by `python` in a child process."""
    return stack_report(needs, python)[0]


def stack_report(needs: Needs, python: str = sys.executable) -> tuple[list[str], dict[str, Any]]:
    """stack_failures' lines and what the child saw (torch's CUDA, its GPUs' UUIDs)."""
    try:
        done = subprocess.run([python, "-c", _STACK, "1" if needs.vllm else "0"], capture_output=True, text=True,
                              timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [(f"{python} could not import the training stack ({err.__class__.__name__}): reinstall the venv "
                "(make install)")], {}
    if done.returncode != 0 or not done.stdout.strip():
        return [f"{python} crashed importing torch/vLLM ({_last_line(done.stderr)}): reinstall the venv (make install)"], {}
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    failures = []
    if "torch_error" in seen:
        failures.append(f"torch does not import in {python} ({seen['torch_error']}): install the training stack "
                        "into the venv (make install)")
    elif needs.cuda and not seen.get("cuda"):
        built = f"CUDA {seen['built_cuda']}" if seen.get("built_cuda") else "no CUDA: a CPU wheel"
        failures.append(
            f"torch {seen.get('torch')} ({built}) sees no GPU on {socket.gethostname()}, and the cells train on "
            "GPUs: install a CUDA build of torch into the venv, or load the site's CUDA driver in "
            "gridrun/slurm/sites/<cluster>.sh")
    if needs.vllm and "vllm_error" in seen:
        failures.append(f"vllm does not import in {python} ({seen['vllm_error']}): the cells use engine=vllm; "
                        "install vLLM into the venv, or set engine=hf")
    return failures, seen


def gpu_compute_modes() -> dict[str, str]:
    """Each GPU nvidia-smi shows here: UUID -> compute mode (Default, Exclusive_Process,
    Prohibited); empty where nvidia-smi does not answer."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=uuid,compute_mode", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split(",") for line in done.stdout.splitlines() if line.count(",") == 1] if done.returncode == 0 else []
    return {uuid.strip(): mode.strip() for uuid, mode in rows}


def _bare_uuid(uuid: str) -> str:
    return uuid.strip().removeprefix("GPU-").lower()


def compute_mode_failures(needs: Needs, modes: dict[str, str], visible: list[str] | None = None) -> list[str]:
    """The GPUs (of `modes`, those torch sees where `visible` lists their UUIDs) whose compute
    mode refuses the processes a cell runs on each: Prohibited any, Exclusive_Process (and
    the old Exclusive_Thread) a second one, which engine=vllm's engine core is."""
    seen = {_bare_uuid(u) for u in visible} if visible else None
    failures = []
    for uuid, mode in modes.items():
        if seen is not None and _bare_uuid(uuid) not in seen:
            continue
        if mode == "Prohibited":
            failures.append(f"GPU {uuid} on {socket.gethostname()} runs in compute mode Prohibited, which admits no "
                            "process: ask the site for the Default compute mode on the cells' partition")
        elif mode.startswith("Exclusive") and needs.vllm:
            failures.append(f"GPU {uuid} on {socket.gethostname()} runs in compute mode {mode}, which admits one process, "
                            "and an engine=vllm cell runs two on each GPU (its trainer and vLLM's engine core): ask the "
                            "site for the Default compute mode on the cells' partition, or set engine=hf")
    return failures


def _interpreter_line(python: str, error: str) -> str:
    libraries = os.environ.get("LD_LIBRARY_PATH")
    hint = (f"the sandbox clears LD_LIBRARY_PATH ({libraries}) and binds only /usr, /etc and the interpreter's "
            "prefix" if libraries else "the sandbox binds only /usr, /etc and the interpreter's prefix")
    return (f"the sandbox cannot run {python} ({error}): {hint}; build the venv from a python whose libraries live "
            "under its own prefix (e.g. `uv python install`), or ask the site for one")


def sandbox_failures(python: str | None = None) -> list[str]:
    """The code task's sandbox: bubblewrap isolates here, and runs the interpreter the code
    task uses (`python`, default this one) with a cleared environment and only /usr, /etc and
    the interpreter's prefix bound."""
    from gridrun.tasks.sandbox import SandboxConfig, isolation_status, run_python

    config = SandboxConfig(python=python)
    python = os.path.realpath(python or sys.executable)
    ok, reason = isolation_status(config)
    if not ok:
        # bubblewrap's own probe starts the interpreter: the system's python tells a sandbox
        # that cannot start from an interpreter that cannot start in it.
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(system) != python and isolation_status(
                SandboxConfig(python=system))[0]:
            # The probe's own error, without the advice on namespaces that does not apply.
            detail = reason[reason.find("(") + 1:reason.rfind("): ")] if "): " in reason else reason
            detail = detail.split("in a user namespace: ")[-1]
            return [_interpreter_line(python, detail)]
        return [(f"no sandbox for the code task on {socket.gethostname()}: {reason}; on a cluster, ask the site for "
                 "bubblewrap with unprivileged user namespaces on the compute nodes, or set task.sandbox=none "
                 "(model-written code then runs unisolated)")]
    result = run_python("import json, math\nprint(json.dumps(int(math.sqrt(1764))))", config=config)
    if result.ok and result.stdout.strip() == b"42":
        return []
    return [_interpreter_line(python, _last_line(result.stderr.decode(errors="replace")))]


def inputs_missing(needs: Needs) -> list[str]:
    """Each model and prepared data set the cells load that is not on this node, by the same
    check `gridrun plan` makes on the login node (gridrun/modelfiles.py)."""
    failures = []
    for model in needs.models:
        why = missing_model(model, {})
        if why:
            failures.append(f"{why}: fetch it on a login node first (gridrun fetch conf=<sweep>)")
    for task, path in needs.data:
        missing = [name for name in ("train.jsonl", "val.jsonl", "meta.json") if not (Path(path) / name).is_file()]
        if missing:
            failures.append(f"no prepared {task} data at {path} ({', '.join(missing)} missing): run "
                            f"`gridrun data prepare {task} --out {path}` on a login node")
    return failures


def disk_failures(needs: Needs) -> list[str]:
    """Free space where the results go, against the cells' checkpoints."""
    where = Path(needs.results).absolute()
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free / 1e9
    if free >= needs.disk_gb:
        return []
    return [(f"{free:,.1f} GB free under {needs.results} and the cells' checkpoints need ~{needs.disk_gb:,.1f} GB: "
            "free space, or put the results on a larger shared filesystem (--results-dir or GRIDRUN_RESULTS)")]


def probe(needs: Needs) -> list[str]:
    """Every check that runs where a cell runs; the failure lines."""
    failures, seen = stack_report(needs)
    if needs.cuda and seen.get("cuda"):
        failures += compute_mode_failures(needs, gpu_compute_modes(), seen.get("uuids"))
    if needs.sandbox:
        failures += sandbox_failures()
    return failures + inputs_missing(needs) + disk_failures(needs)


def _main(argv: list[str]) -> int:
    """`python -m gridrun.grid.preflight probe <needs.json>`: one task's answer, one line."""
    if argv[:1] != ["probe"] or len(argv) != 2:
        print("usage: python -m gridrun.grid.preflight probe <needs.json>", file=sys.stderr)
        return 2
    needs = Needs(**json.loads(Path(argv[1]).read_text()))
    answer = {"task": int(os.environ.get("SLURM_PROCID", "0")), "host": socket.gethostname(),
              "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "failures": probe(needs)}
    print(MARK + json.dumps(answer), flush=True)
    return 0


# --- running it (login node) -------------------------------------------------------------------
def binding_failures(answers: list[dict[str, Any]], gpus: int) -> list[str]:
    """Each task of a GPU job sees exactly one GPU, a different one."""
    if not gpus:
        return []
    visible = [str(a.get("visible") or "") for a in answers]
    failures = [f"task {a['task']} on {a['host']} sees GPUs '{v or 'none'}' (CUDA_VISIBLE_DEVICES): each rank needs "
                "exactly its own; the job asks --gpus-per-task=1, so check the partition's gres configuration"
                for a, v in zip(answers, visible) if len(v.split(",")) != 1 or not v]
    if not failures and len(set(visible)) != len(visible):
        failures.append(f"tasks share a GPU (CUDA_VISIBLE_DEVICES {', '.join(visible)}): each rank needs its own; "
                        "check the partition's gres configuration")
    return failures


def run_local(needs: Needs) -> list[str]:
    """The probe on this machine (cells run here)."""
    failures = probe(needs)
    if needs.cuda and needs.gpus and not failures:
        try:
            listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
            count = listed.stdout.count("GPU ")
        except (OSError, subprocess.TimeoutExpired):
            count = 0
        if count < needs.gpus:
            failures.append(f"the cells take {needs.gpus} GPUs and this machine has {count}: set grid.gpu.gpus_per_cell "
                            "or run them on a cluster (cluster=<profile>)")
    return failures


def _script(spec: Any, needs_file: Path, out: Path, python: str) -> str:
    """The preflight job: the cells' job shape (partition, tasks, GPUs, memory, constraints),
    a few minutes, each task running the probe."""
    from gridrun.grid.launchers.process import interpreter

    # One CPU a task: the checks need no more, and a busy node fits the job sooner.
    options = ["--job-name=gridrun-preflight", f"--partition={spec.partition}", "--nodes=1",
               f"--ntasks-per-node={spec.ntasks}", "--cpus-per-task=1", f"--mem={spec.mem}",
               f"--time={min(JOB_MIN, spec.time_min)}", f"--output={out}", f"--error={out}"]
    options += [f"--{key.replace('_', '-')}={getattr(spec, key)}" for key in ("gpus_per_task", "constraint",
                                                                                 "account", "qos") if getattr(spec, key)]
    options += [f"--{key}" + ("" if value is None else f"={value}") for key, value in spec.extra
                if key not in WHEN_NOT_WHERE]
    command = shlex.join([*interpreter(python), "-m", "gridrun.grid.preflight", "probe", str(needs_file)])
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {o}" for o in options), *spec.setup,
                      f"srun --kill-on-bad-exit=0 {command}", ""])


def _wait(job_id: str, out: Path, timeout_min: float) -> None:
    """Until the job leaves the queue; cancelled at the timeout (fail closed), a squeue that
    does not answer by then included."""
    deadline = time.time() + timeout_min * 60
    while True:
        try:
            queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True,
                                    check=False, timeout=max(5.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            _cancel(job_id)
            raise GridError(f"`squeue` did not answer within the preflight's {timeout_min:g} min: is slurmctld up "
                            "(`scontrol ping`)? Raise --preflight-timeout-min, or skip it with --no-preflight") from None
        if queued.returncode != 0 or not queued.stdout.strip():
            return
        if time.time() > deadline:
            _cancel(job_id)
            raise GridError(f"the preflight job {job_id} did not finish in {timeout_min:g} min (last seen "
                            f"{queued.stdout.strip()}): raise --preflight-timeout-min, or skip it with --no-preflight")
        time.sleep(2.0)


def _cancel(job_id: str) -> None:
    """The preflight job cancelled, as far as scancel answers within 30 s."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["scancel", job_id], capture_output=True, check=False, timeout=30)


def run_slurm(spec: Any, cluster: str, needs: Needs, folder: Path, timeout_min: float,
              python: str = sys.executable) -> list[str]:
    """The probe as a job of the cells' shape on their partition; the failure lines."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = f"{spec.partition}-{os.getpid()}-{time.time_ns()}"
    needs_file, out = folder / f"needs-{stamp}.json", folder / f"preflight-{stamp}.out"
    needs_file.write_text(json.dumps(asdict(needs)))
    script = folder / f"preflight-{stamp}.sh"
    script.write_text(_script(spec, needs_file, out, python))
    try:
        submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=False,
                                   timeout=max(5.0, timeout_min * 60))
    except OSError as err:
        return [f"sbatch could not run ({err}): run the preflight on a login node of the cluster"]
    except subprocess.TimeoutExpired:
        return [(f"sbatch did not answer within the preflight's {timeout_min:g} min: is slurmctld up (`scontrol ping`)? "
                 "Raise --preflight-timeout-min, or skip it with --no-preflight")]
    if submitted.returncode != 0:
        from gridrun.grid.launchers.slurm import rejection

        return [rejection(spec, cluster, _last_line(submitted.stderr or submitted.stdout))]
    job_id = submitted.stdout.strip().split(";")[0]
    _wait(job_id, out, timeout_min)
    text = out.read_text(errors="replace") if out.exists() else ""
    answers = sorted((json.loads(line[len(MARK):]) for line in text.splitlines() if line.startswith(MARK)),
                     key=lambda a: a["task"])
    if len(answers) < spec.ntasks:
        other = _last_line("\n".join(line for line in text.splitlines() if not line.startswith(MARK)))
        return [(f"{spec.ntasks - len(answers)} of {spec.ntasks} tasks of the preflight job {job_id} on {spec.partition} "
                f"did not run gridrun's probe with {python} ({other}): the repository and its venv must be on shared storage "
                f"at the same path on every node (make install there); the job's output is {out}")]
    failures: list[str] = []
    for answer in answers:
        for line in answer["failures"]:
            if line not in failures:
                failures.append(line)
    return failures + binding_failures(answers, needs.gpus)


def preflight(cells: list[PlannedCell], cluster: dict[str, Any], launcher: str, results: Path,
              timeout_min: float = 30.0, min_free_gb: float = 0.0, cpu_ok: bool = False) -> list[str]:
    """Every failure line of these cells' preflight: one probing job per job shape on a SLURM
    launcher, the probe here otherwise. `min_free_gb`: the disk the cells need at least."""
    groups: dict[str, tuple[Any, Needs]] = {}
    if launcher == "slurm":
        from gridrun.grid.launchers.slurm import job_spec, require_sbatch, require_slurm_profile

        # What the launcher would refuse first, in its own one line, before any probe.
        require_sbatch()
        require_slurm_profile(cluster)
        for cell in cells:
            spec = job_spec(cell.entry(), cluster)
            key = spec.key()
            needs = needs_of(cell, results, cpu_ok, dict(cluster.get("model_dirs") or {}))
            groups[key] = (spec, groups[key][1].merge(needs) if key in groups else needs)
    else:
        merged = None
        for cell in cells:
            needs = needs_of(cell, results, cpu_ok, dict(cluster.get("model_dirs") or {}))
            merged = needs if merged is None else merged.merge(needs)
        if merged is not None:
            groups["local"] = (None, merged)
    # Every group's checkpoints land under the same results root: each checks the total.
    total = max(min_free_gb, sum(needs.disk_gb for _, needs in groups.values()))
    failures: list[str] = []
    for spec, needs in groups.values():
        needs.disk_gb = total
        found = (run_slurm(spec, str(cluster.get("name")), needs, results / ".preflight", timeout_min) if spec is not None
                 else run_local(needs))
        failures += [line for line in found if line not in failures]
    return failures


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
