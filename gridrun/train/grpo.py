"""GRPO maths, kept pure: the clipped policy loss, the KL term, loss aggregation, the order
mini-batches are cut in, and the LR schedule (the group advantages: gridrun/train/advantages.py).

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

import heapq
import math
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


def partial_scale(rows: int, minibatch_size: int) -> float:
    """verl's weight of a mini-batch of `rows` rows: rows / mini-batch size (1 when full).

    verl scales each micro-batch's aggregated loss by its rows / the nominal mini-batch size,
    so a short last mini-batch (40 of 64 rows) counts 0.625x a full one."""
    return min(rows, minibatch_size) / minibatch_size


def workload(length: int) -> int:
    """verl's cost of one sequence of `length` tokens (prompt + response), used to balance:
    proportional to a dense transformer block's FLOPs, 6 * 4096 * L + L^2."""
    return 24576 * length + length * length


def _largest_differencing(costs: list[int], parts: int) -> list[list[int]]:
    """Karmarkar-Karp partition of item indices into `parts` sets of near-equal total cost
    (equal item counts when len(costs) is a multiple of parts). Each set's indices sorted."""
    ranked = sorted((cost, i) for i, cost in enumerate(costs))
    equal = len(costs) % parts == 0

    def state(items: list[tuple[int, int]]) -> list[tuple[int, list[tuple[int, int]]]]:
        sets = [(cost, [(i, cost)]) for cost, i in items] + [(0, []) for _ in range(parts - len(items))]
        return sorted(sets, key=_set_key, reverse=True)

    seeds = (
        [ranked[k : k + parts] for k in range(0, len(ranked), parts)] if equal else [[item] for item in ranked]
    )
    heap = [_State(state(items)) for items in seeds]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        # The heaviest set of one state takes the lightest of the other, and so on.
        merged = [
            (a[0] + b[0], a[1] + b[1]) for a, b in zip(first.sets, reversed(second.sets))
        ]
        heapq.heappush(heap, _State(sorted(merged, key=_set_key, reverse=True)))
    return [sorted(i for i, _ in items) for _, items in heap[0].sets]


def _set_key(entry: tuple[int, list[tuple[int, int]]]) -> tuple:
    total, items = entry
    return (total, len(items), items)


class _State:
    """A partial partition; the heap pops the one with the largest spread first."""

    def __init__(self, sets: list[tuple[int, list[tuple[int, int]]]]) -> None:
        self.sets = sets
        self.spread = sets[0][0] - sets[-1][0]

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return _set_key(self.sets[0]) > _set_key(other.sets[0])


def balanced_order(lengths: Sequence[int], world: int, minibatch_size: int) -> list[int]:
    """verl's `balance_batch` order of a step's rows, laid out so that consecutive slices of
    `minibatch_size` are the mini-batches verl's ranks train together.

    lengths: (rows,) prompt + response tokens. The rows are split into `world` partitions of
    near-equal workload (one per data-parallel rank); each partition is sorted by workload
    and laid out short-long-short (even positions ascending, then odd ones descending);
    rank r's k-th mini-batch is the k-th consecutive slice of partition r, so global
    mini-batch k = the k-th slice of every partition. Returns a permutation of range(rows).
    """
    costs = [workload(length) for length in lengths]
    if not costs:
        return []
    parts = [list(range(len(costs)))] if world <= 1 or len(costs) < world else _largest_differencing(costs, world)
    laid_out = []
    for part in parts:
        part = sorted(part, key=lambda i: (costs[i], i))
        laid_out.append(part[::2] + part[1::2][::-1])
    if len(laid_out) == 1:
        return laid_out[0]
    per_rank = max(1, minibatch_size // len(laid_out))
    longest = max(len(part) for part in laid_out)
    return [i for start in range(0, longest, per_rank) for part in laid_out for i in part[start : start + per_rank]]


def lr_at(advances: int, base_lr: float, warmup: int, total: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Learning rate of an update made after `advances` advances of the schedule, as verl's
    LambdaLR schedules give it: a linear warmup from 0 over `warmup` advances (the first
    update runs at LR 0), then constant, or cosine to min_ratio reached at `total` advances
    and held there.

    The trainer passes the training steps before this one (per_step: one value per step,
    identical under SP and IP) or the adapter updates before this one (per_update; see
    schedule_advances)."""
    if advances < warmup:
        return base_lr * advances / warmup
    if schedule == "constant":
        return base_lr
    progress = (advances - warmup) / max(1, total - warmup)
    return base_lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def schedule_advances(step: int, update_index: int, updates_per_step: int, advance: str) -> int:
    """How often the LR schedule has advanced before the `update_index`-th (0-based) adapter
    update of training step `step` (1-based). per_step: step - 1 for every adapter. per_update:
    every earlier adapter update, as verl steps its scheduler after each update_actor call and
    the released trainer calls it once per agent: under IP with k adapters, adapter i of step
    t runs after k * (t - 1) + i advances."""
    if advance == "per_step":
        return step - 1
    if advance == "per_update":
        return (step - 1) * updates_per_step + update_index
    raise ValueError(f"unknown optim.lr_advance '{advance}': use per_step or per_update")
