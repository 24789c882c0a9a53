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
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

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
    flat_targets = targets.to(device).reshape(-1)
    head = causal_lm.get_output_embeddings()
    temperature = max(temperature, 1e-6)
    if hidden.shape[0] <= chunk_tokens:
        logp, entropy = _chunk(head, hidden, flat_targets, temperature, with_entropy)
    else:
        parts = [
            checkpoint(_chunk, head, hidden[i : i + chunk_tokens], flat_targets[i : i + chunk_tokens], temperature,
                       with_entropy, use_reentrant=False)
            if torch.is_grad_enabled()
            else _chunk(head, hidden[i : i + chunk_tokens], flat_targets[i : i + chunk_tokens], temperature, with_entropy)
            for i in range(0, hidden.shape[0], chunk_tokens)
        ]
        logp = torch.cat([p[0] for p in parts])
        entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
    return logp.view(-1, t_max), None if entropy is None else entropy.view(-1, t_max)
