"""Policy losses by name: the per-token loss the update aggregates and backpropagates.

A loss is a function registered with `@register_policy_loss("name")` (as verl's policy
losses are) and chosen by the run's `grpo.policy_loss` (`UpdateSettings.policy_loss`); "vanilla" (verl's name for PPO's
clipped surrogate with dual-clip) is the paper's and the default.

What a loss does: map one role-pure micro-batch's log-probs, old log-probs and advantages
to a loss per token, and say which tokens took a clipped branch (for `clip_frac`).
What it leaves out, kept by the update so every loss gets them the same way:
- aggregation: each token's weight in the mini-batch loss (`grpo.loss_agg`, from the whole
  mini-batch's counts, so micro-batches sum to exactly its aggregate). verl's losses
  aggregate themselves; here a loss returns per-token values, or micro-batches could not
  accumulate to one mini-batch's loss;
- the KL-to-base term (`grpo.kl_beta`; verl also keeps its KL loss outside the policy loss),
  the role's loss weight, the short-mini-batch scale and every diagnostic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import torch

from gridrun.seam.registry import named
from gridrun.seam.runconfig import GRPOSpec
from gridrun.train import ppo

# (logp, old_logp, advantages, mask, spec) -> (loss, clipped): every tensor (batch, tokens).
PolicyLoss: TypeAlias = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, GRPOSpec], tuple[torch.Tensor, torch.Tensor]
]

DEFAULT_POLICY_LOSS = "vanilla"
_POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register a policy loss under `name` (a second function under a taken name
    is refused: a silent replacement would change what every run of that name trains)."""

    def add(loss: PolicyLoss) -> PolicyLoss:
        if _POLICY_LOSSES.setdefault(name, loss) is not loss:
            raise ValueError(f"policy loss '{name}' is registered already: register yours under another name")
        return loss

    return add


def policy_loss(name: str) -> PolicyLoss:
    """The loss registered as `name` ("<module>:<name>": after importing the module, which
    registers it); a ConfigError naming the registered ones if none is."""
    return named("grpo.policy_loss", name, _POLICY_LOSSES, "policy loss", "gridrun.train.losses.register_policy_loss")


@register_policy_loss(DEFAULT_POLICY_LOSS)
def vanilla(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, spec: GRPOSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate with clip-higher and dual-clip (ppo.clipped_policy_loss), its
    bounds from `spec` (clip_low, clip_high, clip_ratio_c, log_ratio_clamp).

    logp: (batch, tokens) the current policy's log-probs, with gradient; old_logp: (batch,
    tokens) the old policy's; advantages: (batch, tokens), a row's advantage on each of its
    tokens; mask: (batch, tokens) 1 on completion tokens (unused: the aggregation masks).
    Returns (loss (batch, tokens), clipped (batch, tokens) bool)."""
    return ppo.clipped_policy_loss(
        logp, old_logp, advantages, spec.clip_low, spec.clip_high, spec.clip_ratio_c, spec.log_ratio_clamp
    )
