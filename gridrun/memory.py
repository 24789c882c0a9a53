"""The GPU memory of one cell, phase by phase, from its resolved config: the plan's fit check
and the vLLM engine's share.

All sizes are GiB (2**30 bytes), and a card's size is its usable memory: what CUDA reports
as its total (`torch.cuda.mem_get_info()[1]`, the total vLLM's `gpu_memory_utilization` is a
fraction of), not the nominal size on the data sheet (conf/gpu/<class>.yaml `memory_gib`).

A step hands the GPU back and forth between two processes on each rank's GPU, the trainer and
vLLM's engine core (engine=vllm; engine=hf generates inside the trainer). Each phase's total
must stay under the card's usable memory:

- update (the engine asleep): the trainer's update peak (`trainer_update`) beside what the
  sleeping engine keeps (`engine_asleep`) and a CUDA context per process (`contexts`);
- rollout (the engine awake, validation included): what the trainer keeps once it has
  returned its cached memory (`trainer_kept`) beside the awake engine (`rollout`) and the
  contexts. The validation's gather across ranks runs over a CPU group
  (gridrun/train/distributed.py), so it adds nothing here.

The trainer returns its cached memory before every wake (gridrun/train/trainer.py
`Trainer.hand_gpu_to_engine`): PyTorch's allocator otherwise keeps the update's peak reserved
while vLLM's wake_up maps its whole share again, which no card holds (`unreleased`: the
total that order would need, e.g. 85.8 GiB for Voting-IP 1.7B on an H100).

The terms, per data-parallel rank (every rank keeps a full replica):
- weights: every parameter of the frozen base, in the model dtype;
- adapters: each trainable LoRA adapter's float32 weights and AdamW moments, plus the
  gradient of the one adapter being updated;
- activations of one micro-batch of T tokens (T = the token budget, the most a micro-batch
  may hold, or the cell's longest possible row where that is longer: a row is never split,
  so it is forwarded whole; the plan refuses such a cell, `longest_row`). With gradient
  checkpointing each decoder layer keeps its input (T x hidden x dtype), and on top of that
  either the output layer's working set (one chunk of float32 logits and its
  softmax/gradient copies, gridrun/train/logprobs.py) or one layer's recomputed working set,
  whichever is larger; without checkpointing every layer keeps its working set;
- the reserve (RESERVE_BYTES): cuBLAS workspaces and allocator slack; after the trainer
  returns its cache it also holds the live-adapter proof's probe forwards, which run beside
  the awake engine;
- rollout: vLLM claims `engine.gpu_memory_utilization` of the card (weights, activations,
  CUDA graphs and KV cache: vLLM profiles all four into its share); left unset, the plan sizes
  it with `engine_share`. `engine=hf` holds a KV cache for a sub-batch of
  `engine.max_batch_size` requests at the longest prompt plus the response limit, and one
  decoding step's logits;
- engine_asleep: sleep mode (level 1) moves vLLM's weights to host memory and drops its KV
  cache; its CUDA graphs' pool stays (ENGINE_ASLEEP_BYTES). With sleep mode off the whole
  share stays;
- contexts: a CUDA context (and NCCL's buffers) per process on the GPU, outside PyTorch's
  allocator (CUDA_CONTEXT_BYTES): two with vLLM's engine core, one otherwise.

The engine's share (`engine_share`, frozen into config.yaml at plan time when
`engine.gpu_memory_utilization` is null): the card less what the trainer keeps beside the
awake engine (the update's whole peak when sleep mode is off) and the contexts, at most
ENGINE_SHARE_CAP (0.85), rounded down to 0.01. The released code ran vLLM at 0.85 with its
actor offloaded during rollouts; gridrun's trainer keeps its weights on the GPU, so its
share comes off the top first. A cell whose phase cannot fit is refused at plan time in one
line naming the knob (`fit_problem`).

The update never holds a whole micro-batch's full-vocabulary logits: the output layer runs
on 2,048-position chunks under checkpointing (gridrun/train/logprobs.py), and the hf engine
records each sampled token's log-prob as it decodes instead of keeping every step's logits.

The trainer's constants were fitted to peaks measured with torch.cuda.max_memory_allocated on
an H100 (1.7B and 4B, bench/gpu.py): predicted/measured is in
bench/measured/gpu-h100-2026-11-22.md, not assumed. Unverified on a GPU: the rollout terms at
full length, the no-checkpointing working set, the engine's asleep pool, the contexts, and
how much of the update's peak the allocator cannot return (fragmentation; the canary prints
what the trainer keeps beside the awake engine). Torch-free: the grid imports it at plan time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from gridrun.arch import head_dim, hidden_norms, kv_bytes, lora_parameter_count, parameter_count, shaped
from gridrun.engine_params import HFParams, VLLMParams
from gridrun.seam.routing import adapter_groups
from gridrun.seam.runconfig import RunConfig

GIB = 2**30
# Completion positions whose float32 logits exist at once (gridrun/train/logprobs.py).
LOGITS_CHUNK_TOKENS = 2048
# float32 copies of a logits chunk alive at its peak (logits / T, the softmax of the entropy,
# their product, the gradient): fitted, 4 copies + the reserve = 5.4 GiB measured at Qwen3's vocabulary.
LOGITS_COPIES = 4
# cuBLAS workspaces and allocator slack inside PyTorch's allocator.
RESERVE_BYTES = 0.75 * GIB
# Per-token tensors one decoder layer keeps for backward, in units of each width (model
# dtype): residual stream and norms (hidden), attention q/o (heads x head_dim), k/v
# (kv_heads x head_dim), the MLP's gate/up/activation/product (intermediate).
LAYER_WIDTH_COEFFS = {"hidden": 6, "q": 5, "kv": 4, "intermediate": 5}
# Qwen3's RMSNorms compute in float32: four float32 hidden-wide temporaries per layer, two
# per norm (Gemma 3's four norms a layer: eight).
LAYER_FP32_HIDDEN_PER_NORM = 2
# The released code's vLLM share (it offloaded the actor during rollouts; gridrun's trainer
# keeps its weights on the GPU, so its share comes off the top first).
ENGINE_SHARE_CAP = 0.85
# The released code's vLLM batch limits, as the engine starts on a GPU (engines/vllm.py): the
# tokens of one engine step (chunked prefill), as released; the sequences decoded at once,
# vLLM's own H100 default (256 on smaller GPUs such as the L40S). Not the released 2048: the
# KV share holds a few hundred of the matrix's sequences at once (gridrun/grid/cost.py), and vLLM
# sizes its profiling run's sampler buffers (sequences x vocabulary) out of that share.
ENGINE_MAX_BATCHED_TOKENS = 16384
ENGINE_MAX_SEQS = 1024
# CUDA context and NCCL buffers of one process, outside PyTorch's allocator: the trainer's
# and the vLLM engine core's (a spawned process) sit on the same GPU.
CUDA_CONTEXT_BYTES = 1.0 * GIB
# What a vLLM engine asleep (level 1) keeps: only its weights and KV cache live in the sleep
# allocator's pools (vllm/device_allocator/cumem.py, tags "weights" and "kv_cache"), so its
# CUDA graphs' pool stays. vLLM profiles that pool into its share and logs it; 0.65 GiB is its
# log for a 4B dense model (vllm-project/vllm#21489, gemma-3-4b), taken for every scale here.
ENGINE_ASLEEP_BYTES = 0.65 * GIB
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU of `usable` bytes: the terms (module docstring) and each phase's total."""

    usable: float
    weights: float
    adapters: float
    activations: float
    logits: float
    # The engine awake: vLLM's share of the card, or engine=hf's KV cache and decoding logits.
    rollout: float
    engine_asleep: float
    contexts: float
    # The trainer's allocator at the update's peak (reserved until the trainer returns it).
    trainer_update: float
    # The trainer's allocator once it has returned its cache (weights, adapters, the reserve).
    trainer_kept: float

    @property
    def update_phase(self) -> float:
        return self.trainer_update + self.engine_asleep + self.contexts

    @property
    def rollout_phase(self) -> float:
        return self.trainer_kept + self.rollout + self.contexts

    @property
    def unreleased(self) -> float:
        """The GPU if the engine woke beside the update's reserved peak: the order the trainer
        avoids by returning its cache first (not a phase of the step)."""
        return self.trainer_update + self.rollout + self.contexts

    @property
    def phases(self) -> dict[str, float]:
        return {"update": self.update_phase, "rollout": self.rollout_phase}

    @property
    def peak(self) -> float:
        return max(self.phases.values())

    def as_gib(self) -> dict[str, float]:
        return {**{k: v / GIB for k, v in asdict(self).items()},
                **{f"{name}_phase": total / GIB for name, total in self.phases.items()},
                "unreleased": self.unreleased / GIB, "peak": self.peak / GIB}


