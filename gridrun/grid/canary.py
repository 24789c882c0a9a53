"""`gridrun canary`: the first job on a new cluster, and whether the sweep should follow.

    gridrun canary cluster=<profile> [conf=<sweep>] [--cpu] [hydra overrides]

Plans sweeps/canary.yaml (one Voting-IP 1.7B math cell, 8 problems x 3 steps) on the
cluster profile into results/canary (wiped and planned afresh every time; refused while a
canary there is queued or running), runs the preflight, runs it (launcher=slurm on a SLURM
profile, else locally), waits for it (a SLURM canary not finished by --timeout-min is
cancelled), and reports from its run directory only:

- per rank (ranks/rank<r>.json, written by each rank's trainer): host, GPU UUID and name
  (CPU where none), CUDA_VISIBLE_DEVICES (the trainer and its engine share it), the free
  GPU memory at each hand-over (the engine awake, asleep before the update, after the update,
  the trainer's cache returned before the wake, after the wake) with the trainer's reserved
  update peak and what it keeps beside the engine, against the memory model's prediction for
  the cell (gridrun/memory.py), each rollout stage's
  seconds and generated tokens/s (engine=vllm's continuous rollout: the whole rollout's), the update's seconds and tokens/s, and the time spent
  gathering across ranks, all of the last step;
- the live-adapter check per role (metrics.jsonl's `adapter_check/<role>/{served,zero,
  trainer}` where the engine records them, "not run" otherwise);
- a go/no-go line with the projected node-days of `conf=<sweep>` (default full_matrix):
  the dry run's cost model (gridrun/grid/cost.py) with the canary's measured step, per problem,
  in place of the model's for the cells of its shape (workflow, task, model, policy, GPU
  class, engine); the step is kept in results/canary/measured-step.json, where every later
  dry run reads it. The report says how far the model's prediction for the canary cell was.
  The step is the median of the steps after the first (warm-up), scaled linearly per problem
  (8 in the canary, 64 in the paper's cells): pessimistic on a GPU, where larger batches roll
  out more efficiently. The matching cells' rate column reads `c`.
- NO-GO (exit 1) when the cell did not finish (its error's last line), a rank did not record
  where it ran, two ranks shared a GPU, or a rank saw several; GO (exit 0) otherwise.

`--cpu` (the default with cluster=local on a machine without an NVIDIA GPU) runs the same
cell (CPU_SHAPE) against `model.init=random` with the architecture cut to a CPU's size and
tiny lengths: the real workflow, task data, Qwen3 class, LoRA and live-adapter check, on the
hf engine; on a SLURM profile still as two tasks with one GPU each bound, so the binding is
exercised (the trainers stay on the CPU). The shape: `model.arch_overrides` keeps 2 decoder
layers, 256 wide (768 MLP, 4 query / 2 key-value heads of Qwen3's 128 dims), float32,
8-token responses, 2 problems x 2 rollouts x 2 steps, validation on 2 problems. The hf
engine, because `model.init=random` builds its weights in memory and vLLM loads weights from
disk (the plan refuses that pair); it samples from the trainer's own adapters, so the
live-adapter check reads "not run" there. On this machine (no partitions) the cell is
planned with gpu=cpu, one process; on a SLURM profile with `+grid.gpu.binding_only=true`
(recorded in cell.json), so its trainer does not refuse a GPU cell whose torch sees no GPU.
Where the cell's math data is not prepared (and no task.data_path is given), a CPU canary
trains on the small math set shipped with gridrun (gridrun/tasks/math_sample/) and says so,
so that it needs neither the hub nor `gridrun data prepare`. Its measured step is recorded for the CPU: it never replaces a GPU
cell's prediction, and the projection is labelled a CPU number.
Grid side: reads files, never imports torch.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridrun.grid.compose import Composer
from gridrun.grid.cost import MeasuredStep, node_days, read_measured_step, write_measured_step
from gridrun.grid.errors import GridError
from gridrun.grid.fetch import FileNeed, absent
from gridrun.grid.plan import PlannedCell, freeze, make_plan
from gridrun.grid.spec import load_spec, sweep_file
from gridrun.grid.sweepdir import SweepDir
from gridrun.seam.cellstate import ACTIVE_STATES, CellState
from gridrun.seam.runconfig import RunConfig
from gridrun.seam.rundir import RunDir
from gridrun.tasks.prepared import MATH_SAMPLE

CANARY_SWEEP = "canary"
# What --cpu runs: the same cell (workflow, task and its data, policy, LoRA, the scale's
# Qwen3 class and vocabulary, prompt limit) on a random-init model cut to a CPU's size
# (2 layers, 256 wide), float32, the hf engine, 8-token responses, 2 problems x 2 rollouts
# x 2 steps, validation on 2 problems: about a minute on 2 cores.
CPU_SHAPE = (
    "model.init=random", "model.dtype=float32", "engine=hf",
    "+model.arch_overrides.num_hidden_layers=2", "+model.arch_overrides.hidden_size=256",
    "+model.arch_overrides.intermediate_size=768", "+model.arch_overrides.num_attention_heads=4",
    "+model.arch_overrides.num_key_value_heads=2",
    "lengths.max_response_tokens=8", "train.batch_problems=2", "train.ppo_mini_batch=2", "grpo.n=2",
    "train.total_steps=2", "train.val_problems=2", "train.val_every=2", "train.save_every=2",
    # This shape's own cost (x Voting-math's 3.5: ~21 s a step; measured 18 s on 2 busy cores),
    # so a scheduler's time limit and warning lead are sized for it, not for the GPU cell.
    "grid.estimate.step_s=6",
)
# Seconds between two looks at a SLURM canary's state.
POLL_S = 5.0


@dataclass(frozen=True)
class Verdict:
    go: bool
    lines: list[str]


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU (nvidia-smi lists one); torch-free."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def canary_overrides(cluster: str, slurm: bool, cpu: bool) -> list[str]:
    """The canary sweep's command line: the profile, its launcher, the CPU shape."""
    lines = [f"cluster={cluster}", f"launcher={'slurm' if slurm else 'local'}"]
    if cpu:
        lines += list(CPU_SHAPE)
        if not slurm:
            # One process on this machine's CPU; on a SLURM profile the cell keeps its two
            # tasks with a GPU each, as a real cell's job: the binding is what is checked.
            lines.append("gpu=cpu")
        else:
            lines.append("+grid.gpu.binding_only=true")
    return lines


