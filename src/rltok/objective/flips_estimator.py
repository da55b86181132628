"""The flips estimator (objective.estimator="flips"): each of a sparse set of flipped decisions is
credited with the loss change its flip caused (flips.py), from a counterfactual model pass
(flip_model_pass) and/or the change in the segmentation's code length under the lexicon prior
(lexicon_weight > 0). It needs no baseline or discount: the credit is already per decision."""

from __future__ import annotations

import math

import torch

from rltok.model.output import ModelOutput, token_nll
from rltok.objective.batch import Counterfactual, PolicyBatch, per_segmentation
from rltok.objective.controller import LossSlopePrice
from rltok.objective.estimator import BoundaryEstimator
from rltok.objective.flips import boundary_values, draw_flips, local_expectation_loss
from rltok.objective.policy_gradient import masked_mean

LN2 = math.log(2.0)


def with_lexicon_costs(cf: Counterfactual, lexicon, idx: torch.Tensor, b: torch.Tensor, weight: float) -> Counterfactual:
    """Charge both segmentations their code length under the lexicon (lexicon.py), in nats
    times `weight`, at the boundaries that close its units."""
    idx = per_segmentation(idx, b.shape[0])
    return Counterfactual(cf.flips, cf.nll, weight * lexicon.costs(idx, b), weight * lexicon.costs(idx, b ^ cf.flips),
                          reward=cf.reward)


class Flips(BoundaryEstimator):
    """Settings: flip_stride, flip_model_pass, lexicon_weight (and the reward: a probe's credit
    is a function of the decisions alone, so no model pass is run for it). `lexicon`: the
    ChunkLexicon whose code length is credited (None: none)."""
    name = "flips"

    def __init__(self, cfg, reward, lexicon=None):
        super().__init__(cfg, reward)
        self.stride, self.run_model = cfg.flip_stride, cfg.flip_model_pass
        self.lexicon, self.lexicon_weight = lexicon, cfg.lexicon_weight

    @property
    def model_pass(self) -> bool:
        return self.run_model and not self.reward_fn.probe

    @torch.no_grad()
    def counterfactual(self, model, idx: torch.Tensor, targets: torch.Tensor, out: ModelOutput,
                       generator: torch.Generator | None = None) -> Counterfactual:
        """Flip every stride-th free decision (random phase per row) and re-run what comes after
        the encoder (its output is reused); the lexicon's counts are not touched."""
        bd = out.boundaries
        flips = draw_flips(bd.free, self.stride, generator)
        b_flipped = bd.b ^ flips
        rows = bd.b.shape[0]
        idx, targets = per_segmentation(idx, rows), per_segmentation(targets, rows)
        if self.reward_fn.probe:
            sign = self.reward_fn.sign(targets)  # the bytes are lexed once for both segmentations
            cf = Counterfactual(flips, -(b_flipped.float() * sign), reward=bd.b.float() * sign)
        elif not self.run_model:  # the lexicon's credit alone: no model pass, no extra FLOPs
            cf = Counterfactual(flips, None)
        else:
            alt = model.rerun(idx, out, b_flipped)
            cf = Counterfactual(flips, token_nll(alt.logits, targets))
        return cf if self.lexicon is None else with_lexicon_costs(cf, self.lexicon, idx, bd.b, self.lexicon_weight)

    def observe(self, idx: torch.Tensor, out: ModelOutput) -> None:
        if self.lexicon is not None:  # count the sampled units (the warm start's too)
            b = out.boundaries.b
            self.lexicon.update(per_segmentation(idx, b.shape[0]), b)

    def credits(self, batch: PolicyBatch) -> torch.Tensor:
        """(B, T) D_f = L(b_f = 0) - L(b_f = 1) at each flipped decision. The per-position loss
        compared with the counterfactual one is the LM's (or, for a probe, minus the reward)."""
        cf = batch.counterfactual
        if cf is None:
            raise ValueError("objective.estimator='flips' needs the counterfactual pass (Flips.counterfactual)")
        base = -batch.reward if self.reward_fn.probe else batch.ce_final.detach()
        flipped = base if cf.nll is None else cf.nll  # not re-run: no change
        if cf.extra is not None:
            base, flipped = base + cf.extra, flipped + cf.extra_flipped
        return boundary_values(base, flipped, cf.flips, batch.bd.b)

    def policy_loss(self, batch: PolicyBatch) -> torch.Tensor:
        values = self.credits(batch)
        flips = batch.counterfactual.flips
        batch.metrics["flip_value"] = masked_mean(values, flips).detach()
        price = 0.0 if batch.credit_price is None else batch.credit_price.price
        if isinstance(batch.credit_price, LossSlopePrice):
            # a price in nats, set against the credits as they are: not centred, so the rate is
            # where the credit of one more boundary meets its price
            return local_expectation_loss(batch.bd.logits, torch.where(flips, values - price, values), flips,
                                          center=False, mean=batch.reduce.masked_mean)
        return local_expectation_loss(batch.bd.logits, values, flips, mean=batch.reduce.masked_mean, price=price)

    def add(self, loss: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
        batch.pg_loss = self.policy_loss(batch)
        if batch.credit_price is not None:
            batch.metrics["flip_price"] = batch.credit_price.price.detach()
        cf = batch.counterfactual
        if cf.extra is not None:  # the lexicon's code length of the sampled chunks, bits per byte
            batch.metrics["lexicon_bpb"] = cf.extra.mean() / (self.lexicon_weight * LN2)
        return loss + batch.pg_loss
