"""Per-position rewards of the boundary decisions (detached (B, T) tensors), by name.

A reward is a class registered in the config's REWARDS registry; the estimators call it with the batch's losses,
decisions and targets. The probes are the plumbing checks: synthetic rewards that are a
function of the bytes and decisions alone, so they need no model pass (`probe = True`).
"""

from __future__ import annotations

import torch

from rltok.data.bytes_classes import is_whitespace_byte


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


class WhitespaceProbe(Reward):
    """+1 for a boundary on a wanted byte (here: whitespace), -1 for one anywhere else, 0 without
    a boundary. Byte t is targets[t - 1] (position 0 is forced)."""
    name = "whitespace_probe"
    probe = True

    def sign(self, targets: torch.Tensor) -> torch.Tensor:
        """Per position, what a boundary there earns; a function of the bytes alone, so one call
        serves every segmentation of the same rows (the flips' sampled and flipped ones)."""
        return is_whitespace_byte(targets.roll(1, dims=1)).float() * 2 - 1

    def __call__(self, ce_early, ce_final, b, targets):
        return b.float() * self.sign(targets)


class TokenProbe(WhitespaceProbe):
    """Wanted: the first byte of a Python lexical unit (rltok.data.python_tokens), read one byte
    late: can the policy learn code's tokens when the reward names them? 0 at byte 1, whose
    predecessor the targets do not hold. The lexer runs per row on the host: a plumbing check."""
    name = "token_probe"

    def sign(self, targets: torch.Tensor) -> torch.Tensor:
        from rltok.data.python_tokens import token_ends

        seen = targets[:, :-1].cpu()  # bytes 1 .. T-1
        ends = torch.stack([token_ends(bytes(row.tolist())) for row in seen]).to(targets.device)
        sign = torch.zeros(targets.shape, device=targets.device)
        sign[:, 2:] = ends[:, :-1].float() * 2 - 1  # byte t starts a unit when byte t - 1 ends one
        return sign


def make_reward(name: str) -> Reward:
    """The reward objective.reward names (the config's REWARDS registry)."""
    from rltok.config import REWARDS

    return REWARDS.component(name)()


def probe_sign(targets: torch.Tensor, kind: str = "whitespace_probe") -> torch.Tensor:
    return make_reward(kind).sign(targets)


def probe_reward(b: torch.Tensor, targets: torch.Tensor, kind: str = "whitespace_probe") -> torch.Tensor:
    return make_reward(kind)(None, None, b, targets)


def boundary_reward(ce_early: torch.Tensor, ce_final: torch.Tensor, kind: str, b: torch.Tensor | None = None,
                    targets: torch.Tensor | None = None) -> torch.Tensor:
    """The reward `kind` (a REWARDS name) of one batch; the probes need the decisions `b` and the `targets`."""
    return make_reward(kind)(ce_early, ce_final, b, targets)
