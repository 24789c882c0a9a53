"""The built-in rollout engines' registry entries: each engine's name and the settings its
config node takes. Torch-free, so the grid checks an engine node at plan time; the engines
themselves live in the train half (gridrun/train/engines/<name>.py), reached through each
entry's `factory`. Sampling settings are not here: they are one `sampling:` block whatever
the engine (gridrun/seam/runconfig.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from gridrun.seam.registry import Engine, EngineParams, register_engine


@dataclass
class HFParams(EngineParams):
    """transformers' generate on the trainer's own peft model: CPU, tests and debugging."""

    name: str = "hf"
    # Requests generated together; each holds a KV cache of its prompt plus the response
    # limit (the dry run's memory model counts it: lower it when a cell does not fit).
    max_batch_size: int = 512


@dataclass
class VLLMParams(EngineParams):
    """vLLM with multi-LoRA: one LoRARequest per adapter, refreshed after every update."""

    name: str = "vllm"
    # Share of its GPU's memory vLLM may take; the trainer holds the rest (weights, adapters,
    # optimizer state). null: sized by the memory model when the cell is planned for a GPU
    # class (gridrun/memory.py `engine_share`: the GPU less the trainer's resident share, at
    # most 0.85, the released code's value) and at engine start on a GPU otherwise.
    gpu_memory_utilization: float | None = None
    # Reuse the KV cache of shared prompt prefixes (the n rollouts of one problem).
    enable_prefix_caching: bool = True
    # Release vLLM's memory while the trainer updates.
    enable_sleep_mode: bool = True


register_engine(Engine(name="hf", params=HFParams, factory="gridrun.train.engines:hf_engine"))
register_engine(Engine(name="vllm", params=VLLMParams, factory="gridrun.train.engines:vllm_engine"))
