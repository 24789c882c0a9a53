"""Chunked completion log-probs: the same numbers and gradients as one full-vocabulary pass."""

from __future__ import annotations

import torch

from gridrun.train import logprobs


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
    torch.testing.assert_close(whole[1], chunked[1], rtol=1e-6, atol=1e-6)
    # The head's gradient sums over positions in another order: float32 rounding only.
    torch.testing.assert_close(whole[2], chunked[2], rtol=1e-4, atol=1e-5)


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