def architecture(config: RunConfig) -> dict | None:
    """Published numbers of the cell's model, or None when they are not shipped (the toy
    world, a local checkpoint of another family); a random model's as reshaped."""
    try:
        return shaped(config.model.name_or_path, dict(config.model.arch_overrides))
    except ValueError:
        return None


def trainable_adapters(config: RunConfig) -> int:
    if not config.trains:
        return 0
    return len(adapter_groups(config))


def adapter_bytes(config: RunConfig, arch: dict) -> float:
    """The trainable adapters on the GPU: float32 weights + AdamW's two moments per adapter;
    one adapter's gradient at a time."""
    lora = lora_parameter_count(arch, config.lora.rank)
    n_adapters = trainable_adapters(config)
    return n_adapters * lora * 12 + (lora * 4 if n_adapters else 0)


def longest_row(config: RunConfig) -> int:
    """Tokens of the longest row the update may see: one LLM call's prompt plus its
    response at the cell's limits (a row is one role turn; the prompt limit already holds
    earlier turns, lengths.max_prompt_tokens)."""
    return config.lengths.max_prompt_tokens + config.lengths.max_response_tokens


def engine_processes(config: RunConfig) -> int:
    """Processes holding a CUDA context on each GPU: the trainer, and vLLM's engine core."""
    return 2 if isinstance(config.engine, VLLMParams) else 1