def sample_data(config: RunConfig, cpu: bool, overrides: list[str]) -> list[str]:
    """A CPU canary whose math data is not prepared: the override that points it at the math
    set shipped with gridrun (said on stdout); [] for any other canary, and for one whose
    command line names its task.data_path."""
    data_path = getattr(config.task, "data_path", None)
    named = any(o.lstrip("+").startswith("task.data_path=") for o in overrides)
    if not cpu or config.task.name != "math" or not data_path or named:
        return []
    why = absent(FileNeed("data", "math", str(data_path)), {})
    if why is None:
        return []
    problems = json.loads((MATH_SAMPLE / "meta.json").read_text())["counts"]["kept"]
    print(f"{why}: this CPU canary trains on the {problems}-problem math sample shipped with gridrun "
          f"({MATH_SAMPLE}); `gridrun data prepare math` prepares the real set", flush=True)
    return [f"task.data_path={MATH_SAMPLE}"]


def run_canary(results: Path, cluster: str, project: str, overrides: list[str], cpu: bool | None,
               timeout_min: float, preflight: Callable[..., None] | None = None) -> int:
    """Plan, run and report the canary; 0 on GO, 1 on NO-GO. `preflight(plan, cells,
    results, timeout_min, cpu_ok=)` runs before anything is submitted (and raises to stop it)."""
    composer = Composer()
    sweep_file(project)  # the sweep to project: a typo is refused before anything runs
    profile = load_spec(CANARY_SWEEP, [f"cluster={cluster}"], composer)
    slurm = bool(make_plan(profile, composer).cluster.get("partitions"))
    if cpu is None:
        cpu = not slurm and not has_nvidia_gpu()
    shape = canary_overrides(cluster, slurm, cpu)
    plan = make_plan(load_spec(CANARY_SWEEP, [*shape, *overrides], composer), composer)
    if len(plan.cells) != 1:
        raise GridError(f"the canary is one cell, and these overrides plan {len(plan.cells)}: set one value per axis")
    (cell,) = plan.cells
    sample = sample_data(cell.config, cpu, overrides)
    if sample:
        plan = make_plan(load_spec(CANARY_SWEEP, [*shape, *sample, *overrides], composer), composer)
        (cell,) = plan.cells
    sweep = SweepDir(results, CANARY_SWEEP)
    _fresh(sweep)
    if preflight is not None:
        preflight(plan, plan.cells, results, timeout_min, cpu_ok=cpu)

    from gridrun.grid.launchers.base import make_launcher
    from gridrun.grid.launchers.dispatch import queue

    launcher = make_launcher(plan.launcher)
    with sweep.lock():
        freeze(plan, sweep, replace=True)
        submitted = queue(sweep, [cell.id], launcher)
    if not submitted:
        raise GridError(f"the canary cell {cell.id} was not submitted: see `gridrun status conf={CANARY_SWEEP}`")
    where = f"cluster={cluster}" + (" (CPU: a random-init model of the cell's architecture, cut to CPU size)" if cpu else "")
    print(f"canary {cell.id} submitted with launcher={launcher.name} on {where}; waiting for it", flush=True)
    started = time.time()
    if launcher.name == "slurm":
        _watch(sweep, cell.id, launcher, timeout_min)
    else:
        launcher.wait(sweep, submitted)
    print(f"canary finished in {time.time() - started:.0f} s")
    run_dir = sweep.cell(cell.id)
    step_s = measured_step_s(run_dir.read_metrics())
    if step_s is not None and run_dir.read_state().state == CellState.DONE:
        # A CPU canary's step stands for the CPU, whatever GPU class its job asked for.
        gpu = "cpu" if cpu else cell.resources["gpu_class"]
        write_measured_step(sweep.measured_step_json, cell.config, gpu, step_s, cell.id)
    measured = read_measured_step(sweep.measured_step_json)
    verdict = report(run_dir, cell, project, _projection_plan(project, cluster, composer, measured), cpu)
    for line in verdict.lines:
        print(line)
    return 0 if verdict.go else 1


