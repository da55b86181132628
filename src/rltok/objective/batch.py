"""What the boundary estimators and the rate control see of one micro-batch (PolicyBatch), and
the batch-statistics protocol they reduce with (LocalMean)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rltok.model.output import ModelOutput
from rltok.objective.policy_gradient import masked_mean


class LocalMean:
    """Batch statistics within one process. The reduction protocol the objective uses:
    `reduce(x)` is the per-position mean over the batch rows of a (B, T) tensor, and
    `reduce.masked_mean(x, mask)` a scalar mean over a mask; both of detached quantities.
    Data-parallel training passes the global implementation (distributed.GlobalBatchMean)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().mean(0, keepdim=True)

    def masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_mean(x.detach(), mask)


LOCAL = LocalMean()


def boundary_rate(b: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """THE rate, used by the logs, eval, the rate loss and the controller alike: boundaries per
    byte over the free positions (the decisions the rule makes; forced ones are left out)."""
    return masked_mean(b.float(), free)


def expected_rate(logits: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """E[rate] under the policy: the mean boundary probability over free positions."""
    return masked_mean(torch.sigmoid(logits.detach().float()), free)


def per_segmentation(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A batch's per-sequence tensor repeated for its K segmentations per sequence (group_size)."""
    return x if x.shape[0] == rows else x.repeat_interleave(rows // x.shape[0], 0)


@dataclass
class Counterfactual:
    """The loss of the same batch with a sparse set of boundary decisions flipped."""
    flips: torch.Tensor  # (B, T) bool: the flipped decisions
    nll: torch.Tensor | None  # (B, T) the model's per-position loss with them flipped (no grad); None: not re-run
    extra: torch.Tensor | None = None  # (B, T) extra per-position cost of the sampled decisions (the lexicon's)
    extra_flipped: torch.Tensor | None = None  # the same with the flips applied
    # (B, T) a probe's reward of the sampled decisions, from the same lexing as the flipped ones'
    reward: torch.Tensor | None = None


@dataclass
class PolicyBatch:
    """One micro-batch as the boundary policy's terms see it. The estimator and the rate control
    read the model's output and per-position losses and fill in what later terms and the metrics
    need (reward, returns, prices), so each piece is computed once."""
    out: ModelOutput
    targets: torch.Tensor  # (B, T) per segmentation row
    ce_early: torch.Tensor | None  # (B, T) encoder-only head's loss
    ce_final: torch.Tensor  # (B, T) the model's loss
    counterfactual: Counterfactual | None = None
    reduce: LocalMean = LOCAL
    metrics: dict = field(default_factory=dict)
    reward: torch.Tensor | None = None  # (B, T) detached per-position reward (after any price in it)
    returns: torch.Tensor | None = None  # the score function's advantages (the supertoken policy reuses them)
    value_loss: torch.Tensor | None = None
    pg_loss: torch.Tensor | None = None  # the estimator's unweighted surrogate
    chunk_price: torch.Tensor | None = None  # nats per chunk (compute price + Lagrange multiplier)
    credit_price: object | None = None  # the flips' price per boundary (a LagrangePrice), None: none

    @property
    def bd(self):
        return self.out.boundaries
