"""Chunked completion log-probs: the same numbers and gradients as one full-vocabulary pass."""

from __future__ import annotations

import pytest
import torch

from gridrun.train import logprobs
from gridrun.train.padding import pad_rows


def test_chunks_change_neither_values_nor_gradients(toy_model) -> None:
    model, tokenizer = toy_model
    torch.manual_seed(0)
    vocab = len(tokenizer)
    # 3 left-padded rows of width 20, completions of 9 tokens right-aligned.
    input_ids = torch.randint(5, vocab, (3, 20))
    attention = torch.ones_like(input_ids)
    attention[0, :4] = 0
    targets = input_ids[:, -9:]
    head = model.get_output_embeddings().weight

    def run(chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        head.requires_grad_(True)
        head.grad = None
        logp, entropy = logprobs.completion_logprobs(model, input_ids, attention, targets, 0.7, chunk_tokens=chunk)
        logp.sum().backward()
        grad = head.grad.clone()
        head.requires_grad_(False)
        return logp.detach(), entropy, grad

    # 27 positions: one pass (27 <= 64) against chunks of 4 (7 chunks, checkpointed).
    whole, chunked = run(64), run(4)
    torch.testing.assert_close(whole[0], chunked[0], rtol=1e-6, atol=1e-6)
    # Entropy = logsumexp(z) - sum p z cancels terms of the logits' size, so its rounding is the
    # logits' float32 eps (~1e-6 x |z|), not its own: 4e-6 apart on the shipped world's logits.
    torch.testing.assert_close(whole[1], chunked[1], rtol=1e-6, atol=1e-5)
    # The head's gradient sums over positions in another order: float32 rounding only, which
    # scales with its largest entries (about 91 on the shipped world: 3e-5 apart at most).
    torch.testing.assert_close(whole[2], chunked[2], rtol=1e-4, atol=1e-6 * float(whole[2].abs().max()))


def test_logprobs_are_those_of_the_tempered_softmax(toy_model) -> None:
    model, tokenizer = toy_model
    input_ids = torch.randint(5, len(tokenizer), (2, 12))
    attention = torch.ones_like(input_ids)
    targets = input_ids[:, -5:]
    logp, entropy = logprobs.completion_logprobs(model, input_ids, attention, targets, 0.7)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, -6:-1].float() / 0.7
    reference = torch.log_softmax(logits, -1)
    torch.testing.assert_close(logp, reference.gather(-1, targets.unsqueeze(-1)).squeeze(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, -(reference.exp() * reference).sum(-1), rtol=1e-5, atol=1e-5)
    # The no-grad passes ask for none: same log-probs, no second pass over the vocabulary.
    alone, none = logprobs.completion_logprobs(model, input_ids, attention, targets, 0.7, with_entropy=False)
    assert none is None
    torch.testing.assert_close(alone, logp, rtol=0, atol=0)


def test_shared_prompts_give_the_full_rows_logprobs_and_gradients(toy_model) -> None:
    # 5 rows on 2 distinct prompts (9 and 14 tokens), completions of 5, 1, 7, 3 and 6 tokens
    # (the 1-token one is predicted by its prompt's last position alone).
    model, tokenizer = toy_model
    gen = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(5, len(tokenizer), (n,), generator=gen).tolist()

    a, b = tokens(9), tokens(14)
    prompts = [a, a, b, a, b]
    completions = [tokens(n) for n in (5, 1, 3, 7, 6)]
    targets, mask = pad_rows(completions, 0, "left")
    input_ids, attention = pad_rows([p + c for p, c in zip(prompts, completions)], 0, "left")
    # The gradient must reach a key projection (through the shared prompt's cache) and the
    # tied embedding (through the prompt's tokens and the output layer).
    weights = [model.model.layers[0].self_attn.k_proj.weight, model.get_output_embeddings().weight]
    seen: list[int] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))

    def run(shared: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        for w in weights:
            w.requires_grad_(True)
            w.grad = None
        if shared:
            logp, entropy = logprobs.shared_prompt_logprobs(model, prompts, completions, 0, 0.7)
        else:
            logp, entropy = logprobs.completion_logprobs(model, input_ids, attention, targets, 0.7)
        # Position-dependent weights so that no gradient can cancel by symmetry.
        (logp * mask * torch.linspace(0.5, 1.5, logp.shape[1])).sum().backward()
        grads = [w.grad.clone() for w in weights]
        for w in weights:
            w.requires_grad_(False)
        assert entropy is not None
        return logp.detach(), entropy, grads

    try:
        full, shared = run(False), run(True)
    finally:
        hook.remove()
    # Tokens through the backbone: in full 5 rows x 20 (the longest row, 14 + 6) = 100;
    # shared, 2 prompts x 14 (padded), then 5 rows x 6 (every completion token but the last,
    # padded to the longest: 7 - 1) = 58.
    assert seen == [100, 28, 30]
    on = mask.bool()
    torch.testing.assert_close(shared[0][on], full[0][on], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[1][on], full[1][on], rtol=1e-5, atol=1e-5)
    # Padding holds exact zeros (the full rows hold the log-probs of pad positions there).
    assert torch.count_nonzero(shared[0][~on]) == 0 and torch.count_nonzero(shared[1][~on]) == 0
    for full_grad, shared_grad in zip(full[2], shared[2]):
        assert full_grad.abs().max() > 0
        # float32 sums of the same terms in another order: one element of 48,384 differed by
        # 1.3e-5 on a fresh install (transformers 5.19), so 2e-5; a lost path differs by far more.
        torch.testing.assert_close(shared_grad, full_grad, rtol=1e-4, atol=2e-5)


def test_gradient_checkpointing_keeps_the_full_rows(toy_world) -> None:
    # transformers drops the cache under gradient checkpointing in training mode: there the
    # shared path has no prompt to score completions on, so the update takes the full rows.
    from gridrun.seam.runconfig import ModelSpec, ToySpec
    from gridrun.train.model import load_base

    model, _ = load_base(ModelSpec(name_or_path="toy", toy=ToySpec()), str(toy_world))
    prompts, completions = [[11, 12, 13, 14]] * 2, [[21, 22, 23], [24, 25]]
    model.eval()
    assert logprobs.can_share_prompts(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert not logprobs.can_share_prompts(model)
    with torch.no_grad(), pytest.raises(ValueError, match="can_share_prompts"):
        logprobs.shared_prompt_logprobs(model, prompts, completions, 0, 0.7)
    model.eval()  # checkpointing acts only in training mode
    assert logprobs.can_share_prompts(model)