def _fresh(sweep: SweepDir) -> None:
    """Every canary starts from nothing; one still queued or running is not disturbed."""
    if not sweep.root.exists():
        return
    for cell_id in sweep.cell_ids():
        state = sweep.cell(cell_id).read_state().state
        if state in ACTIVE_STATES:
            raise GridError(
                f"a canary is still {state} in {sweep.root}: wait for it, or `gridrun cancel conf={CANARY_SWEEP}`"
            )
    shutil.rmtree(sweep.root)


def _watch(sweep: SweepDir, cell_id: str, launcher: Any, timeout_min: float) -> None:
    """Wait for a scheduler's canary to end (its own state, or the scheduler's word on a job
    that died without one); cancel it at the timeout."""
    deadline = time.time() + timeout_min * 60
    last = None
    while True:
        record = sweep.cell(cell_id).read_state()
        if not record.active:
            return
        seen = launcher.reconcile({cell_id: record}).get(cell_id)
        if seen and seen[0] not in ACTIVE_STATES:
            return
        now = (record.state, record.step)
        if now != last:
            print(f"  {record.state}, step {record.step}", flush=True)
            last = now
        if time.time() > deadline:
            launcher.cancel(sweep, [cell_id])
            raise GridError(f"the canary did not finish in {timeout_min:g} min and was cancelled: raise --timeout-min, "
                            f"or see `gridrun status conf={CANARY_SWEEP}` for where it waits")
        time.sleep(POLL_S)


