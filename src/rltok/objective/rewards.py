"""Per-position rewards of the boundary decisions (detached (B, T) tensors), registered in REWARDS. A
probe (`probe = True`) reads the bytes and decisions alone, so the flips run no model pass for it."""

from __future__ import annotations

import torch


class Reward:
    name = ""
    probe = False  # a function of the decisions and bytes alone

    def __call__(self, ce_early, ce_final, b, targets) -> torch.Tensor:
        raise NotImplementedError


class EarlyExit(Reward):
    """CE_early - CE_final: how much the deep path improved the prediction of each byte."""
    name = "early_exit"

    def __call__(self, ce_early, ce_final, b=None, targets=None):
        return (ce_early - ce_final).detach()


class Final(Reward):
    """-CE_final: the model's own loss, without the early-exit baseline."""
    name = "final"

    def __call__(self, ce_early, ce_final, b=None, targets=None):
        return -ce_final.detach()


def make_reward(name: str) -> Reward:
    """The reward objective.reward names (the config's REWARDS registry)."""
    from rltok.config import REWARDS

    return REWARDS.component(name)()