def engine_room(config: RunConfig, usable_gib: float, arch: dict | None = None) -> float:
    """The largest share of the card the vLLM engine can take beside this cell's trainer:
    the card less the contexts and what the trainer holds while the engine is awake (what it
    keeps once it returned its cache; its whole update peak when sleep mode is off)."""
    assert isinstance(config.engine, VLLMParams)
    without = predict(replace(config, engine=replace(config.engine, gpu_memory_utilization=0.0)), usable_gib, arch)
    trainer = without.trainer_kept if config.engine.enable_sleep_mode else without.trainer_update
    return 1.0 - (trainer + without.contexts) / without.usable


def engine_share(config: RunConfig, usable_gib: float, arch: dict | None = None) -> float:
    """The vLLM engine's `gpu_memory_utilization` beside this cell's trainer on a card of
    `usable_gib`: `engine_room`, at most ENGINE_SHARE_CAP, rounded down to 0.01."""
    return _floor_share(min(ENGINE_SHARE_CAP, engine_room(config, usable_gib, arch)))


def _floor_share(share: float) -> float:
    return math.floor(share * 100) / 100


def layer_bytes_per_token(arch: dict, dtype_bytes: int) -> float:
    widths = {
        "hidden": arch["hidden_size"],
        "q": arch["num_attention_heads"] * head_dim(arch),
        "kv": arch["num_key_value_heads"] * head_dim(arch),
        "intermediate": arch["intermediate_size"],
    }
    elements = sum(LAYER_WIDTH_COEFFS[k] * w for k, w in widths.items())
    return elements * dtype_bytes + LAYER_FP32_HIDDEN_PER_NORM * hidden_norms(arch) * 4 * arch["hidden_size"]


def predict(
    config: RunConfig, usable_gib: float, arch: dict | None = None, micro_tokens: int | None = None
) -> MemoryEstimate:
    """This cell's terms and phases on one card of `usable_gib` GiB (the module docstring);
    `micro_tokens`: the largest micro-batch's tokens when known (default: the budget)."""
    arch = arch or architecture(config)
    if arch is None:
        raise ValueError(f"no published architecture for '{config.model.name_or_path}'")
    usable = usable_gib * GIB
    b = _DTYPE_BYTES[config.model.dtype]
    layers, hidden = arch["num_hidden_layers"], arch["hidden_size"]
    weights = parameter_count(arch) * b
    adapters = adapter_bytes(config, arch)
    # A row longer than the budget is forwarded alone (the plan refuses such a cell).
    tokens = micro_tokens or max(config.train.micro_token_budget, longest_row(config) if config.trains else 0)
    per_layer = layer_bytes_per_token(arch, b)
    logits = min(LOGITS_CHUNK_TOKENS, tokens) * arch["vocab_size"] * 4 * LOGITS_COPIES
    if config.train.gradient_checkpointing:
        kept = tokens * layers * hidden * b
        activations = kept + max(0.0, tokens * per_layer - logits)
    else:
        activations = tokens * layers * per_layer
    trainer_kept = weights + adapters + RESERVE_BYTES
    trainer_update = trainer_kept + (activations + logits if config.trains else 0)
    rollout = _rollout_bytes(config, arch, b, usable)
    engine_asleep = 0.0
    if isinstance(config.engine, VLLMParams):
        engine_asleep = ENGINE_ASLEEP_BYTES if config.engine.enable_sleep_mode else rollout
    return MemoryEstimate(usable, weights, adapters, activations, logits, rollout, engine_asleep,
                          engine_processes(config) * CUDA_CONTEXT_BYTES, trainer_update, trainer_kept)