def _projection_plan(project: str, cluster: str, composer: Composer,
                     measured: MeasuredStep | None) -> list[PlannedCell]:
    return make_plan(load_spec(project, [f"cluster={cluster}"], composer), composer, measured).cells


# --- the report --------------------------------------------------------------------------
def _rate(tokens: float, seconds: float) -> str:
    return f"{tokens / seconds:,.0f} tok/s" if seconds > 0 else "- tok/s"


def _gib(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.1f}"


def memory_lines(last: dict[str, Any]) -> list[str]:
    """The GPU memory at a step's hand-overs (GiB; the trainer's fields of RANK_FIELDS)."""
    if last.get("free_gpu_gb_awake") is None:
        return [f"  GPU memory at the hand-overs: n/a (CPU) (step {last.get('step')})"]
    free = (f"  free GPU memory (GiB, step {last.get('step')}): {_gib(last.get('free_gpu_gb_awake'))} with the engine "
            f"awake, {_gib(last.get('free_gpu_gb_asleep'))} asleep before the update, "
            f"{_gib(last.get('free_gpu_gb_updated'))} after it, {_gib(last.get('free_gpu_gb_released'))} with the "
            f"trainer's cache returned before the wake, {_gib(last.get('free_gpu_gb_woken'))} after the wake")
    trainer = (f"  trainer (GiB): update peak {_gib(last.get('trainer_peak_gb'))} reserved, "
               f"{_gib(last.get('trainer_kept_gb'))} kept beside the awake engine")
    return [free, trainer]


def model_line(cell: PlannedCell) -> str | None:
    """The memory model's prediction for the cell on its GPU class, to read beside the ranks'."""
    from gridrun.memory import GIB, architecture, predict

    usable = cell.resources.get("gpu_memory_gib")
    arch = architecture(cell.config)
    if not usable or arch is None:
        return None
    e = predict(cell.config, float(usable), arch)
    return (f"memory model (GiB per GPU of {usable} usable): trainer update peak {e.trainer_update / GIB:.1f}, kept "
            f"{e.trainer_kept / GIB:.1f}; engine {e.rollout / GIB:.1f} awake, {e.engine_asleep / GIB:.1f} asleep; phases: "
            f"update {e.update_phase / GIB:.1f}, rollout {e.rollout_phase / GIB:.1f}")


def rank_lines(record: dict[str, Any]) -> list[str]:
    """What one rank's record says, its last step's costs included."""
    gpu = (f"GPU {record.get('gpu_uuid')} ({record.get('gpu_name')}, {float(record.get('gpu_total_gb') or 0):.0f} GiB)"
           if record.get("gpu_uuid") else "CPU")
    head = (f"rank {record.get('rank')}/{record.get('world')} on {record.get('host')}: {gpu}; "
            f"CUDA_VISIBLE_DEVICES={record.get('cuda_visible_devices') or 'unset'} (trainer {record.get('device')}, "
            f"engine {record.get('engine')} on the same)")
    lines = [head]
    steps = record.get("steps") or []
    if not steps:
        return [*lines, "  no step recorded"]
    last = steps[-1]
    lines += memory_lines(last)
    for k, stage in enumerate(last.get("stages") or []):
        what = "rollout (continuous, no stages)" if stage.get("continuous") else f"rollout stage {k}"
        lines.append(f"  {what}: {stage['requests']} requests, {stage['seconds']:.2f} s, "
                     f"{stage['tokens']} tokens ({_rate(stage['tokens'], stage['seconds'])})")
    lines.append(f"  update: {last['update_s']:.2f} s, {last['update_tokens']} tokens "
                 f"({_rate(last['update_tokens'], last['update_s'])}); gather across ranks {last['gather_s']:.3f} s")
    return lines


