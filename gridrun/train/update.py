"""The policy update of one training step: per adapter, ordered mini-batches, one optimizer
step each, with per-role diagnostics under Shared- and Isolated-Policy alike.

Semantics (the paper's stack, reproduced rather than smoothed; `preset=` picks the reading):
- An adapter's sequences (one per role turn routed to it) are ordered and cut into
  mini-batches of `ppo_mini_batch * n` sequences; each mini-batch is one optimizer step.
  Order: `balanced` (released: verl's balance_batch over the step's whole batch, then each
  adapter's sequences in that order, consecutive cuts, no shuffle) or `shuffled`
  (as_written). A role with more sequences (3 voters) takes more steps per training step:
  `gradient_amplification` under IP. Under SP every role feeds the one adapter, and the
  role with the most tokens dominates its gradient: `sp_role_capture`; the order decides
  which roles share an optimizer step.
- A short last mini-batch is scaled by rows / mini-batch size (released, as verl) or
  weighed fully (as_written).
- Micro-batches are bounded by a token budget, hold one role each, and accumulate with
  weights that make the sum exactly the mini-batch's aggregated loss. The per-token policy
  loss is the registered one `UpdateSettings.policy_loss` names (gridrun/train/losses.py;
  "vanilla", the paper's, by default); the KL term, the weights and the diagnostics are here.
- Because micro-batches are role-pure and ordered by role, the gradient each role adds to
  a mini-batch is read off at role boundaries: that is the per-role gradient norm and
  gradient-mass share, measured, not estimated from token counts.
- Per-role update strength (docs/fidelity.md, "Per-role update strength"): a role's loss weight
  multiplies its tokens' loss weights; `adapter_steps` cuts an adapter's sequences into a
  set number of mini-batches (each weighed as a full one); the LR scale is in `lrs`.
- A mini-batch whose loss or gradient norm is not finite is skipped for its adapter: no
  optimizer step, counted in `train/skipped_nonfinite`.
- Float32 LoRA layers run fused for the whole update (gridrun/train/cpu/lora_kernels.py: one
  product with W + s BA, a closed-form backward; peft's gradients to float rounding).
- PPO's old log-probs are recomputed before the update (grpo.old_logprobs=recompute)
  except for each adapter's first mini-batch, whose weights have not moved since the
  rollout: there the update's own forward, detached, is the old policy (verl's on-policy
  case; the same maths, one forward fewer).
- Data parallel (gridrun/train/distributed.py): the same global mini-batches are cut on
  every rank; each rank computes the old log-probs of, and backpropagates, its stride of
  each with the global counts as loss weights, and gradients (and each role's gradient, for its norm) are summed across ranks
  before the optimizer step. On one rank every collective is the identity.
Diagnostics per role and over all roles (`train/...`): chi2 = E[rho^2] - 1 of the token
ratio rho = pi_theta / pi_rollout (as verl's rollout_corr/chi2_token), chi2_centered =
mean (rho - 1)^2, ppl = mean over sequences of exp(-mean log-prob) (ppo.ratio_diagnostics:
each per micro-batch, then averaged over every rank's micro-batches as verl, so that with
several ranks they depend on the rank count as verl's do, or pooled over the step, as
grpo.chi2_reduction says), entropy of the
pre-update policy (measured in the old-log-prob pass, or in the forward of an adapter's
first mini-batch; with grpo.old_logprobs=rollout there is no pass, and the update's own
forward measures it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from gridrun.seam import routing
from gridrun.seam.metric_keys import adapter_prefix, role_key, role_prefix
from gridrun.seam.registry import ConfigError
from gridrun.seam.routing import Routing
from gridrun.seam.runconfig import GRPOSpec, RunConfig
from gridrun.train import cpu, logprobs, minibatches, ppo
from gridrun.train.coherence import Coherence
from gridrun.train.cpu.lora_kernels import fused_lora
from gridrun.train.cpu.packed import packed_cuts, packed_logprobs
from gridrun.train.distributed import Dist
from gridrun.train.losses import DEFAULT_POLICY_LOSS, policy_loss
from gridrun.train.padding import pad_rows
from gridrun.train.policy import activate, adapter_parameters

log = logging.getLogger("gridrun")
# verl's safety bound on log(pi_theta / pi_rollout) when it computes chi2.
_RHO_LOG_BOUND = 20.0

@dataclass(frozen=True)
class UpdateSettings:
    """All the update reads of a run's config (one level deep, not the whole config threaded down)."""

    grpo: GRPOSpec
    # Sequences per mini-batch: train.ppo_mini_batch problems x grpo.n samples.
    minibatch_size: int
    # Tokens the model computes per micro-batch: packed, the real ones (each distinct prompt
    # once); padded, rows x width.
    micro_token_budget: int
    # The rollout's sampling temperature: log-probs are of softmax(logits / temperature).
    temperature: float
    grad_clip: float
    pad_id: int
    # Per-role loss weights (roles not listed: 1) and, per adapter, the optimizer steps its
    # sequences make per training step where the config sets them (RunConfig.role_weights,
    # adapter_steps, which keys a role's steps by its adapter).
    role_weight: dict[str, float] = field(default_factory=dict)
    adapter_steps: dict[str, int] = field(default_factory=dict)
    # The registered policy loss (gridrun/train/losses.py) every micro-batch is trained with.
    policy_loss: str = DEFAULT_POLICY_LOSS

    def __post_init__(self) -> None:
        policy_loss(self.policy_loss)  # an unknown name fails here, before any forward

    @classmethod
    def of(cls, config: RunConfig, pad_id: int) -> UpdateSettings:
        return cls(
            grpo=config.grpo,
            minibatch_size=config.train.ppo_mini_batch * config.grpo.n,
            micro_token_budget=config.train.micro_token_budget,
            temperature=config.sampling.temperature,
            grad_clip=config.optim.grad_clip,
            pad_id=pad_id,
            role_weight=routing.role_weights(config),
            adapter_steps=routing.adapter_steps(config),
            policy_loss=config.grpo.policy_loss,
        )


