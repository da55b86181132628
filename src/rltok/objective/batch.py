"""What every term of the objective sees of one micro-batch (MicroBatch, read-only), and the
batch-statistics protocol they reduce with (LocalMean)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rltok.model.output import ModelOutput, token_nll
from rltok.objective.policy_gradient import masked_mean


class LocalMean:
    """Batch statistics within one process (data parallel: distributed.GlobalBatchMean): `reduce(x)`
    the per-position mean over a (B, T) tensor's rows, `reduce.masked_mean(x, mask)` a scalar mean,
    `reduce.rows(x)` how many rows the per-position mean is over."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().mean(0, keepdim=True)

    def masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_mean(x.detach(), mask)

    def rows(self, x: torch.Tensor) -> int:
        """The rows `reduce(x)` averages over (known on the host: no device sync)."""
        return int(x.shape[0])


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


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch as every term of the objective sees it, read-only: the model's output, its
    per-position losses (computed once, here), the counterfactual and the batch-statistics
    protocol. Terms add nothing to it: what one term computes for another (a reward, credits,
    returns) is returned and passed on explicitly."""
    out: ModelOutput
    targets: torch.Tensor  # (B, T) per segmentation row
    ce_final: torch.Tensor  # (B, T) the model's loss, attributed to bytes
    counted: torch.Tensor  # (B, T) bool: the bytes whose loss counts
    ce_early: torch.Tensor | None  # (B, T) the encoder-only head's loss (None: no early exit)
    counterfactual: Counterfactual | None = None
    reduce: LocalMean = LOCAL

    @classmethod
    def of(cls, out: ModelOutput, targets: torch.Tensor, counterfactual: Counterfactual | None = None,
           reduce: LocalMean = LOCAL) -> "MicroBatch":
        targets = out.rows_targets(targets)
        ce_final, counted = out.per_byte_nll(targets)
        ce_early = None if out.early_logits is None else token_nll(out.early_logits, targets)
        return cls(out, targets, ce_final, counted, ce_early, counterfactual, reduce)

    @property
    def bd(self):
        return self.out.boundaries

    @property
    def learns_boundaries(self) -> bool:
        """Whether the output carries a boundary policy's logits (a learned rule)."""
        return self.bd is not None and self.bd.logits is not None
