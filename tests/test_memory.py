"""The dry run's memory model: each term worked out by hand for Qwen3-1.7B."""

from __future__ import annotations

from dataclasses import dataclass

from gridrun.memory import GIB, LOGITS_COPIES, RESERVE_BYTES, predict
from gridrun.seam.registry import Engine, EngineParams, register_engine
from gridrun.seam.runconfig import config_from_dict

QWEN3_1_7B = {"name_or_path": "Qwen/Qwen3-1.7B", "dtype": "bfloat16"}


def cell(**groups: dict) -> object:
    base = {"cell": {"id": "x", "kind": "train"}, "model": QWEN3_1_7B, "workflow": {"name": "voting"},
            "engine": {"name": "vllm", "gpu_memory_utilization": 0.5}, "train": {"micro_token_budget": 1000}}
    for key, value in groups.items():
        # A node naming another option (engine hf) replaces the default one's keys.
        base[key] = value if value.get("name", base.get(key, {}).get("name")) != base.get(key, {}).get("name") \
            else {**base.get(key, {}), **value}
    return config_from_dict(base)


def test_terms_for_a_small_budget() -> None:
    estimate = predict(cell(policy={"name": "isolated"}, lora={"rank": 64}), gpu_memory_gb=80)
    # 1,720,574,976 parameters in bf16.
    assert estimate.weights == 1_720_574_976 * 2
    # Voting-IP: 2 adapters x 69,730,304 LoRA parameters x 12 bytes (fp32 weight + 2 moments),
    # plus one adapter's fp32 gradient.
    assert estimate.adapters == 2 * 69_730_304 * 12 + 69_730_304 * 4
    # Checkpointing keeps each layer's input: 1000 tokens x 28 layers x 2048 x 2 bytes; one
    # layer's working set (1000 x 147,456 bytes) is below one logits chunk, so adds nothing.
    assert estimate.activations == 1000 * 28 * 2048 * 2
    # 1000 positions (under the 2048 chunk) x 151,936 x 4 bytes x the float32 copies.
    assert estimate.logits == 1000 * 151_936 * 4 * LOGITS_COPIES
    assert estimate.rollout == 0.5 * 80 * GIB
    assert estimate.update_phase == estimate.weights + estimate.adapters + estimate.activations + estimate.logits + RESERVE_BYTES
    assert estimate.peak == estimate.rollout_phase == estimate.weights + estimate.adapters + estimate.rollout + RESERVE_BYTES


def test_checkpointing_keeps_layer_inputs_only() -> None:
    on = predict(cell(train={"micro_token_budget": 40960, "gradient_checkpointing": True}), 80)
    off = predict(cell(train={"micro_token_budget": 40960, "gradient_checkpointing": False}), 80)
    # Without it every one of the 28 layers keeps its 147,456-byte-per-token working set;
    # with it, each layer's input, and one layer's working set where it outgrows a logits chunk.
    assert off.activations == 40960 * 28 * 147_456
    assert on.activations == 40960 * 28 * 2048 * 2 + (40960 * 147_456 - 2048 * 151_936 * 4 * LOGITS_COPIES)


def test_sleep_mode_frees_vllms_share_during_the_update() -> None:
    asleep = predict(cell(), 80)
    awake = predict(cell(engine={"enable_sleep_mode": False}), 80)
    assert awake.update_phase - asleep.update_phase == 0.5 * 80 * GIB


def test_hf_rollout_holds_a_kv_cache_per_sub_batch() -> None:
    config = cell(engine={"name": "hf", "max_batch_size": 4},
                  lengths={"max_prompt_tokens": 1000, "max_response_tokens": 24})
    # 4 requests x 1024 tokens x (28 layers x K and V x 8 heads x 128 x 2 bytes), plus one
    # step's float32 logits and log-probs per request.
    assert predict(config, 80).rollout == 4 * (1024 * 28 * 2 * 8 * 128 * 2 + 2 * 4 * 151_936)


def test_the_logits_chunk_is_the_one_the_trainer_uses() -> None:
    # gridrun/memory.py is torch-free, so it restates logprobs.CHUNK_TOKENS: keep them equal.
    from gridrun.memory import LOGITS_CHUNK_TOKENS
    from gridrun.train.logprobs import CHUNK_TOKENS

    assert LOGITS_CHUNK_TOKENS == CHUNK_TOKENS


@dataclass
class BareEngineParams(EngineParams):
    """An engine of a user's own, without hf's batch cap or vLLM's memory share."""

    name: str = "bare_test_engine"


def test_an_engine_without_a_batch_cap_generates_every_request_at_once() -> None:
    # A plugin engine has neither max_batch_size nor gpu_memory_utilization: its KV cache is
    # counted for all 64 problems x 8 samples x 3 voters = 1536 requests, as hf's with a cap
    # above that (the model once read engine.max_batch_size off any engine that was not vLLM).
    register_engine(Engine(name="bare_test_engine", params=BareEngineParams, factory="tests.test_memory:none"))
    lengths = {"max_prompt_tokens": 1000, "max_response_tokens": 24}
    bare = predict(cell(engine={"name": "bare_test_engine"}, lengths=lengths), 80)
    assert bare.rollout == 1536 * (1024 * 28 * 2 * 8 * 128 * 2 + 2 * 4 * 151_936)
    assert bare.rollout == predict(cell(engine={"name": "hf", "max_batch_size": 100_000}, lengths=lengths), 80).rollout