def fit_problem(config: RunConfig, estimate: MemoryEstimate) -> str | None:
    """None when every phase fits the card; else what does not, in one line ending with the
    knob to turn (the plan adds the cell and `or pick a larger gpu=`)."""
    over = {name: total for name, total in estimate.phases.items() if total > estimate.usable}
    if not over:
        return _engine_too_small(config, estimate)
    phase = max(over, key=lambda name: over[name])
    g = {k: v / GIB for k, v in asdict(estimate).items()}
    engine = config.engine
    if phase == "update":
        parts = (f"trainer {g['trainer_update']:.1f} (weights {g['weights']:.1f}, adapters {g['adapters']:.1f}, "
                 f"activations {g['activations']:.1f}, logits {g['logits']:.1f}), engine asleep {g['engine_asleep']:.1f}")
        knob = f"lower train.micro_token_budget (now {config.train.micro_token_budget})"
        if not config.train.gradient_checkpointing:
            knob = "set train.gradient_checkpointing=true or " + knob
        if isinstance(engine, VLLMParams) and not engine.enable_sleep_mode:
            knob = "set engine.enable_sleep_mode=true or " + knob
    else:
        parts = f"trainer {g['trainer_kept']:.1f} (weights {g['weights']:.1f}, adapters {g['adapters']:.1f}), engine {g['rollout']:.1f}"
        if isinstance(engine, VLLMParams):
            room = _floor_share(engine_room(config, g["usable"]))
            knob = (f"lower engine.gpu_memory_utilization (now {engine.gpu_memory_utilization}; at most {room:.2f} fits)"
                    if room > 0 else "the trainer's weights and adapters leave the engine no room")
        elif isinstance(engine, HFParams):
            knob = f"lower engine.max_batch_size (now {engine.max_batch_size}) or use engine=vllm"
        else:
            knob = f"lower engine {engine.name}'s rollout memory or use engine=vllm"
    return (f"its {phase} phase needs {over[phase] / GIB:.1f} GiB per GPU of {g['usable']:g} usable ({parts}, "
            f"CUDA contexts {g['contexts']:.1f}): {knob}")


def engine_floor(config: RunConfig, arch: dict) -> float:
    """What vLLM's share must hold at least: its own copy of the weights and the KV cache of
    one sequence at the cell's limits (vLLM refuses to start with less; its activations and
    CUDA graphs come on top)."""
    b = _DTYPE_BYTES[config.model.dtype]
    return parameter_count(arch) * b + kv_bytes(arch, longest_row(config), b)


def _engine_too_small(config: RunConfig, estimate: MemoryEstimate) -> str | None:
    if not isinstance(config.engine, VLLMParams):
        return None
    arch = architecture(config)
    floor = engine_floor(config, arch) if arch else 0.0
    if estimate.rollout >= floor:
        return None
    room = _floor_share(engine_room(config, estimate.usable / GIB, arch))
    knob = (f"raise engine.gpu_memory_utilization (at most {room:.2f} fits)" if room > (config.engine.gpu_memory_utilization or 0)
            else "lower lengths.max_prompt_tokens or lengths.max_response_tokens")
    return (f"its vLLM share {config.engine.gpu_memory_utilization} of {estimate.usable / GIB:g} GiB ({estimate.rollout / GIB:.1f} GiB) "
            f"holds less than the engine's weights and one sequence's KV cache at the cell's limits ({floor / GIB:.1f} GiB): {knob}")


def _rollout_bytes(config: RunConfig, arch: dict, dtype_bytes: int, usable: float) -> float:
    if isinstance(config.engine, VLLMParams):
        share = config.engine.gpu_memory_utilization
        if share is None:
            share = engine_share(config, usable / GIB, arch)
        return share * usable
    # engine=hf: a KV cache per sub-batch of requests, each up to the longest prompt plus
    # the response limit, and one decoding step's float32 logits and log-probs.
    requests = max(config.train.batch_problems * config.grpo.n, 1) * config.parallel_slots
    # An engine without a batch cap (a plugin's) is counted as generating every request at once.
    rows = min(config.engine.max_batch_size, requests) if isinstance(config.engine, HFParams) else requests
    tokens = config.lengths.max_prompt_tokens + config.lengths.max_response_tokens
    return rows * (kv_bytes(arch, tokens, dtype_bytes) + 2 * 4 * arch["vocab_size"])
