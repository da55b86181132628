"""Boundary rules: decide, byte by byte, where a chunk ends.

Convention: b[:, t] = 1 means byte t is the *last* byte of a chunk. Position 0 is always a
boundary (so every byte has a chunk ending at or before it); in training the last position is
one too. Forced positions carry no gradient (`free` marks the ones that do).

Every chunker returns a `Boundaries` record so the model and the objective never need to know
which rule produced it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Boundaries:
    b: torch.Tensor  # (B, T) bool: byte t closes a chunk
    free: torch.Tensor  # (B, T) bool: decision was made by the rule (not forced)
    logits: torch.Tensor | None = None  # (B, T) policy logits (with grad), RL only
    logp: torch.Tensor | None = None  # (B, T) log pi(b_t | history), with grad, RL only
    sample_logp: torch.Tensor | None = None  # (B, T) log-prob computed inside the sampler

    @property
    def probs(self) -> torch.Tensor | None:
        return None if self.logits is None else torch.sigmoid(self.logits)


def forced_mask(batch: int, length: int, device, force_last: bool) -> torch.Tensor:
    forced = torch.zeros(batch, length, dtype=torch.bool, device=device)
    forced[:, 0] = True
    if force_last:
        forced[:, -1] = True
    return forced


def bernoulli_logp(b: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """log pi(b) for a Bernoulli with the given logits, elementwise and numerically stable."""
    return -F.binary_cross_entropy_with_logits(logits, b.to(logits.dtype), reduction="none")


class RLPolicy(nn.Module):
    """Autoregressive Bernoulli boundary policy.

    logit_t = w . h_t + c + table[pattern_t], where pattern_t encodes the policy's previous
    `window - 1` decisions (window=1: decisions independent given the encoder, fully parallel).
    A table over all 2^(window-1) histories is the most general additive function of them.

    Given the decisions, all log-probabilities are computed in parallel (teacher forcing); only
    sampling with window > 1 needs a loop over positions, which runs on the device with no
    host synchronisation.
    """

    def __init__(self, dim: int, window: int = 1, target_rate: float = 0.2, detach_input: bool = False):
        super().__init__()
        self.window = window
        self.detach_input = detach_input
        self.head = nn.Linear(dim, 1)
        nn.init.zeros_(self.head.weight)
        # start at the target rate, so neither the LM nor the rate loss sees a collapsed start
        nn.init.constant_(self.head.bias, math.log(target_rate / (1 - target_rate)) if target_rate < 1 else 6.0)
        self.history = nn.Embedding(2 ** (window - 1), 1) if window > 1 else None
        if self.history is not None:
            nn.init.zeros_(self.history.weight)

    def history_pattern(self, b: torch.Tensor) -> torch.Tensor:
        """pattern_t = sum_j b_{t-j} 2^(j-1) for j = 1..window-1 (positions before 0 count as 0)."""
        pattern = torch.zeros_like(b, dtype=torch.long)
        bl = b.long()
        for j in range(1, self.window):
            pattern[:, j:] += bl[:, :-j] << (j - 1)
        return pattern

    def teacher_forced_logits(self, base: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.history is None:
            return base
        return base + self.history(self.history_pattern(b)).squeeze(-1)

    @torch.no_grad()
    def sample(self, base: torch.Tensor, forced: torch.Tensor, greedy: bool,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw decisions (B, T) and their log-probs as computed during sampling."""
        u = None if greedy else torch.rand(base.shape, device=base.device, generator=generator, dtype=torch.float32)
        if self.history is None:
            logits = base.float()
            b = (logits > 0) if greedy else (u < torch.sigmoid(logits))
            b = b | forced
            return b, bernoulli_logp(b, logits)
        bsz, length = base.shape
        table = self.history.weight.squeeze(-1).float()
        b = torch.zeros(bsz, length, dtype=torch.bool, device=base.device)
        logp = torch.zeros(bsz, length, dtype=torch.float32, device=base.device)
        pattern = torch.zeros(bsz, dtype=torch.long, device=base.device)
        mask = 2 ** (self.window - 1) - 1
        base = base.float()
        for t in range(length):
            lt = base[:, t] + table[pattern]
            bt = (lt > 0) if greedy else (u[:, t] < torch.sigmoid(lt))
            bt = bt | forced[:, t]
            b[:, t] = bt
            logp[:, t] = bernoulli_logp(bt, lt)
            pattern = ((pattern << 1) | bt.long()) & mask
        return b, logp

    def forward(self, h: torch.Tensor, forced: torch.Tensor, b: torch.Tensor | None = None,
                mode: str = "sample", generator: torch.Generator | None = None) -> Boundaries:
        base = self.head(h.detach() if self.detach_input else h).squeeze(-1)
        sample_logp = None
        if b is None:
            b, sample_logp = self.sample(base.detach(), forced, mode == "greedy", generator)
        else:
            b = b.bool() | forced
        logits = self.teacher_forced_logits(base, b)
        return Boundaries(b=b, free=~forced, logits=logits, logp=bernoulli_logp(b, logits), sample_logp=sample_logp)


class FixedChunker(nn.Module):
    """A boundary every `stride` bytes (byte stride-1, 2*stride-1, ...), plus the forced ones."""

    def __init__(self, stride: int):
        super().__init__()
        self.stride = stride

    def forward(self, h: torch.Tensor, forced: torch.Tensor, b: torch.Tensor | None = None,
                mode: str = "sample", generator: torch.Generator | None = None) -> Boundaries:
        if b is None:
            t = torch.arange(h.shape[1], device=h.device)
            b = ((t + 1) % self.stride == 0).unsqueeze(0).expand_as(forced)
        return Boundaries(b=b.bool() | forced, free=~forced)


def build_chunker(cfg) -> nn.Module:
    if cfg.chunker == "rl":
        return RLPolicy(cfg.d_byte, cfg.policy_window, cfg.target_rate, cfg.policy_detach)
    if cfg.chunker == "fixed":
        return FixedChunker(cfg.fixed_stride)
    raise ValueError(f"unknown chunker {cfg.chunker!r}")
