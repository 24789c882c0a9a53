"""The PPO side of GRPO, kept pure: the clipped policy loss, the KL term, the policy ratio's
diagnostics and loss aggregation (the group advantages: gridrun/train/advantages.py; the
order mini-batches are cut in: minibatches.py; the LR schedule: lr_schedule.py).

How this departs from the original GRPO (Shao et al. 2024), on purpose and as the paper ran
(conf/preset/ picks between its released code and its text; every switch is a parameter here):
- No KL penalty by default; an optional per-role KL to the base model (k3 estimator) is
  added to the loss, not folded into the reward. verl clamps its log-ratio to +-20 and the
  estimate to [-10, 10] (`log_ratio_clamp`, `kl_clamp`).
- Asymmetric clipping (clip-higher): ratio clipped to [1 - clip_low, 1 + clip_high], plus
  verl's dual-clip (`clip_ratio_c`): a negative-advantage token's loss is capped at
  -clip_ratio_c * A, and the log-ratio is clamped to +-20 before the exp.
- Loss aggregation "seq-mean-token-mean" (mean over sequences of each sequence's token
  mean) or "token-mean" (mean over every token of the mini-batch).
- Outcome reward: one scalar per episode, given to every row of the episode (a row is an
  episode or one role turn, per preset). Groups whose rewards are all equal get advantage 0
  and are counted; a group of size 1 its raw reward (verl) or 0 (gridrun/train/advantages.py).
Not here: entropy bonus, process rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss and whether the (upper/lower) clipped branch was taken.

    logp, old_logp, advantages: (batch, tokens) (a row's advantage broadcast over its tokens).
    clip_ratio_c: dual-clip bound (> 1); where A < 0 the loss is min(loss, -clip_ratio_c * A).
    log_ratio_clamp: clamp logp - old_logp to +-this before the exp (verl: 20).
    Returns (loss (batch, tokens), clipped (batch, tokens) bool); `clipped` counts the PPO
    clip only, not the dual-clip cap.
    """
    log_ratio = logp - old_logp
    if log_ratio_clamp is not None:
        log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        capped = torch.minimum(loss, -advantages * clip_ratio_c)
        loss = torch.where(advantages < 0, capped, loss)
    return loss, clipped > unclipped


def k3_kl(
    logp: torch.Tensor, ref_logp: torch.Tensor, log_ratio_clamp: float | None = None, kl_clamp: float | None = None
) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate exp(ref - logp) - (ref - logp) - 1, >= 0. (batch, tokens).

    verl clamps ref - logp to +-20 and the estimate to [-10, 10] (log_ratio_clamp, kl_clamp)."""
    delta = ref_logp - logp
    if log_ratio_clamp is not None:
        delta = torch.clamp(delta, -log_ratio_clamp, log_ratio_clamp)
    kl = torch.exp(delta) - delta - 1.0
    if kl_clamp is not None:
        kl = torch.clamp(kl, -kl_clamp, kl_clamp)
    return kl


@dataclass(frozen=True)
class RatioSums:
    """One micro-batch's sums behind the rollout-ratio diagnostics (verl's rollout_corr
    metrics): its completion tokens and rows, the sums over tokens of rho^2 and (rho - 1)^2,
    and the sum over rows of exp(-mean log-prob), rho = pi_theta / pi_rollout per token."""

    tokens: int
    rows: int
    rho2: float
    centred: float
    ppl: float


def ratio_sums(logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, log_bound: float = 20.0) -> RatioSums:
    """RatioSums of one micro-batch. logp, rollout_logp, mask: (batch, tokens); rho =
    exp(clamp(logp - rollout_logp, +-log_bound)), verl's safety bound on the log-ratio."""
    mask = mask.float()
    rho = torch.exp(torch.clamp(logp - rollout_logp, -log_bound, log_bound))
    lengths = mask.sum(dim=1).clamp(min=1.0)
    return RatioSums(
        tokens=int(mask.sum()),
        rows=int(mask.shape[0]),
        rho2=float((rho**2 * mask).sum()),
        centred=float(((rho - 1.0) ** 2 * mask).sum()),
        ppl=float(torch.exp(-(logp * mask).sum(dim=1) / lengths).sum()),
    )


def ratio_diagnostics(parts: Sequence[RatioSums], reduction: str) -> dict[str, float]:
    """chi2 = E[rho^2] - 1, chi2_centered = E[(rho - 1)^2] and ppl = E over sequences of
    exp(-mean log-prob), over a step's micro-batches.

    micro_batch (verl): each micro-batch's own masked means (tokens for chi2, rows for ppl),
    then their plain mean over micro-batches, so a short micro-batch weighs as much as a
    long one. pooled: every token (every row for ppl) of the step weighs the same."""
    if reduction == "pooled" or not parts:
        tokens, rows = max(sum(p.tokens for p in parts), 1), max(sum(p.rows for p in parts), 1)
        return {
            "chi2": sum(p.rho2 for p in parts) / tokens - 1.0,
            "chi2_centered": sum(p.centred for p in parts) / tokens,
            "ppl": sum(p.ppl for p in parts) / rows,
        }
    if reduction != "micro_batch":
        raise ValueError(f"unknown chi2 reduction '{reduction}': use micro_batch or pooled")
    n = len(parts)
    return {
        "chi2": sum(p.rho2 / max(p.tokens, 1) - 1.0 for p in parts) / n,
        "chi2_centered": sum(p.centred / max(p.tokens, 1) for p in parts) / n,
        "ppl": sum(p.ppl / max(p.rows, 1) for p in parts) / n,
    }


def token_weights(mask: torch.Tensor, mode: str, n_tokens: int, n_seqs: int) -> torch.Tensor:
    """Weight of each token in the mini-batch loss, so that sum(weights * loss) aggregates it.

    mask: (batch, tokens) 0/1 for a micro-batch; n_tokens / n_seqs: totals over the whole
    mini-batch, so micro-batches accumulate to exactly the mini-batch's aggregate.
    token-mean: 1 / n_tokens each. seq-mean-token-mean: 1 / (n_seqs * len(seq)).
    """
    mask = mask.float()
    if mode == "token-mean":
        return mask / n_tokens
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return mask / (lengths * n_seqs)
    raise ValueError(f"unknown loss aggregation '{mode}': use seq-mean-token-mean or token-mean")
