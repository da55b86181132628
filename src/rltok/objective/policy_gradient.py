"""Score-function (REINFORCE) and rate losses, independent of the model."""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)  # nats per bit


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask, in fp32 whatever x's dtype (under bf16 autocast a bf16 count would
    round: 65,504 positions become 65,536)."""
    x = x.float()
    mask = mask.to(torch.float32)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_gradient_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """-mean_t[A_t log pi(a_t)] over `mask`; its gradient is the score-function estimate."""
    return -masked_mean(advantages.detach().float() * logp.float(), mask)


def rate_loss(logits: torch.Tensor, mask: torch.Tensor, target: float, mean=None) -> torch.Tensor:
    """mean(logit) * stopgrad(mean(p) - target): pushes every logit down when the rate is above
    target and up when below, with a force proportional to the miss. `mean(x, mask)` may
    replace the local masked mean for mean(p) (data-parallel ranks pass a global one)."""
    logits = logits.float()
    p_mean = (masked_mean if mean is None else mean)(torch.sigmoid(logits.detach()), mask)
    return masked_mean(logits, mask) * (p_mean - target)
