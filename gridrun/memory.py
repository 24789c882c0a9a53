"""Predicted peak GPU memory of one cell, from its resolved config: the dry run's fit check.

A cell's GPU holds, per data-parallel rank (every rank keeps a full replica):
- weights: every parameter of the frozen base, in the model dtype;
- adapters: each trainable LoRA adapter's float32 weights and AdamW moments, plus the
  gradient of the one adapter being updated;
- update activations of one micro-batch of T tokens (T = the token budget, the most a
  micro-batch may hold, or the cell's longest possible row where that is longer: a row is
  never split, so it is forwarded whole; the plan refuses such a cell, `longest_row`). With gradient checkpointing each decoder layer keeps its input
  (T x hidden x dtype), and on top of that either the output layer's working set (one
  chunk of float32 logits and its softmax/gradient copies, gridrun/train/logprobs.py) or
  one layer's recomputed working set, whichever is larger; without checkpointing every
  layer keeps its working set;
- rollout: vLLM claims `engine.gpu_memory_utilization` of the whole GPU (released while
  the trainer updates when sleep mode is on); left unset, the plan sizes it with
  `engine_share`: what the trainer keeps on the same GPU during rollouts (its weights and
  adapters, the reserve, a CUDA context per process) comes off the top, at most
  ENGINE_SHARE_CAP (the released code's 0.85, with its actor offloaded during rollouts); `engine=hf` holds a KV cache for a sub-batch
  of `engine.max_batch_size` requests at the longest prompt plus the response limit.

The engine's share (`engine_share`, frozen into config.yaml at plan time when
`engine.gpu_memory_utilization` is null): the GPU less what the trainer keeps on it while
the engine rolls out (the frozen weights, each adapter's float32 weights and AdamW moments,
the allocator reserve; with `engine.enable_sleep_mode=false` also the update's activations)
and one CUDA context for each of the two processes (CUDA_CONTEXT_BYTES, 1 GiB each), at most
ENGINE_SHARE_CAP (0.85), rounded down to 0.01. The released code ran vLLM at 0.85 with its
actor offloaded during rollouts; gridrun's trainer keeps its weights on the GPU, so its
share comes off the top first.

The update never holds a whole micro-batch's full-vocabulary logits: the output layer runs
on 2,048-position chunks under checkpointing (gridrun/train/logprobs.py), and the hf engine
records each sampled token's log-prob as it decodes instead of keeping every step's logits.

The peak is the larger of the rollout phase and the update phase. The constants below
were fitted to peaks measured with torch.cuda.max_memory_allocated on an H100 (1.7B and
4B, bench/gpu.py): predicted/measured is in bench/measured/gpu-h100-2026-11-22.md, not
assumed.
Torch-free: the grid imports it at plan time.

Not counted: the CUDA context (outside PyTorch's allocator), NCCL buffers, vLLM's CUDA
graphs beyond its fraction. Unverified on a GPU: the rollout terms at full length (the
GPU check samples short rollouts) and the no-checkpointing working set.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from gridrun.arch import lora_parameter_count, parameter_count, shaped
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
# Qwen3's RMSNorms compute in float32: four float32 hidden-wide temporaries per layer.
LAYER_FP32_HIDDEN = 4
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
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float
    adapters: float
    activations: float
    logits: float
    rollout: float
    update_phase: float
    rollout_phase: float

    @property
    def peak(self) -> float:
        return max(self.update_phase, self.rollout_phase)

    def as_gb(self) -> dict[str, float]:
        return {**{k: v / GIB for k, v in asdict(self).items()}, "peak": self.peak / GIB}


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


def engine_share(config: RunConfig, gpu_memory_gb: float, arch: dict | None = None) -> float:
    """The vLLM engine's `gpu_memory_utilization` beside this cell's trainer on one GPU of
    `gpu_memory_gb`: the GPU less what the trainer keeps there while the engine holds its
    share (weights, adapters and the reserve; the update's activations too when sleep mode
    is off) and both processes' CUDA contexts, at most ENGINE_SHARE_CAP, rounded down to 0.01."""
    assert isinstance(config.engine, VLLMParams)
    without = predict(replace(config, engine=replace(config.engine, gpu_memory_utilization=0.0)), gpu_memory_gb, arch)
    kept = without.update_phase if not config.engine.enable_sleep_mode else without.rollout_phase
    free = 1.0 - (kept + 2 * CUDA_CONTEXT_BYTES) / (gpu_memory_gb * GIB)
    return math.floor(min(ENGINE_SHARE_CAP, free) * 100) / 100


def layer_bytes_per_token(arch: dict, dtype_bytes: int) -> float:
    widths = {
        "hidden": arch["hidden_size"],
        "q": arch["num_attention_heads"] * arch["head_dim"],
        "kv": arch["num_key_value_heads"] * arch["head_dim"],
        "intermediate": arch["intermediate_size"],
    }
    elements = sum(LAYER_WIDTH_COEFFS[k] * w for k, w in widths.items())
    return elements * dtype_bytes + LAYER_FP32_HIDDEN * 4 * arch["hidden_size"]


def predict(
    config: RunConfig, gpu_memory_gb: float, arch: dict | None = None, micro_tokens: int | None = None
) -> MemoryEstimate:
    """Peak bytes on one GPU of `gpu_memory_gb` for this cell (the module docstring lists the
    terms); `micro_tokens`: the largest micro-batch's tokens when known (default: the budget)."""
    arch = arch or architecture(config)
    if arch is None:
        raise ValueError(f"no published architecture for '{config.model.name_or_path}'")
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
    update_phase = weights + adapters + (activations + logits if config.trains else 0) + RESERVE_BYTES
    rollout = _rollout_bytes(config, arch, b, gpu_memory_gb * GIB)
    rollout_phase = weights + adapters + rollout + RESERVE_BYTES
    if isinstance(config.engine, VLLMParams) and not config.engine.enable_sleep_mode:
        update_phase += rollout
    return MemoryEstimate(weights, adapters, activations, logits, rollout, update_phase, rollout_phase)


def _rollout_bytes(config: RunConfig, arch: dict, dtype_bytes: int, gpu_bytes: float) -> float:
    if isinstance(config.engine, VLLMParams):
        share = config.engine.gpu_memory_utilization
        if share is None:
            share = engine_share(config, gpu_bytes / GIB, arch)
        return share * gpu_bytes
    # engine=hf: a KV cache per sub-batch of requests, each up to the longest prompt plus
    # the response limit, and one decoding step's float32 logits and log-probs.
    requests = max(config.train.batch_problems * config.grpo.n, 1) * config.parallel_slots
    # An engine without a batch cap (a plugin's) is counted as generating every request at once.
    rows = min(config.engine.max_batch_size, requests) if isinstance(config.engine, HFParams) else requests
    tokens = config.lengths.max_prompt_tokens + config.lengths.max_response_tokens
    kv_per_token = arch["num_hidden_layers"] * 2 * arch["num_key_value_heads"] * arch["head_dim"] * dtype_bytes
    return rows * (tokens * kv_per_token + 2 * 4 * arch["vocab_size"])

