"""Grouped-query attention without key/value copies: the same numbers as transformers' sdpa."""

from __future__ import annotations

from typing import Any

import torch


def test_grouped_attention_equals_sdpa_to_the_bit_in_forward_backward_and_sampling(toy_world) -> None:
    """The toy model has 4 query heads on 2 key/value heads, and a left-padded batch gives a
    mask: the case where transformers copies keys and values. Logits, every gradient and
    sampled tokens (same seed) must be equal, not close: swapping the kernel may not move a run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gridrun.train.cpu.attention import GROUPED_SDPA, use_grouped_attention

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
    from gridrun.train.cpu.attention import GROUPED_SDPA

    model, _ = toy_model
    assert model.config._attn_implementation == GROUPED_SDPA


def _layout(prompt: int, completions: list[int], groups: int = 1) -> Any:
    from gridrun.train.cpu.attention import PackedLayout

    built, at = [], 0
    for _ in range(groups):
        pieces = []
        start, at = at, at + prompt
        for n in completions:
            pieces.append((at, n))
            at += n
        built.append(((start, prompt), tuple(pieces)))
    return PackedLayout(tuple(built))


def test_packed_pieces_batch_where_padding_is_cheap_and_give_the_group_by_group_values(monkeypatch) -> None:
    from gridrun.train.cpu import attention

    cpu = torch.device("cpu")
    # The toy world's update: 8 prompts of 20 tokens, 8 completions of 17-20 each: batched.
    assert _layout(20, [17, 18, 19, 20, 20, 18, 19, 20], groups=8).batched(cpu) is not None
    # A long-tailed mix pads each short completion to 500 tokens: 4 x 500 x 520 padded entries
    # against ~261k of its own, past the limit of 2: group by group.
    assert _layout(20, [5, 5, 5, 500]).batched(cpu) is None
    # Same values, forward and backward, whichever way it runs: prompts of different lengths,
    # an empty completion, a group with none.
    from gridrun.train.cpu.attention import PackedLayout

    layout = PackedLayout((((0, 5), ((5, 3), (8, 0), (8, 6))), ((14, 2), ()), ((16, 7), ((23, 1),))))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, h, layout.tokens, 8, requires_grad=True) for h in (4, 2, 2))
    results = []
    for limit in (float("inf"), 0.0):
        monkeypatch.setattr(attention, "BATCH_PADDING_LIMIT", limit)
        fresh = PackedLayout(layout.groups)  # plans are cached per layout
        assert (fresh.batched(cpu) is not None) == (limit > 0)
        out = attention.packed_sdpa(q, k, v, fresh, None)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), (q, k, v))
        results.append((out, *grads))
    for batched, by_group in zip(*results):
        torch.testing.assert_close(batched, by_group, rtol=1e-5, atol=1e-6)
