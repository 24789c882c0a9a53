"""The packed, unpadded update (gridrun/train/cpu/packed.py `packed_logprobs`, cpu/attention.py
`PackedLayout`) against the padded one it replaces: the same log-probs, entropies, every
role's gradient and gradient norm, and the same metrics, to float rounding (float32,
random-init Qwen3 architecture, mixed lengths, repeated prompts, SP and IP)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from gridrun.seam.routing import Routing
from gridrun.seam.runconfig import GRPOSpec
from gridrun.train import cpu, logprobs
from gridrun.train.cpu.attention import PackedLayout, use_grouped_attention
from gridrun.train.cpu.packed import packed_logprobs, packed_rows
from gridrun.train.padding import pad_rows
from gridrun.train.policy import adapter_parameters
from gridrun.train.update import TrainSeq, UpdateSettings, micro_batches, update

VOCAB = 512


def _model(adapters: tuple[str, ...], checkpointing: bool = False) -> Any:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    base = Qwen3ForCausalLM(config).float()
    use_grouped_attention(base)
    base.requires_grad_(False)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(base, lora, adapter_name=adapters[0])
    for name in adapters[1:]:
        model.add_adapter(name, lora)
    with torch.no_grad():  # LoRA B starts at 0, so A would get no gradient: give both some
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _rows(roles: dict[str, str], seed: int = 0) -> list[TrainSeq]:
    """Each role: 3 prompts x 4 samples, prompts 3-24 tokens, completions 1-40 (long-tailed)."""
    rng = random.Random(seed)
    seqs = []
    for role, adapter in roles.items():
        for _ in range(3):
            prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 24))]
            for _ in range(4):
                length = min(40, max(1, int(rng.paretovariate(1.2) * 3)))
                seqs.append(TrainSeq(role, adapter, prompt, [rng.randrange(1, VOCAB) for _ in range(length)],
                                     [-rng.random() * 3 for _ in range(length)], rng.gauss(0, 1), rng.random() < 0.2))
    return seqs


def _settings(budget: int, minibatch: int) -> UpdateSettings:
    return UpdateSettings(grpo=GRPOSpec(), minibatch_size=minibatch, micro_token_budget=budget, temperature=0.7,
                          grad_clip=1e9, pad_id=0)


def _step(roles: dict[str, str], packed: bool, budget: int, minibatch: int, monkeypatch: pytest.MonkeyPatch,
          checkpointing: bool = False) -> tuple[dict[str, float], dict[str, torch.Tensor], list[TrainSeq]]:
    """One update with SGD at lr 1 and no clipping: each weight moves by minus its gradient."""
    adapters = tuple(dict.fromkeys(roles.values()))
    model = _model(adapters, checkpointing)
    monkeypatch.setattr(cpu, "applies", lambda _model: packed)
    before = {f"{a}/{k}": v.detach().clone() for a in adapters for k, v in adapter_parameters(model, a).items()}
    optimizers = {a: torch.optim.SGD(list(adapter_parameters(model, a).values()), lr=1.0) for a in adapters}
    seqs = _rows(roles)
    metrics = update(model, Routing(dict(roles), adapters), optimizers, seqs, _settings(budget, minibatch),
                     dict.fromkeys(adapters, 1.0), random.Random(0))
    grads = {k: before[k] - v.detach() for a in adapters for k, v in
             ((f"{a}/{n}", p) for n, p in adapter_parameters(model, a).items())}
    return metrics, grads, seqs


@pytest.mark.parametrize("roles", [
    {"generator": "shared", "evaluator": "shared", "aggregator": "shared"},
    {"generator": "generator", "evaluator": "evaluator"},
], ids=["SP", "IP"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("batched", [False, True], ids=["by_group", "batched"])
def test_the_packed_update_equals_the_padded_one(roles: dict[str, str], checkpointing: bool, batched: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gridrun.train.cpu import attention

    monkeypatch.setattr(attention, "BATCH_PADDING_LIMIT", float("inf") if batched else 0.0)
    # Mini-batches of 8 rows: each adapter takes several optimizer steps, so the old-log-prob
    # pass runs (every mini-batch after the first); one micro-batch per role and mini-batch on
    # both paths (a large budget), so the per-micro-batch means (chi2, ppl) see the same rows.
    padded = _step(roles, False, 100_000, 8, monkeypatch, checkpointing)
    packed = _step(roles, True, 100_000, 8, monkeypatch, checkpointing)
    assert_same_update(packed, padded)


def assert_same_update(ours: Any, reference: Any) -> None:
    """Two `_step` results agree to float rounding: metrics, every adapter's gradient, the
    old log-probs and entropies (and something was learned)."""
    assert reference[0].keys() == ours[0].keys()
    for key, value in reference[0].items():
        assert ours[0][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert any(key.endswith("/grad_norm") and value > 0 for key, value in ours[0].items())
    for key, grad in reference[1].items():
        torch.testing.assert_close(ours[1][key], grad, rtol=1e-4, atol=1e-6)
    assert any(grad.abs().max() > 0 for grad in ours[1].values())
    for a, b in zip(reference[2], ours[2]):
        assert (a.old_logp is None) == (b.old_logp is None)
        if a.old_logp is not None and b.old_logp is not None:
            torch.testing.assert_close(torch.tensor(b.old_logp), torch.tensor(a.old_logp), rtol=0, atol=1e-5)
            assert b.old_entropy == pytest.approx(a.old_entropy, rel=1e-5)


def test_cuts_by_real_tokens_change_only_the_per_micro_batch_means(monkeypatch: pytest.MonkeyPatch) -> None:
    # A budget of 60 tokens: packed and padded cut different micro-batches, and the gradients,
    # losses and counts do not depend on the cuts.
    roles = {"generator": "shared", "evaluator": "shared"}
    padded = _step(roles, False, 60, 24, monkeypatch)
    packed = _step(roles, True, 60, 24, monkeypatch)
    for key, value in padded[0].items():
        if not key.endswith(("/chi2", "/chi2_centered", "/ppl")):
            assert packed[0][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for key, grad in padded[1].items():
        torch.testing.assert_close(packed[1][key], grad, rtol=1e-4, atol=1e-6)


def test_packed_micro_batches_count_real_tokens_and_each_prompt_once() -> None:
    seqs = _rows({"generator": "shared"})
    for budget in (30, 60, 200):
        chunks = list(micro_batches(seqs, budget, packed=True))
        assert sorted(map(id, (s for c in chunks for s in c))) == sorted(map(id, seqs))
        for chunk in chunks:
            ids, _, layout, _ = packed_rows([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk])
            assert len(ids) == layout.tokens
            assert len(ids) <= budget or len(chunk) == 1
    # The padded cut computes rows x width, the packed one only real tokens: fewer micro-batches.
    assert len(list(micro_batches(seqs, 200, packed=True))) < len(list(micro_batches(seqs, 200)))


# The three ways packed attention runs: every piece its own call, a prompt's completions in
# one call, every prompt and every completion in one padded batch each.
STRATEGIES = {"piece_by_piece": (0, 0.0), "group_at_once": (1 << 20, 0.0), "batched": (0, float("inf"))}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_packed_log_probs_match_full_rows_and_the_layout_refuses_gaps(strategy: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from gridrun.train.cpu import attention

    monkeypatch.setattr(attention, "GROUP_MASK_ENTRIES", STRATEGIES[strategy][0])
    monkeypatch.setattr(attention, "BATCH_PADDING_LIMIT", STRATEGIES[strategy][1])
    model = _model(("policy",))
    rows = _rows({"generator": "policy"}, seed=3)
    prompts, completions = [s.prompt_ids for s in rows], [s.completion_ids for s in rows]
    with torch.no_grad():
        packed, packed_entropy = packed_logprobs(model, prompts, completions, 0.7)
        targets, mask = pad_rows(completions, 0, "left")
        ids, attention = pad_rows([p + c for p, c in zip(prompts, completions)], 0, "left")
        full, full_entropy = logprobs.completion_logprobs(model, ids, attention, targets, 0.7)
    assert packed_entropy is not None and full_entropy is not None
    layout = packed_rows(prompts, completions)[2]
    assert (layout.batched(torch.device("cpu")) is not None) == (strategy == "batched")
    torch.testing.assert_close(packed * mask, full * mask, rtol=0, atol=1e-5)
    torch.testing.assert_close(packed_entropy * mask, full_entropy * mask, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="tile the row"):
        PackedLayout((((0, 3), ((4, 2),)),))
    with pytest.raises(ValueError, match="at least one token"):
        packed_rows([[]], [[1, 2]])


def test_the_update_benchmark_runs_on_the_toy_world() -> None:
    # bench/update.py without TRL: the packed path computes no padding and fewer tokens than
    # the padded one (each distinct prompt once), on the same rows and optimizer steps.
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "update.py"
    done = subprocess.run([sys.executable, str(bench), "--model", "toy", "--no-trl", "--repeats", "1", "--problems", "1",
                           "--n", "2", "--response-tokens", "24", "--token-budget", "256", "--json"],
                          capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    packed, padded = result["packed"], result["padded"]
    assert packed["pad_fraction"] == 0 and padded["pad_fraction"] > 0
    assert packed["tokens_computed"] < padded["tokens_computed"]
    assert packed["opt_steps"] == padded["opt_steps"] == 4
    assert set(packed["phases"]) == {"old_logprobs", "forward", "backward", "optimizer", "bookkeeping"}


def test_a_model_without_gridruns_attention_never_takes_the_cpu_fast_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a GPU, where load_base keeps transformers' attention: the one door is shut, and the
    # update runs padded, on peft's own LoRA layers.
    import gridrun.train.update as update_module

    model = _model(("a",))
    model.get_base_model().set_attn_implementation("sdpa")
    assert not cpu.applies(model)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a CPU fast path ran")

    for name in ("fused_lora", "packed_logprobs", "packed_cuts"):
        monkeypatch.setattr(update_module, name, refuse)
    optimizers = {"a": torch.optim.SGD(list(adapter_parameters(model, "a").values()), lr=1.0)}
    metrics = update(model, Routing({"generator": "a"}, ("a",)), optimizers, _rows({"generator": "a"}),
                     _settings(4096, 4), {"a": 1.0}, random.Random(0))
    assert metrics["adapter/a/grad_norm"] > 0


def test_a_policy_loss_of_the_wrong_shape_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from gridrun.seam.registry import ConfigError
    from gridrun.train import losses

    monkeypatch.setattr(losses, "_POLICY_LOSSES", dict(losses._POLICY_LOSSES))

    @losses.register_policy_loss("per_row")
    def per_row(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, spec: Any) -> Any:
        return (logp - old).sum(1), torch.zeros_like(logp, dtype=torch.bool)  # one value per row: wrong

    model = _model(("a",))
    optimizers = {"a": torch.optim.SGD(list(adapter_parameters(model, "a").values()), lr=1.0)}
    settings = dataclasses.replace(_settings(4096, 4), policy_loss="per_row")
    with pytest.raises(ConfigError, match=r"grpo.policy_loss 'per_row' returned shapes \[\[\d+\], \[\d+, \d+\]\]"):
        update(model, Routing({"generator": "a"}, ("a",)), optimizers, _rows({"generator": "a"}), settings,
               {"a": 1.0}, random.Random(0))
