"""The language-modelling terms: a plain LM's loss, the hierarchical model's final and early-exit
cross-entropies, and the boundary rule's own loss (with the rate it drew). The LM loss never
reaches a sampled policy's boundary probabilities (hard selection: the estimator trains those);
it does reach the straight-through rules' scorers (hnet, gumbel, dynamic_pooling)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rltok.objective.batch import MicroBatch, boundary_rate, expected_rate
from rltok.objective.policy_gradient import LN2, masked_mean
from rltok.objective.terms import Term


def _bpb(nll: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    return masked_mean(nll.detach(), mb.counted) / LN2


class PlainLM(Term):
    """A plain LM (flat byte or BPE-token): the mean loss over the counted bytes."""

    def __call__(self, mb: MicroBatch):
        bpb = _bpb(mb.ce_final, mb)
        loss = mb.ce_final.sum() / mb.counted.sum().clamp(min=1)
        metrics = {"ce_final": loss.detach(), "bpb": bpb}
        if mb.out.n_chunks is not None:  # tokens per byte: what a token model's compute scales with
            metrics["chunks_per_byte"] = (mb.out.n_chunks.sum() / mb.ce_final.numel()).detach().float()
        return loss, metrics


class FinalCE(Term):
    """(1 - alpha) CE_final: the full model's loss."""

    def __init__(self, weight: float):
        self.weight = weight

    def __call__(self, mb: MicroBatch):
        return self.weight * mb.ce_final.mean(), {"ce_final": mb.ce_final.mean().detach(), "bpb": _bpb(mb.ce_final, mb)}


class EarlyExitCE(FinalCE):
    """alpha CE_early: the encoder-only head's loss (it also trains the encoder the rule reads)."""

    def __call__(self, mb: MicroBatch):
        ce = mb.ce_early
        return self.weight * ce.mean(), {"ce_early": ce.mean().detach(), "bpb_early": _bpb(ce, mb)}


class BoundaryRule(Term):
    """The rule's own regulariser (hnet, gumbel: already weighted), and the rate it drew."""

    def __call__(self, mb: MicroBatch):
        bd = mb.bd
        metrics = {"rate": boundary_rate(bd.b, bd.free).detach(),
                   "chunks_per_byte": bd.b.float().mean().detach()}  # what the chunk-level compute scales with
        if bd.aux_loss is None:
            return None, metrics
        return bd.aux_loss, {**metrics, "aux_loss": bd.aux_loss.detach()}


def frozen_policy_metrics(mb: MicroBatch, settled: bool = False) -> dict:
    """What a policy left alone (the warm start, or settled) is watched by. A settled rule's
    decisions are thresholded, not drawn: its expected rate is the rate it cuts at, and its
    probabilities are 0 or 1, so the sigmoid of its logits would report a rate it never uses."""
    bd = mb.bd
    if settled:
        rate = boundary_rate(bd.b, bd.free).detach()
        return {"expected_rate": rate, "p_mean": rate}
    return {"expected_rate": expected_rate(bd.logits, free=bd.free),
            "p_mean": masked_mean(torch.sigmoid(bd.logits.detach()), bd.free)}


def policy_metrics(mb: MicroBatch) -> dict:
    """What a learning policy is watched by; the expected rate is the global one (data parallel),
    so the controllers move as in one process."""
    logits, free = mb.bd.logits.detach(), mb.bd.free
    return {"expected_rate": mb.reduce.masked_mean(torch.sigmoid(logits.float()), free),
            "p_mean": masked_mean(torch.sigmoid(logits), free),
            "entropy": masked_mean(F.binary_cross_entropy_with_logits(logits, torch.sigmoid(logits),
                                                                      reduction="none"), free)}
