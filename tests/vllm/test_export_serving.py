"""`gridrun export`'s folders are what vLLM serves: each adapter of an Isolated-Policy cell,
exported, goes to vLLM as a plain `LoRARequest(name, id, folder)`, and every request samples
from its own adapter (its log-probs equal a teacher-forced peft forward of that adapter,
and are far from the other's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gridrun.cellrun import model_files
from gridrun.export import export
from gridrun.seam.rundir import RunDir
from gridrun.train import checkpoint
from tests.conftest import make_cell
from tests.vllm.helpers import peft_logprobs, prompts, randomize_lora_b, trainer_model, vllm_config

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]

CELL = "voting-ip-toy-arith-s0"


def test_vllm_serves_each_exported_adapter_through_a_lora_request(tmp_path: Path) -> None:
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from gridrun.train.engines.vllm import _release_vllm_process_state

    overrides = {"workflow": {"name": "voting"}, "policy": {"name": "isolated"}}
    config = vllm_config(**overrides)
    model, tokenizer, routing = trainer_model(config)
    randomize_lora_b(model, seed=11, scale=0.2)  # two distinct adapters, both far from the base
    run_dir = RunDir(make_cell(tmp_path, CELL, **overrides))
    checkpoint.save(run_dir, 3, model, routing.trainable, {}, {"step": 3}, keep=2, roles=routing.role_adapter)
    out = export(run_dir, "last", tmp_path / "export")
    assert json.loads((out / "roles.json").read_text()) == {"generator": "generator", "aggregator": "aggregator"}

    llm = vllm.LLM(model=model_files(config.model), dtype="float32", seed=0, enable_lora=True, max_loras=2,
                   max_lora_rank=8, max_model_len=512, kv_cache_memory_bytes=64 << 20,
                   logprobs_mode="processed_logprobs", generation_config="vllm")
    try:
        requests = {name: LoRARequest(name, i + 1, str(out / name)) for i, name in enumerate(("generator", "aggregator"))}
        prompt = prompts(tokenizer, 1)[0]
        sampling = vllm.SamplingParams(temperature=1.0, top_k=0, seed=0, max_tokens=16, logprobs=0)
        served = {
            name: llm.generate([TokensPrompt(prompt_token_ids=prompt)], sampling, lora_request=[request],
                               use_tqdm=False)[0].outputs[0]
            for name, request in requests.items()
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        _release_vllm_process_state()
    for name, other in (("generator", "aggregator"), ("aggregator", "generator")):
        done = served[name]
        got = torch.tensor([step[t].logprob for step, t in zip(done.logprobs, done.token_ids)])
        own = peft_logprobs(model, name, prompt, list(done.token_ids), 1.0)
        theirs = peft_logprobs(model, other, prompt, list(done.token_ids), 1.0)
        assert float((got - own).abs().max()) < 1e-4, name
        assert float((got - theirs).abs().mean()) > 1e-2, name
