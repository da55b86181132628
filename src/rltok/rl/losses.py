"""Score-function (REINFORCE) and rate losses, independent of the model."""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_gradient_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                         ratio_logp: torch.Tensor | None = None) -> torch.Tensor:
    """-mean_t[A_t log pi(a_t)] over `mask`; its gradient is the score-function estimate.
    With `ratio_logp` (log-probs of the behaviour policy), uses the importance-weighted
    surrogate A_t * pi/mu, whose gradient equals the on-policy one when pi == mu."""
    advantages = advantages.detach()
    if ratio_logp is None:
        return -masked_mean(advantages * logp, mask)
    ratio = torch.exp(logp - ratio_logp.detach())
    return -masked_mean(advantages * ratio, mask)


def rate_loss(logits: torch.Tensor, mask: torch.Tensor, target: float, mean=None) -> torch.Tensor:
    """mean(logit) * stopgrad(mean(p) - target): pushes every logit down when the rate is above
    target and up when below, with a force proportional to the miss. `mean(x, mask)` may
    replace the local masked mean for mean(p) (data-parallel ranks pass a global one)."""
    p_mean = (masked_mean if mean is None else mean)(torch.sigmoid(logits.detach()), mask)
    return masked_mean(logits, mask) * (p_mean - target)