@dataclass
class TrainSeq:
    role: str
    adapter: str
    prompt_ids: list[int]
    completion_ids: list[int]
    rollout_logp: list[float]
    advantage: float
    truncated: bool
    old_logp: list[float] | None = None
    ref_logp: list[float] | None = None
    # Sum of the pre-update policy's per-token entropies (filled with old_logp).
    old_entropy: float | None = None


@dataclass
class _RoleStats:
    seqs: int = 0
    tokens: int = 0
    truncated: int = 0
    entropy_sum: float = 0.0
    clipped: int = 0
    loss_sum: float = 0.0
    kl_sum: float = 0.0
    absdiff_sum: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    # One entry per micro-batch: the sums behind chi2, chi2_centered and ppl.
    ratios: list[ppo.RatioSums] = field(default_factory=list)
    # I6's factor of each of the role's mini-batch gradients.
    coherence_scales: list[float] = field(default_factory=list)


@dataclass
class _Micro:
    seqs: list[TrainSeq]
    pad_id: int
    targets: torch.Tensor  # (batch, T) completion tokens, right-aligned
    mask: torch.Tensor  # (batch, T) 1 on completion tokens


def _pack(seqs: list[TrainSeq], pad_id: int) -> _Micro:
    """Completions right-aligned; T = longest completion."""
    targets, mask = pad_rows([s.completion_ids for s in seqs], pad_id, "left")
    return _Micro(seqs, pad_id, targets, mask.float())


def _aligned(values: list[list[float]], t_max: int) -> torch.Tensor:
    """Right-align per-sequence float lists into (batch, t_max)."""
    return pad_rows(values, 0.0, "left", width=t_max, dtype=torch.float32)[0]


