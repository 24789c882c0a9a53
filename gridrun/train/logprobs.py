"""Per-token log-probs (and entropies) of completions, without a full-vocabulary blow-up.

Qwen3's vocabulary has 151,936 entries: the float32 logits of one PPO micro-batch at the
paper's 40,960-token budget would take 25 GB, and log_softmax, the temperature scaling and
their gradients several times that. So the backbone runs once, and the output layer runs
on chunks of at most `chunk_tokens` completion positions, each under activation
checkpointing: a chunk's logits live only while that chunk's log-probs are computed, and
again during its backward. Peak memory of this step is one chunk's logits, whatever the
budget. On the toy world (384 entries) a micro-batch is one chunk and nothing is recomputed.

log p(token) = logit(token)/T - logsumexp(logits/T): the same distribution the rollout
engines sample from (softmax(logits / T), no top-k).

A GRPO batch holds each prompt n times (n samples of one problem, the voters of one
question). `shared_prompt_logprobs` runs each distinct prompt through the backbone once,
keeps its keys and values, and runs only the completions on top of them, each row on its
prompt's cache: the same function of the weights as the full rows (causal attention: a
prompt's states never see what follows it), so the same log-probs and gradients up to
float rounding, with the prompt's tokens computed once instead of n times. Left out: the
shared path under gradient checkpointing (transformers drops the cache there), where the
full rows run.

On the CPU the update packs its rows instead, with no padding at all
(gridrun/train/cpu/packed.py); the two paths here serve every other model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from gridrun.train.padding import pad_rows

# Completion positions whose output logits are materialised at once (float32, times the
# vocabulary): 2,048 x 151,936 x 4 bytes = 1.2 GB for Qwen3.
CHUNK_TOKENS = 2048


def _chunk(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
           with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each target, entropy or None) for hidden (N, h) and targets (N,)."""
    logits = head(hidden).float() / temperature  # (N, vocab)
    norm = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - norm
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def completion_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool = True,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (batch, T) of `targets` under softmax(logits / temperature), and the
    per-token entropy (batch, T) (no gradient) when asked: it costs a second pass over
    the vocabulary, which the no-grad old-log-prob and reference passes do not need.

    input_ids, attention: (batch, width), left-padded prompt + completion, each completion
    ending at the right edge; targets: (batch, T), the completion tokens right-aligned.
    """
    t_max = targets.shape[1]
    device = next(model.parameters()).device
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    hidden = causal_lm.model(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        use_cache=False,
    ).last_hidden_state
    # The position before each completion token predicts it.
    hidden = hidden[:, -(t_max + 1) : -1].reshape(-1, hidden.shape[-1])
    logp, entropy = head_logprobs(causal_lm, hidden, targets.to(device).reshape(-1), temperature, with_entropy, chunk_tokens)
    return logp.view(-1, t_max), None if entropy is None else entropy.view(-1, t_max)


def head_logprobs(causal_lm: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
          chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) log-probs of `targets` (N,) from the hidden states (N, h) that predict them, and
    their entropies when asked; the output layer runs on chunks of `chunk_tokens`."""
    head = causal_lm.get_output_embeddings()
    temperature = max(temperature, 1e-6)
    if hidden.shape[0] <= chunk_tokens:
        return _chunk(head, hidden, targets, temperature, with_entropy)
    parts = [
        checkpoint(_chunk, head, hidden[i : i + chunk_tokens], targets[i : i + chunk_tokens], temperature,
                   with_entropy, use_reentrant=False)
        if torch.is_grad_enabled()
        else _chunk(head, hidden[i : i + chunk_tokens], targets[i : i + chunk_tokens], temperature, with_entropy)
        for i in range(0, hidden.shape[0], chunk_tokens)
    ]
    entropy = torch.cat([e for _, e in parts if e is not None]) if with_entropy else None  # every chunk's, when asked
    return torch.cat([p[0] for p in parts]), entropy


def prompt_owners(prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """(distinct prompts in order of first appearance, index of each row's prompt among them)."""
    first: dict[tuple[int, ...], int] = {}
    owners = [first.setdefault(tuple(p), len(first)) for p in prompts]
    return [list(p) for p in first], owners


def right_aligned(completions: Sequence[Sequence[int]], logp: torch.Tensor, entropy: torch.Tensor | None,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token values of the rows' completions, concatenated in row order -> (batch, T)
    right-aligned (row-major order is the same in both layouts)."""
    right = pad_rows(completions, 0, "left")[1].bool().to(device)
    logp = torch.zeros(right.shape, device=device, dtype=logp.dtype).masked_scatter(right, logp)
    if entropy is not None:
        entropy = torch.zeros(right.shape, device=device, dtype=entropy.dtype).masked_scatter(right, entropy)
    return logp, entropy


def can_share_prompts(model: Any) -> bool:
    """False where transformers would drop the prompt's cache: gradient checkpointing in
    training mode."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return not (getattr(causal_lm, "is_gradient_checkpointing", False) and causal_lm.training)


def shared_prompt_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float,
    with_entropy: bool = True,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`completion_logprobs` of the rows prompts[i] + completions[i], each distinct prompt
    run once: the same (batch, T) outputs, completions right-aligned (0 where a row has no
    token). The caller checks `can_share_prompts`.
    """
    device = next(model.parameters()).device
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    distinct, owners = prompt_owners(prompts)
    owner = torch.tensor(owners, device=device)
    prompt_ids, prompt_mask = pad_rows(distinct, pad_id, "left")  # (u, P)
    prefix = causal_lm.model(
        input_ids=prompt_ids.to(device),
        attention_mask=prompt_mask.to(device),
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0).to(device),
        use_cache=True,
    )
    # The last prompt position predicts each row's first completion token.
    hidden = prefix.last_hidden_state[:, -1][owner].unsqueeze(1)  # (batch, 1, h)
    # Every completion token but the last predicts the next: run them on the prompt's cache,
    # copied to each row of that prompt (index_select: the backward sums the rows' gradients).
    inputs, input_mask = pad_rows([c[:-1] for c in completions], pad_id, "right")  # (batch, T - 1)
    if inputs.shape[1]:
        cache = prefix.past_key_values
        if cache is None:
            raise ValueError("the model kept no cache of the prompts (gradient checkpointing in training mode): "
                             "use completion_logprobs where can_share_prompts(model) is False")
        cache.reorder_cache(owner)
        prompt_lengths = prompt_mask.sum(-1).to(device)[owner]
        rest = causal_lm.model(
            input_ids=inputs.to(device),
            attention_mask=torch.cat([prompt_mask.to(device)[owner], input_mask.to(device)], dim=1),
            position_ids=prompt_lengths.unsqueeze(1) + torch.arange(inputs.shape[1], device=device),
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        hidden = torch.cat([hidden, rest], dim=1)  # (batch, T, h): position j predicts token j
    targets, left_mask = pad_rows(completions, pad_id, "right")
    valid = left_mask.bool().to(device)
    logp, entropy = head_logprobs(causal_lm, hidden[valid], targets.to(device)[valid], temperature, with_entropy, chunk_tokens)
    return right_aligned(completions, logp, entropy, device)
