"""The learning-rate schedule, kept pure: the LR after a number of scheduler advances
(warmup, then constant or cosine) and how many advances an adapter's update has seen (per
update under `released`, per step under `as_written`).
"""

from __future__ import annotations

import math


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


def ramp_reached(step: int | None, ramp: int) -> float:
    """How far optim.role_lr_scale's ramp has gone at training `step` (1-based): min(1, step /
    ramp), so a role's LR multiplier is 1 + (scale - 1) * this (gridrun/seam/routing.py); 1
    without a ramp (ramp 0) or outside training (step None)."""
    return 1.0 if step is None or ramp <= 0 else min(1.0, step / ramp)
