"""I6, the gradient-direction coherence regularizer of the paper's released code (its docs
describe it; the paper does not): each role's gradient g of a mini-batch is scaled by

    1 - lambda * max(0, cos(g, EMA of the role's earlier g))

so a role that keeps pushing the same direction step after step (the drift the paper's
mechanisms produce) is damped, and a role whose gradient turns away is left alone. The EMA
is of the unscaled gradients, one per role, updated after each of its mini-batches:
ema <- decay * ema + (1 - decay) * g (the first g starts it, and is not scaled).

What it leaves out: anything the docs do not say (their EMA decay; whether the scale applies
before or after the grad-norm clip: here before, to the role's part of the mini-batch's
gradient, so under Shared-Policy each role's part is scaled by its own factor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def coherence_scale(grad: list[torch.Tensor], ema: list[torch.Tensor] | None, strength: float) -> float:
    """1 - strength * max(0, cos(grad, ema)) over the flattened tensors; 1 without an EMA yet
    or where either vector is zero (no direction to compare)."""
    if ema is None:
        return 1.0
    dot = sum(float((g.float() * e.float()).sum()) for g, e in zip(grad, ema))
    norms = (sum(float(g.float().pow(2).sum()) for g in grad) * sum(float(e.float().pow(2).sum()) for e in ema)) ** 0.5
    if norms == 0.0:
        return 1.0
    return 1.0 - strength * max(0.0, dot / norms)


@dataclass
class Coherence:
    """The per-role EMAs of one run (a checkpoint keeps them, so a resume scales as before)."""

    strength: float
    decay: float
    ema: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def scale(self, role: str, grad: list[torch.Tensor]) -> float:
        """This mini-batch's factor for `role`'s gradient; then fold the gradient into its EMA.
        A non-finite gradient (its optimizer step is skipped) gets 1 and leaves the EMA alone:
        one NaN would otherwise disable the regularizer for the rest of the run."""
        if not all(bool(torch.isfinite(g).all()) for g in grad):
            return 1.0
        factor = coherence_scale(grad, self.ema.get(role), self.strength)
        previous = self.ema.get(role)
        if previous is None:
            self.ema[role] = [g.detach().clone() for g in grad]
        else:
            self.ema[role] = [self.decay * e + (1.0 - self.decay) * g for e, g in zip(previous, grad)]
        return factor

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        return {role: [t.cpu() for t in tensors] for role, tensors in self.ema.items()}

    def load_state_dict(self, state: dict[str, list[torch.Tensor]], device: torch.device) -> None:
        self.ema = {role: [t.to(device) for t in tensors] for role, tensors in state.items()}
