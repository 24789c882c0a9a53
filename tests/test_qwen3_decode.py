"""engine=hf's lean Qwen3 loop (gridrun/train/cpu/qwen3_decode.py) against transformers'
generate from the same prefilled cache: the same tokens and the same log-probs, to the bit,
with padding and without, sampled and greedy, on the base model and on a merged adapter; and
generate wherever the loop does not apply."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model

from gridrun.seam.runconfig import ModelSpec, ToySpec
from gridrun.train.cpu import qwen3_decode
from gridrun.train.engines.hf import HFEngine
from gridrun.train.model import load_base
from gridrun.train.rollout import Completion, GenRequest, SamplingParams


@pytest.fixture(scope="module")
def adapted(toy_world: Any) -> tuple[Any, Any]:
    """The toy model with one adapter whose B is not zero (a real delta to merge)."""
    base, tokenizer = load_base(ModelSpec(name_or_path="toy", toy=ToySpec()), str(toy_world))
    torch.manual_seed(0)  # A's initialisation too: the same adapter in every process
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"), adapter_name="gen")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
    return model, tokenizer


def _engines(model: Any, tokenizer: Any) -> tuple[HFEngine, HFEngine]:
    """(the lean loop, generate), both decoding from a prefill of every column but the last."""
    lean, reference = HFEngine(model, tokenizer), HFEngine(model, tokenizer, lean_decode=False)
    prefill = reference._prefill
    reference._prefill = lambda prompts, ids, attention, always: prefill(prompts, ids, attention, True)  # type: ignore[method-assign]
    return lean, reference


def _run(engine: HFEngine, requests: list[GenRequest], sampling: SamplingParams, seed: int) -> list[Completion]:
    torch.manual_seed(seed)
    return engine.generate(requests, sampling)


@pytest.mark.parametrize("adapter", [None, "gen"], ids=["base", "merged_adapter"])
@pytest.mark.parametrize("temperature", [0.7, 0.0], ids=["sampled", "greedy"])
def test_the_lean_loop_draws_generates_tokens_and_log_probs_to_the_bit(adapted: tuple[Any, Any], adapter: str | None,
                                                                       temperature: float,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = adapted
    lean, reference = _engines(model, tokenizer)
    monkeypatch.setattr(qwen3_decode, "FIRST_CACHE_STEPS", 3)  # the cache grows twice in 12 steps
    taken: list[int] = []
    sample = qwen3_decode.sample
    monkeypatch.setattr(qwen3_decode, "sample", lambda *args: taken.append(1) or sample(*args))
    gen = torch.Generator().manual_seed(1)
    a, b, c, d = (torch.randint(5, len(tokenizer), (n,), generator=gen).tolist() for n in (9, 14, 5, 14))
    batches = {
        "repeated, padded": [a, b, a, c, b, a, c, a, b, c, b, c],
        "distinct, padded": [a, b, c],
        "no padding": [b, d, b, d],
    }
    sampling = SamplingParams(temperature=temperature, max_new_tokens=12)
    for name, prompts in batches.items():
        requests = [GenRequest(p, adapter) for p in prompts]
        for seed in range(3):
            ours, theirs = _run(lean, requests, sampling, seed), _run(reference, requests, sampling, seed)
            assert [o.token_ids for o in ours] == [o.token_ids for o in theirs], name
            assert [o.logprobs for o in ours] == [o.logprobs for o in theirs], name
            assert [o.finish_reason for o in ours] == [o.finish_reason for o in theirs], name
    assert len(taken) == 3 * len(batches)
    assert sum(len(o.token_ids) for o in ours) > len(ours)  # they decoded, not only stopped at once


def test_the_lean_loop_stands_aside_where_it_would_not_serve_the_same_policy(adapted: tuple[Any, Any],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = adapted
    taken: list[int] = []
    sample = qwen3_decode.sample
    monkeypatch.setattr(qwen3_decode, "sample", lambda *args: taken.append(1) or sample(*args))
    requests = [GenRequest([7, 8, 9, 10], "gen"), GenRequest([7, 8, 9, 10], "gen")]
    # An unmerged adapter is peft's computation, not the base weights the loop reads.
    HFEngine(model, tokenizer, merge_lora=False).generate(requests, SamplingParams(0.7, 4))
    # top-p is generate's warper; one-column prompts have no prefill to start from.
    HFEngine(model, tokenizer).generate(requests, SamplingParams(0.7, 4, top_p=0.9))
    HFEngine(model, tokenizer).generate([GenRequest([7], "gen")], SamplingParams(0.7, 4))
    assert taken == []
    HFEngine(model, tokenizer).generate(requests, SamplingParams(0.7, 4))
    assert taken == [1]
    causal_lm = model.get_base_model()
    assert qwen3_decode.unsupported(causal_lm) is None
    monkeypatch.setattr(causal_lm.config, "_attn_implementation", "sdpa")
    assert "grouped" in str(qwen3_decode.unsupported(causal_lm))
    assert HFEngine(model, tokenizer).lean_blocker == "attention is sdpa, not gridrun's grouped sdpa"