def adapter_lines(rows: list[dict[str, Any]], roles: list[str], engine: str) -> list[str]:
    """The live-adapter check per role from the last training row that has it (the vllm
    engine runs it; the hf engine samples from the trainer's own adapters, so has none)."""
    train = [row for row in rows if row.get("split") == "train"]
    lines = []
    for role in roles:
        keys = [f"adapter_check/{role}/{part}" for part in ("served", "zero", "trainer")]
        found = [row for row in train if all(key in row for key in keys)]
        if found:
            served, zero, trainer = (float(found[-1][key]) for key in keys)
            lines.append(f"adapter check {role} (step {found[-1]['step']}): served {served:.4g}, "
                         f"zero adapter {zero:.4g}, trainer {trainer:.4g}")
        else:
            why = " (engine hf samples from the trainer's own adapters)" if engine == "hf" else ""
            lines.append(f"adapter check {role}: not run{why}")
    return lines


def measured_step_s(rows: list[dict[str, Any]]) -> float | None:
    """The canary's step time: the median over its steps after the first (warm-up), or the
    first when it ran only one."""
    steps = [float(row["time/step_s"]) for row in rows if row.get("split") == "train" and "time/step_s" in row]
    return statistics.median(steps[1:] or steps) if steps else None


def projection(canary: PlannedCell, step_s: float, cells: list[PlannedCell]) -> tuple[float, float]:
    """(projected node-days of `cells`, factor): the dry run's hours of every cell (one node
    each; `cells` planned with the canary's measured step, which its shape's cells take), and
    the canary's measured step over the cost model's prediction for the canary cell."""
    return node_days(c.est_hours for c in cells), step_s / canary.est_step_s


def report(run_dir: RunDir, cell: PlannedCell, project_name: str, project: list[PlannedCell], cpu: bool) -> Verdict:
    """The canary's lines and verdict: NO-GO when the cell did not finish, a rank did not
    say where it ran, or ranks shared a GPU (or one saw several)."""
    record = run_dir.read_state()
    rows = run_dir.read_metrics()
    records = run_dir.read_rank_records()
    lines = [f"canary {cell.id}: {record.state}" + (f" (job {record.job_id})" if record.job_id else "")]
    for rank in records:
        lines += rank_lines(rank)
    predicted = None if cpu else model_line(cell)
    if predicted:
        lines.append(predicted)
    roles = sorted(set(cell.config.workflow_entry().roles))
    lines += adapter_lines(rows, roles, cell.config.engine.name)
    problems = []
    if record.state != CellState.DONE:
        error = (record.error or "").strip().splitlines()
        problems.append(f"the cell ended {record.state}: {error[-1] if error else 'no error recorded'}")
    world = max([int(r.get("world") or 1) for r in records] or [0])
    if len(records) != world or world == 0:
        problems.append(f"{len(records)} of {world or '?'} ranks recorded where they ran (ranks/ in {run_dir.root})")
    visible = [str(r.get("cuda_visible_devices") or "") for r in records]
    if any("," in v for v in visible):
        problems.append(f"a rank sees several GPUs (CUDA_VISIBLE_DEVICES {', '.join(visible)}): one GPU per rank")
    uuids = [r.get("gpu_uuid") for r in records if r.get("gpu_uuid")]
    if len(set(uuids)) != len(uuids) or (all(visible) and len(set(visible)) != len(visible) and not uuids):
        problems.append("two ranks share a GPU: each rank must run on its own")
    step_s = measured_step_s(rows)
    if step_s is not None:
        days, factor = projection(cell, step_s, project)
        basis = "CPU random-init model, not a GPU number; " if cpu else ""
        lines.append(f"measured step {step_s:.2f} s ({cell.config.train.batch_problems} problems; {factor:.2f}x the "
                     f"cost model's {cell.est_step_s:.2f} s for this cell)")
        taken = sum(1 for c in project if c.rate_source.startswith("canary"))
        forecast = (f"projected {days:,.1f} node-days for {project_name} ({len(project)} cells; {basis}"
                    f"the dry run's cost model, this step in place of its prediction for {taken} cell(s) of its shape)")
    else:
        forecast = "no step time measured"
    if problems:
        return Verdict(False, [*lines, f"NO-GO: {'; '.join(problems)}; {forecast}"])
    return Verdict(True, [*lines, f"GO: {forecast}"])
