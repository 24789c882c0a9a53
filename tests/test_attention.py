"""Grouped-query attention without key/value copies: the same numbers as transformers' sdpa."""

from __future__ import annotations

import torch


def test_grouped_attention_equals_sdpa_to_the_bit_in_forward_backward_and_sampling(toy_world) -> None:
    """The toy model has 4 query heads on 2 key/value heads, and a left-padded batch gives a
    mask: the case where transformers copies keys and values. Logits, every gradient and
    sampled tokens (same seed) must be equal, not close: swapping the kernel may not move a run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gridrun.train.attention import GROUPED_SDPA, use_grouped_attention

    tokenizer = AutoTokenizer.from_pretrained(toy_world, padding_side="left")
    plain = AutoModelForCausalLM.from_pretrained(toy_world)
    grouped = AutoModelForCausalLM.from_pretrained(toy_world)
    use_grouped_attention(grouped)
    assert plain.config._attn_implementation == "sdpa" and grouped.config._attn_implementation == GROUPED_SDPA
    assert plain.config.num_attention_heads == 2 * plain.config.num_key_value_heads
    batch = tokenizer(["12 + 34 = ", "<|im_start|>user\nSolve: 45 + 17<|im_end|>\n", "9 + 9"], return_tensors="pt",
                      padding=True)
    assert not bool(batch["attention_mask"].all())
    for model in (plain, grouped):
        model.zero_grad()
        model(**batch).logits.logsumexp(-1).sum().backward()
    assert torch.equal(plain(**batch).logits, grouped(**batch).logits)
    for (name, a), b in zip(plain.named_parameters(), grouped.parameters()):
        assert torch.equal(a.grad, b.grad), name
    drawn = []
    for model in (plain, grouped):
        torch.manual_seed(0)
        drawn.append(model.generate(**batch, do_sample=True, temperature=0.7, max_new_tokens=16))
    assert torch.equal(*drawn)


def test_the_trainer_loads_cpu_models_with_grouped_attention(toy_model) -> None:
    from gridrun.train.attention import GROUPED_SDPA

    model, _ = toy_model
    assert model.config._attn_implementation == GROUPED_SDPA
