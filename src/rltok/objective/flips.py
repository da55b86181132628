"""Counterfactual flips: per-decision credit for many independent binary decisions, a truncated
local-expectation gradient (the derivation: docs/CONFIG.md, "The objective"). Nothing here knows
about models: inputs are per-position losses and masks."""

from __future__ import annotations

import torch

from rltok.objective.policy_gradient import masked_mean


def draw_flips(free: torch.Tensor, stride: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, T) bool: every `stride`-th position from a random phase per row, free positions only.
    Positions past the phase are regular, so every decision is flipped equally often."""
    bsz, length = free.shape
    phase = torch.randint(0, stride, (bsz, 1), generator=generator, device="cpu").to(free.device)
    t = torch.arange(length, device=free.device).unsqueeze(0)
    return ((t - phase) % stride == 0) & (t >= phase) & free


def flip_segment_sums(delta: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """For each flipped position f, the sum of delta over [f, next flipped position) (or to the
    end of the row); 0 elsewhere. delta: (B, T) per-position loss change; flips: (B, T) bool."""
    seg = torch.cumsum(flips.long(), dim=1)  # segment id: number of flips at or before t
    n_seg = int(seg.max()) + 1
    sums = torch.zeros(delta.shape[0], n_seg, dtype=delta.dtype, device=delta.device)
    sums.scatter_add_(1, seg, delta)  # segment 0 (before the first flip) is discarded
    return torch.where(flips, torch.gather(sums, 1, seg), torch.zeros_like(delta))


def boundary_values(loss_base: torch.Tensor, loss_flipped: torch.Tensor, flips: torch.Tensor,
                    b: torch.Tensor) -> torch.Tensor:
    """D_f = L(b_f = 0) - L(b_f = 1) at each flipped position (0 elsewhere): how much a boundary
    at f lowers the loss, from one evaluation of the sampled decisions and one with the flips."""
    effect = flip_segment_sums((loss_flipped - loss_base).float(), flips)  # L(flipped) - L(taken)
    sign = b.float() * 2 - 1  # taken b_f = 1: the flip removed it; b_f = 0: the flip added it
    return effect * sign


def local_expectation_loss(logits: torch.Tensor, values: torch.Tensor, flips: torch.Tensor,
                           center: bool = True, normalize: bool = True, mean=None,
                           price: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Surrogate whose gradient w.r.t. each flipped logit is -p(1-p) D_f / n_flips. `center`
    subtracts the mean D over the flips, `normalize` divides by their standard deviation; then
    `price`, a cost per boundary in those units, is subtracted from every credit. `mean(x, mask)`
    may replace the local masked mean (data parallel: global statistics)."""
    mm = masked_mean if mean is None else mean
    v = values.detach().float()
    if center:
        v = v - mm(v, flips)
    if normalize:
        v = v / mm(v.square(), flips).sqrt().clamp(min=1e-8)
    v = v - price
    return -masked_mean(torch.sigmoid(logits.float()) * v, flips)
