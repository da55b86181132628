"""The learning-rate schedule: pure functions of the step and the share of the run spent, so a
resumed run needs no scheduler state and a branch can tell where a run's cool-down begins."""

from __future__ import annotations

import math


def lr_at(step: int, cfg, progress: float | None = None) -> float:
    """Linear warm-up, then (train.lr_schedule) cosine decay to min_lr_ratio * lr, or "wsd": lr
    until the last cooldown_frac of the run, then a linear decay to min_lr_ratio * lr. `progress`:
    the share of the run spent (under a FLOPs budget)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.constant_phase:
        left = cooldown_left(step, cfg, progress)
        return cfg.lr if left is None else cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * left)
    if progress is None:
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, progress)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def cooldown_left(step: int, cfg, progress: float | None = None) -> float | None:
    """Under the "wsd" schedule, the share of the cool-down still ahead at `step` (1 as it begins,
    0 at the end of the run); None while the learning rate is not cooling down (warm-up, the
    constant phase, or another schedule). `progress`: the share of the run spent (of the FLOPs
    budget; None: step / max_steps)."""
    if not cfg.constant_phase or step < cfg.warmup_steps:
        return None
    progress = min(1.0, step / max(1, cfg.max_steps) if progress is None else progress)
    if progress <= 1 - cfg.cooldown_frac:
        return None
    return (1 - progress) / cfg.cooldown_frac


def anchored_progress(step: int, max_steps: int, anchor: tuple[int, float] | None) -> float | None:
    """The cosine's progress at `step` after a resume changed max_steps: from `anchor` = (the
    step resumed at, the progress then) linearly to 1 at max_steps. None without an anchor (the
    plain schedule of lr_at)."""
    if anchor is None:
        return None
    start, at = anchor
    return at + (1 - at) * (step - start) / max(1, max_steps - start)
