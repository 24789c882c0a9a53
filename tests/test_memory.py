"""The dry run's memory model: each term worked out by hand for Qwen3-1.7B."""

from __future__ import annotations

from dataclasses import dataclass

from gridrun.memory import (
    CUDA_CONTEXT_BYTES,
    ENGINE_ASLEEP_BYTES,
    ENGINE_SHARE_CAP,
    GIB,
    LOGITS_COPIES,
    RESERVE_BYTES,
    architecture,
    engine_floor,
    engine_room,
    engine_share,
    fit_problem,
    predict,
)
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
    estimate = predict(cell(policy={"name": "isolated"}, lora={"rank": 64}), usable_gib=80)
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
    # The trainer process and vLLM's engine core each hold a CUDA context on the GPU.
    assert estimate.contexts == 2 * CUDA_CONTEXT_BYTES
    assert estimate.trainer_kept == estimate.weights + estimate.adapters + RESERVE_BYTES
    assert estimate.trainer_update == estimate.trainer_kept + estimate.activations + estimate.logits
    # The update beside the sleeping engine's CUDA graphs; the rollout beside the awake engine,
    # with what the trainer keeps once it returned its cache.
    assert estimate.update_phase == estimate.trainer_update + ENGINE_ASLEEP_BYTES + estimate.contexts
    assert estimate.peak == estimate.rollout_phase == estimate.trainer_kept + estimate.rollout + estimate.contexts
    # Woken beside the update's reserved peak, the engine would need both at once.
    assert estimate.unreleased == estimate.trainer_update + estimate.rollout + estimate.contexts


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
    # Asleep, vLLM keeps only its CUDA graphs' pool of the 0.5 share.
    assert awake.update_phase - asleep.update_phase == 0.5 * 80 * GIB - ENGINE_ASLEEP_BYTES
    # engine=hf generates in the trainer's own process: one CUDA context, nothing asleep.
    hf = predict(cell(engine={"name": "hf", "max_batch_size": 4}), 80)
    assert (hf.contexts, hf.engine_asleep) == (CUDA_CONTEXT_BYTES, 0.0)
    assert hf.update_phase == hf.trainer_update + CUDA_CONTEXT_BYTES


def test_the_engine_share_is_the_card_less_the_trainer_and_the_contexts() -> None:
    config = cell(engine={"gpu_memory_utilization": None}, train={"micro_token_budget": 40960})
    # On a 20 GiB card the cap does not bind: the share is what the trainer (weights, its
    # adapter's state, the reserve) and two CUDA contexts leave, rounded down to 0.01.
    kept = predict(config, 20).trainer_kept
    share = engine_share(config, 20)
    assert share == int((1 - (kept + 2 * CUDA_CONTEXT_BYTES) / (20 * GIB)) * 100) / 100 < ENGINE_SHARE_CAP
    sized = predict(cell(engine={"gpu_memory_utilization": share}, train={"micro_token_budget": 40960}), 20)
    assert 20 * GIB - 0.01 * 20 * GIB < sized.rollout_phase <= 20 * GIB and fit_problem(config, sized) is None
    # Without sleep mode the engine holds its share through the update: the trainer's whole peak comes off.
    awake = cell(engine={"gpu_memory_utilization": None, "enable_sleep_mode": False}, train={"micro_token_budget": 40960})
    peak = predict(awake, 20).trainer_update
    assert engine_share(awake, 20) == int((1 - (peak + 2 * CUDA_CONTEXT_BYTES) / (20 * GIB)) * 100) / 100
    # A large card: the released code's cap.
    assert engine_share(config, 200) == ENGINE_SHARE_CAP


def test_a_phase_over_the_card_names_its_knob_in_one_line() -> None:
    budget = {"micro_token_budget": 40960}
    # The update: 1.7B's 40,960-token micro-batch beside the sleeping engine on a 16 GiB card.
    update = cell(train=budget, engine={"gpu_memory_utilization": 0.1})
    line = fit_problem(update, predict(update, 16))
    assert line is not None and "\n" not in line
    assert line.startswith("its update phase needs 17.6 GiB per GPU of 16 usable (trainer 15.0 (weights 3.2, adapters 1.0, "
                           "activations 5.4, logits 4.6), engine asleep 0.7, CUDA contexts 2.0): ")
    assert line.endswith("lower train.micro_token_budget (now 40960)")
    # The rollout: a share set by hand above what the trainer leaves, with the most that fits
    # (the room, not the released code's cap, which only the plan's own sizing takes).
    rollout = cell(train=budget, engine={"gpu_memory_utilization": 0.95})
    line = fit_problem(rollout, predict(rollout, 80))
    assert line is not None and line.startswith("its rollout phase needs 83.0 GiB per GPU of 80 usable (trainer 5.0 "
                                              "(weights 3.2, adapters 1.0), engine 76.0, CUDA contexts 2.0): ")
    room = int(engine_room(rollout, 80) * 100) / 100
    assert room == 0.91 and line.endswith(f"lower engine.gpu_memory_utilization (now 0.95; at most {room:.2f} fits)")
    # engine=hf: its sub-batch of KV caches, 64 sequences of 25,600 tokens.
    hf = cell(train=budget, engine={"name": "hf", "max_batch_size": 64},
              lengths={"max_prompt_tokens": 20480, "max_response_tokens": 5120})
    line = fit_problem(hf, predict(hf, 80))
    assert line is not None and line.endswith("lower engine.max_batch_size (now 64) or use engine=vllm")


def test_a_share_too_small_for_the_engines_own_weights_is_refused() -> None:
    config = cell(engine={"gpu_memory_utilization": 0.02}, train={"micro_token_budget": 40960})
    estimate = predict(config, 80)
    assert max(estimate.phases.values()) <= 80 * GIB  # every phase fits, but vLLM could not start
    # 1.7B's bf16 weights and the KV cache of one sequence at the limits (512 + 48 tokens):
    # 28 layers x K and V x 8 heads x 128 x 2 bytes a token.
    assert engine_floor(config, architecture(config)) == 1_720_574_976 * 2 + 560 * 28 * 2 * 8 * 128 * 2
    line = fit_problem(config, estimate)
    assert line is not None and line.startswith("its vLLM share 0.02 of 80 GiB (1.6 GiB) holds less than the engine's")
    assert line.endswith("raise engine.gpu_memory_utilization (at most 0.91 fits)")


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