def completion_logprobs(
    model: Any, micro: _Micro, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (batch, T) of a micro-batch's completion tokens under softmax(logits / T),
    and optionally the per-token entropy (batch, T) (gridrun/train/logprobs.py): packed
    without padding where the model's attention takes it, padded otherwise. Rows that
    repeat a prompt (a problem's n samples) share its forward, except padded under gradient
    checkpointing; every pass of a run takes the same path, whether or not its rows repeat one."""
    prompts = [s.prompt_ids for s in micro.seqs]
    completions = [s.completion_ids for s in micro.seqs]
    if cpu.applies(model):
        return packed_logprobs(model, prompts, completions, temperature, with_entropy)
    if logprobs.can_share_prompts(model):
        return logprobs.shared_prompt_logprobs(model, prompts, completions, micro.pad_id, temperature, with_entropy)
    # Left-padded so every completion ends at the right edge, as the targets.
    input_ids, attention = pad_rows([p + c for p, c in zip(prompts, completions)], micro.pad_id, "left")
    return logprobs.completion_logprobs(model, input_ids, attention, micro.targets, temperature, with_entropy)


def micro_batches(seqs: list[TrainSeq], token_budget: int, packed: bool = False) -> Iterator[list[TrainSeq]]:
    """Role-pure micro-batches in role order (the per-role gradient is read off at role
    boundaries) whose computed tokens fit the token budget. Padded: rows x width, rows by
    length. Packed (gridrun/train/cpu/packed.py): the real tokens, each distinct prompt once,
    rows by prompt so that a prompt's samples share a micro-batch. A row over the budget
    alone is a micro-batch of its own."""
    by_role: dict[str, list[TrainSeq]] = defaultdict(list)
    for s in seqs:
        by_role[s.role].append(s)
    for role in sorted(by_role):
        if packed:
            yield from packed_cuts(by_role[role], token_budget)
            continue
        ordered = sorted(by_role[role], key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
        chunk: list[TrainSeq] = []
        for s in ordered:
            width = len(s.prompt_ids) + len(s.completion_ids)
            if chunk and (len(chunk) + 1) * width > token_budget:
                yield chunk
                chunk = []
            chunk.append(s)
        if chunk:
            yield chunk


@torch.no_grad()
def fill_reference_logprobs(
    model: Any, batches: list[list[TrainSeq]], ref_seqs: list[TrainSeq], settings: UpdateSettings
) -> None:
    """Old log-probs and entropies of the rows of `batches` (each one adapter's rows of one
    mini-batch, before the update) and the base model's log-probs of `ref_seqs` (the roles
    with a KL term). Each mini-batch is cut into the micro-batches the update will cut it
    into, so a row's old log-probs come from the same computation as the update's first
    forward of it: on unchanged weights, equal to the bit (float rounding depends on which
    rows share a micro-batch)."""
    temperature, budget, pad_id = settings.temperature, settings.micro_token_budget, settings.pad_id
    active = None
    for batch in batches:
        if settings.grpo.old_logprobs != "recompute":
            for s in batch:
                s.old_logp = s.rollout_logp
            continue
        for chunk in micro_batches(batch, budget, cpu.applies(model)):
            if chunk[0].adapter != active:
                active = chunk[0].adapter
                activate(model, active)
            micro = _pack(chunk, pad_id)
            logp, entropy = completion_logprobs(model, micro, temperature, with_entropy=True)
            assert entropy is not None
            for row, s in enumerate(chunk):
                s.old_logp = logp[row, logp.shape[1] - len(s.completion_ids) :].tolist()
                s.old_entropy = float((entropy[row] * micro.mask[row].to(entropy.device)).sum())
    if ref_seqs:
        with model.disable_adapter():
            for chunk in micro_batches(ref_seqs, budget, cpu.applies(model)):
                logp, _ = completion_logprobs(model, _pack(chunk, pad_id), temperature)
                for row, s in enumerate(chunk):
                    s.ref_logp = logp[row, logp.shape[1] - len(s.completion_ids) :].tolist()


def _grads(params: dict[str, torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params.values()]


def _norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.float().pow(2).sum()) for t in tensors))


def update(
    model: Any,
    routing: Routing,
    optimizers: dict[str, torch.optim.Optimizer],
    seqs: list[TrainSeq],
    settings: UpdateSettings,
    lrs: dict[str, float],
    rng: random.Random,
    dist: Dist | None = None,
    coherence: Coherence | None = None,
) -> dict[str, float]:
    """One training step's update of every trainable adapter; returns flat metrics.

    An adapter whose every role has loss weight 0 is not stepped (AdamW's decay and momentum
    would move it). `coherence`: I6's per-role gradient scaling (gridrun/train/coherence.py).

    lrs: each trainable adapter's learning rate for this step. `seqs` are this rank's (all
    of them in one process); with several ranks they are gathered first, every rank cuts
    the same mini-batches, computes the old (and reference) log-probs of the strides it
    trains, and every rank returns the same metrics."""
    dist = dist or Dist()
    seqs, _ = dist.gather([s for s in seqs if s.completion_ids])
    weight = settings.role_weight
    adapters = tuple(a for a in routing.trainable if any(weight.get(r, 1.0) for r in routing.roles_of(a)))
    plan = minibatch_plan(
        seqs, adapters, settings.grpo, settings.minibatch_size, dist.world, rng, settings.adapter_steps
    )
    stats: dict[str, _RoleStats] = defaultdict(_RoleStats)
    metrics: dict[str, float] = {}
    skipped_total = 0
    with fused_lora(model) if cpu.applies(model) else contextlib.nullcontext():
        _fill_old_logprobs(model, plan, settings, dist)
        for adapter, cuts in plan.items():
            done = _optimizer_steps(model, adapter, cuts, optimizers[adapter], lrs[adapter], settings, stats, dist,
                                    coherence)
            skipped_total += done.skipped
            metrics.update(_adapter_metrics(adapter, done, lrs[adapter], routing.roles_of(adapter)))
    metrics["train/skipped_nonfinite"] = skipped_total
    if dist.world > 1:
        _sum_stats(stats, sorted({s.role for s in seqs}), dist)
        if log.isEnabledFor(logging.DEBUG):
            weights = [p for name in routing.trainable for p in adapter_parameters(model, name).values()]
            log.debug("rank %d/%d: adapters after the update %s", dist.rank, dist.world, dist.digest(weights))
    metrics.update(_role_metrics(stats, settings.grpo, coherence is not None))
    return metrics


def _kl_roles(spec: GRPOSpec) -> set[str]:
    """The roles whose loss has a KL-to-base term (they need the base model's log-probs)."""
    return {role for role, beta in spec.kl_beta.items() if beta > 0}


def _fill_old_logprobs(
    model: Any, plan: dict[str, list[list[TrainSeq]]], settings: UpdateSettings, dist: Dist
) -> None:
    """The old (and reference) log-probs of the rows this rank trains, before any weight moves.

    An adapter's first mini-batch is trained on the weights that rolled it out, so its old
    log-probs are the update's own forward, detached (verl's on-policy case): no separate
    pass. Not with several epochs (the next epoch needs them again) nor with rollout ones."""
    gcfg = settings.grpo
    trained = {id(s): s for cuts in plan.values() for batch in cuts for s in dist.stride(batch)}
    on_policy = (
        {id(s) for cuts in plan.values() for first in cuts[:1] for s in first}
        if gcfg.ppo_epochs == 1 and gcfg.old_logprobs == "recompute"
        else set()
    )
    for key in on_policy.intersection(trained):
        trained[key].old_logp = trained[key].old_entropy = None
    # Every row is in one mini-batch of the first epoch (later epochs repeat the rows).
    first_epoch = [dist.stride(batch) for cuts in plan.values() for batch in cuts[: len(cuts) // gcfg.ppo_epochs]]
    kl_roles = _kl_roles(gcfg)
    fill_reference_logprobs(
        model,
        [rows for batch in first_epoch if (rows := [s for s in batch if id(s) not in on_policy])],
        [s for s in trained.values() if s.role in kl_roles],
        settings,
    )


@dataclass
class _AdapterSteps:
    """What one adapter's optimizer loop did in a training step."""

    steps: int = 0
    skipped: int = 0
    # The global gradient norm (before clipping) of each step taken.
    grad_norms: list[float] = field(default_factory=list)


def _optimizer_steps(
    model: Any,
    adapter: str,
    cuts: list[list[TrainSeq]],
    optimizer: torch.optim.Optimizer,
    lr: float,
    settings: UpdateSettings,
    stats: dict[str, _RoleStats],
    dist: Dist,
    coherence: Coherence | None,
) -> _AdapterSteps:
    """One optimizer step of `adapter` per mini-batch of `cuts`, at `lr`: accumulate the
    mini-batch's gradient (summed over ranks), clip it, step. A mini-batch whose loss or
    gradient norm is not finite is skipped: one non-finite step would turn every AdamW moment
    into NaN. Its per-role gradient norms are dropped from `stats` with it."""
    activate(model, adapter)
    params = adapter_parameters(model, adapter)
    for group in optimizer.param_groups:
        group["lr"] = lr
    done = _AdapterSteps()
    for batch in cuts:
        scaled = settings.grpo.partial_minibatch == "scaled" and adapter not in settings.adapter_steps
        scale = minibatches.partial_scale(len(batch), settings.minibatch_size) if scaled else 1.0
        measured = {role: len(stats[role].grad_norms) for role in {s.role for s in batch}}
        loss = _minibatch(model, batch, params, settings, stats, dist, scale, coherence)
        if dist.world > 1:
            local = _norm([p.grad for p in params.values() if p.grad is not None])
            log.info("rank %d/%d adapter %s: local grad norm %.6g", dist.rank, dist.world, adapter, local)
        dist.all_reduce_grads(params.values())
        norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), settings.grad_clip))
        (loss,) = dist.all_reduce_sum([loss])
        if not (math.isfinite(norm) and math.isfinite(loss)):
            log.warning("adapter %s: non-finite loss %s / grad norm %s, optimizer step skipped",
                        adapter, loss, norm)
            optimizer.zero_grad(set_to_none=True)
            for role, count in measured.items():
                del stats[role].grad_norms[count:]
            done.skipped += 1
            continue
        done.grad_norms.append(norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done.steps += 1
    return done


def _adapter_metrics(adapter: str, done: _AdapterSteps, lr: float, roles: Iterable[str]) -> dict[str, float]:
    """`adapter/<name>/...` of one adapter's loop, and its optimizer steps under each role it serves."""
    prefix = adapter_prefix(adapter)
    metrics: dict[str, float] = {
        prefix + "opt_steps": done.steps,
        prefix + "skipped_nonfinite": done.skipped,
        prefix + "grad_norm": sum(done.grad_norms) / len(done.grad_norms) if done.grad_norms else 0.0,
        prefix + "lr": lr,
    }
    for role in roles:
        metrics[role_key(role, "opt_steps")] = done.steps
    return metrics


def _role_metrics(stats: dict[str, _RoleStats], gcfg: GRPOSpec, with_coherence: bool) -> dict[str, float]:
    """`role/<name>/...` of every role the step trained (counts summed over ranks already),
    then the divergences over all roles under `train/`."""
    kl_roles = _kl_roles(gcfg)
    total_tokens = sum(s.tokens for s in stats.values()) or 1
    total_mass = sum(sum(s.grad_norms) for s in stats.values()) or 1.0
    metrics: dict[str, float] = {}
    for role, s in stats.items():
        n = max(s.tokens, 1)
        prefix = role_prefix(role)
        metrics.update(
            {
                prefix + "seqs": s.seqs,
                prefix + "tokens": s.tokens,
                prefix + "token_share": s.tokens / total_tokens,
                prefix + "grad_share": sum(s.grad_norms) / total_mass,
                prefix + "grad_norm": sum(s.grad_norms) / len(s.grad_norms) if s.grad_norms else 0.0,
                prefix + "loss": s.loss_sum / n,
                **_divergences(prefix, s, gcfg.chi2_reduction),
                prefix + "clip_frac": s.clipped / n,
                prefix + "len_mean": s.tokens / max(s.seqs, 1),
                prefix + "trunc_rate": s.truncated / max(s.seqs, 1),
                prefix + "rollout_logp_absdiff": s.absdiff_sum / n,
            }
        )
        if with_coherence and s.coherence_scales:
            metrics[prefix + "coherence_scale"] = sum(s.coherence_scales) / len(s.coherence_scales)
        if role in kl_roles:
            metrics[prefix + "kl"] = s.kl_sum / n
    if stats:
        everything = _RoleStats()
        # In role order: a rank meets the roles in the order of its own stride, and a float
        # sum in another order would make the ranks' metrics differ in their last bits.
        ordered = [stats[role] for role in sorted(stats)]
        for name in ("seqs", "tokens", "entropy_sum"):
            setattr(everything, name, sum(getattr(s, name) for s in ordered))
        everything.ratios = [part for s in ordered for part in s.ratios]
        metrics.update(_divergences("train/", everything, gcfg.chi2_reduction))
    return metrics


def _divergences(prefix: str, s: _RoleStats, reduction: str) -> dict[str, float]:
    """chi2 (E[rho^2] - 1), chi2_centered (mean (rho - 1)^2) and per-sequence ppl, reduced
    over micro-batches as `reduction` says; the entropy per token."""
    out = {prefix + name: value for name, value in ppo.ratio_diagnostics(s.ratios, reduction).items()}
    out[prefix + "entropy"] = s.entropy_sum / max(s.tokens, 1)
    return out


def minibatch_plan(
    seqs: list[TrainSeq], adapters: tuple[str, ...], spec: GRPOSpec, size: int, world: int, rng: random.Random,
    steps: dict[str, int] | None = None,
) -> dict[str, list[list[TrainSeq]]]:
    """Each adapter's mini-batches of the step, every epoch's in turn, cut before anything
    is computed. balanced: verl balances the step's whole batch once (on `world` ranks) and
    each adapter trains its own sequences in that order, cut consecutively; shuffled: each
    adapter's sequences are shuffled every epoch (by `rng`). `steps` (adapter -> count):
    that adapter's sequences are cut into that many near-equal consecutive mini-batches
    instead of by `size`."""
    if spec.minibatch_order == "balanced":
        order = minibatches.balanced_order([len(s.prompt_ids) + len(s.completion_ids) for s in seqs], world, size)
        seqs = [seqs[i] for i in order]
    plan: dict[str, list[list[TrainSeq]]] = {}
    for adapter in adapters:
        mine = [s for s in seqs if s.adapter == adapter]
        cuts: list[list[TrainSeq]] = []
        for _ in range(spec.ppo_epochs):
            if spec.minibatch_order == "shuffled":
                rng.shuffle(mine)
            if adapter in (steps or {}):
                cuts += [part for part in _equal_cuts(mine, (steps or {})[adapter]) if part]
            else:
                cuts += [mine[first : first + size] for first in range(0, len(mine), size)]
        plan[adapter] = cuts
    return plan


def _equal_cuts(seqs: list[TrainSeq], parts: int) -> list[list[TrainSeq]]:
    """`seqs` cut into `parts` consecutive pieces whose sizes differ by at most one."""
    bounds = [round(i * len(seqs) / parts) for i in range(parts + 1)]
    return [seqs[a:b] for a, b in itertools.pairwise(bounds)]


def _sum_stats(stats: dict[str, _RoleStats], roles: list[str], dist: Dist) -> None:
    """Sum each role's counters across ranks and gather its micro-batches' ratio sums, in
    place (grad norms are global already; I6's scales are the same on every rank)."""
    names = [f.name for f in dataclasses.fields(_RoleStats) if f.name not in ("grad_norms", "ratios", "coherence_scales")]
    for role in roles:
        stats[role].ratios = dist.gather(stats[role].ratios)[0]
    summed = dist.all_reduce_sum([float(getattr(stats[role], name)) for role in roles for name in names])
    for i, role in enumerate(roles):
        for j, name in enumerate(names):
            value = summed[i * len(names) + j]
            setattr(stats[role], name, type(getattr(stats[role], name))(value))


def _minibatch(
    model: Any,
    batch: list[TrainSeq],
    params: dict[str, torch.nn.Parameter],
    settings: UpdateSettings,
    stats: dict[str, _RoleStats],
    dist: Dist,
    scale: float,
    coherence: Coherence | None = None,
) -> float:
    """Accumulate this rank's part of one (global) mini-batch's gradient into .grad, each
    token's weight times `scale` and its role's weight; returns this rank's part of the
    (scaled) loss. With `coherence`, each role's part is scaled by its I6 factor."""
    # Loss weights use the whole mini-batch's counts, so the ranks' parts sum to its loss.
    n_tokens = sum(len(s.completion_ids) for s in batch)
    n_seqs = len(batch)
    mine = dist.stride(batch)
    device = next(model.parameters()).device
    role_start: list[torch.Tensor] | None = None
    current_role: str | None = None
    loss = 0.0

    def close_role() -> None:
        # Gradient added by the role just finished = grad now - grad at its start (summed
        # over ranks: every rank closes every role of the mini-batch, in the same order).
        if current_role is None or role_start is None:
            return
        now = _grads(params)
        delta = dist.all_reduce_tensors([a - b for a, b in zip(now, role_start)])
        stats[current_role].grad_norms.append(_norm(delta))
        if coherence is not None:
            factor = coherence.scale(current_role, delta)
            stats[current_role].coherence_scales.append(factor)
            # This rank's part of the role's gradient, scaled (the factor is the global one).
            for p, start, grad in zip(params.values(), role_start, now):
                p.grad = start + factor * (grad - start)

    for role in sorted({s.role for s in batch}):
        close_role()
        current_role, role_start = role, _grads(params)
        rows = [s for s in mine if s.role == role]
        for chunk in micro_batches(rows, settings.micro_token_budget, cpu.applies(model)):
            loss += _accumulate(model, chunk, settings, stats, device, n_tokens, n_seqs, scale)
    close_role()
    return loss


def _accumulate(
    model: Any,
    chunk: list[TrainSeq],
    settings: UpdateSettings,
    stats: dict[str, _RoleStats],
    device: torch.device,
    n_tokens: int,
    n_seqs: int,
    scale: float,
) -> float:
    """Backpropagate one role-pure micro-batch with the mini-batch's loss weights (times
    `scale`); returns its share of the mini-batch loss."""
    gcfg = settings.grpo
    role = chunk[0].role
    micro = _pack(chunk, settings.pad_id)
    t_max = micro.targets.shape[1]
    mask = micro.mask.to(device)
    # Rows without an old-log-prob pass (an adapter's first mini-batch) take this forward's
    # log-probs and entropy: the weights have not moved since the rollout. (With rollout
    # old log-probs there was no pass at all: this forward measures the entropy.)
    on_policy = torch.tensor([seq.old_logp is None for seq in chunk], device=device)
    unmeasured = torch.tensor([seq.old_entropy is None for seq in chunk], device=device)
    logp, entropy = completion_logprobs(
        model, micro, settings.temperature, with_entropy=bool(unmeasured.any())
    )
    old = _aligned([s.old_logp or [] for s in chunk], t_max).to(device)
    old = torch.where(on_policy.unsqueeze(1), logp.detach(), old)
    rollout = _aligned([s.rollout_logp for s in chunk], t_max).to(device)
    adv = torch.tensor([s.advantage for s in chunk], device=device).unsqueeze(1).expand_as(logp)
    token_loss, clipped = policy_loss(settings.policy_loss)(logp, old, adv, mask, gcfg)
    if getattr(token_loss, "shape", None) != logp.shape or getattr(clipped, "shape", None) != logp.shape:
        raise ConfigError(f"grpo.policy_loss '{settings.policy_loss}' returned shapes "
                          f"{[list(getattr(t, 'shape', [])) for t in (token_loss, clipped)]} for log-probs of "
                          f"{list(logp.shape)}: a policy loss returns (per-token loss, clipped), each (batch, tokens)")
    beta = gcfg.kl_beta.get(role, 0.0)
    kl = None
    if beta > 0:
        ref = _aligned([s.ref_logp or [] for s in chunk], t_max).to(device)
        kl = ppo.k3_kl(logp, ref, gcfg.log_ratio_clamp, gcfg.kl_clamp)
        token_loss = token_loss + beta * kl
    weights = ppo.token_weights(mask, gcfg.loss_agg, n_tokens, n_seqs) * scale * settings.role_weight.get(role, 1.0)
    loss = (weights * token_loss).sum()
    loss.backward()
    with torch.no_grad():
        s = stats[role]
        s.seqs += len(chunk)
        s.tokens += int(mask.sum())
        s.truncated += sum(seq.truncated for seq in chunk)
        s.entropy_sum += sum(seq.old_entropy for seq in chunk if seq.old_entropy is not None)
        if entropy is not None:
            s.entropy_sum += float((entropy * mask)[unmeasured].sum())
        # rho = pi_theta / pi_rollout, its log clamped to +-20 as verl's chi2_token.
        s.ratios.append(ppo.ratio_sums(logp.detach(), rollout, mask, _RHO_LOG_BOUND))
        s.clipped += int((clipped.float() * mask).sum())
        s.loss_sum += float((token_loss * mask).sum())
        s.absdiff_sum += float(((old - rollout).abs() * mask).sum())
        if kl is not None:
            s.kl_sum += float((kl * mask).sum())
    return float(loss.detach())
