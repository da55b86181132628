"""The flips estimator (objective.estimator="flips"): each of a sparse set of flipped decisions is
credited with the loss change its flip caused (flips.py), from a counterfactual model pass
(flip_model_pass) and/or the change in the segmentation's code length under the lexicon prior
(lexicon_weight > 0). It needs no baseline or discount: the credit is already per decision."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rltok.model.output import ModelOutput, token_nll
from rltok.objective.batch import Counterfactual, MicroBatch, per_segmentation
from rltok.objective.estimator import BoundaryEstimator, EstimatorSettings, PolicyLoss
from rltok.objective.flips import boundary_values, draw_flips, local_expectation_loss
from rltok.objective.policy_gradient import LN2, masked_mean


def with_lexicon_costs(cf: Counterfactual, lexicon, idx: torch.Tensor, b: torch.Tensor, weight: float) -> Counterfactual:
    """Charge both segmentations their code length under the lexicon (lexicon.py), in nats
    times `weight`, at the boundaries that close its units."""
    idx = per_segmentation(idx, b.shape[0])
    return Counterfactual(cf.flips, cf.nll, weight * lexicon.costs(idx, b), weight * lexicon.costs(idx, b ^ cf.flips),
                          reward=cf.reward)


@dataclass(frozen=True)
class Credit:
    """Each flipped decision's credit D_f (0 elsewhere) and how the surrogate is to treat it: a
    price per boundary reshapes it (rate.py's credit prices) before the estimator consumes it."""
    values: torch.Tensor  # (B, T)
    flips: torch.Tensor  # (B, T) bool
    center: bool = True  # subtract the mean credit over the flips (the rate is then left to a price)
    price: torch.Tensor | float = 0.0  # subtracted from every normalised credit


class Flips(BoundaryEstimator):
    """Settings: flip_stride, flip_model_pass, lexicon_weight (and the reward: a probe's credit
    is a function of the decisions alone, so no model pass is run for it). `lexicon`: the
    ChunkLexicon whose code length is credited (None: none). `credit_price`: a term with
    `price_credit(Credit) -> Credit`, a price per boundary in the credits (None: none)."""
    name = "flips"
    credits_each_decision = True
    weighted = False  # its credits are centred and normalised over the flips: objective.pg_weight is not read

    def __init__(self, reward, settings: EstimatorSettings, lexicon=None, credit_price=None):
        super().__init__(reward, settings)
        self.stride, self.run_model = settings.flip_stride, settings.flip_model_pass
        self.lexicon, self.lexicon_weight = lexicon, settings.lexicon_weight
        self.credit_price = credit_price

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

    def credits(self, mb: MicroBatch, reward: torch.Tensor) -> Credit:
        """D_f = L(b_f = 0) - L(b_f = 1) at each flipped decision. The per-position loss
        compared with the counterfactual one is the LM's (or, for a probe, minus the reward)."""
        cf = mb.counterfactual
        if cf is None:
            raise ValueError("objective.estimator='flips' needs the counterfactual pass (Flips.counterfactual)")
        base = -reward if self.reward_fn.probe else mb.ce_final.detach()
        flipped = base if cf.nll is None else cf.nll  # not re-run: no change
        if cf.extra is not None:
            base, flipped = base + cf.extra, flipped + cf.extra_flipped
        return Credit(boundary_values(base, flipped, cf.flips, mb.bd.b), cf.flips)

    def policy_loss(self, mb: MicroBatch, reward: torch.Tensor) -> PolicyLoss:
        credit = self.credits(mb, reward)
        metrics = {"flip_value": masked_mean(credit.values, credit.flips).detach()}
        if self.credit_price is not None:
            credit = self.credit_price.price_credit(credit)
        surrogate = local_expectation_loss(mb.bd.logits, credit.values, credit.flips, center=credit.center,
                                           mean=mb.reduce.masked_mean, price=credit.price)
        return PolicyLoss(surrogate, metrics=metrics)

    def __call__(self, mb: MicroBatch, reward: torch.Tensor):
        pl = self.policy_loss(mb, reward)
        metrics = {**pl.metrics, "pg_loss": pl.surrogate.detach(), "reward": reward.mean()}
        cf = mb.counterfactual
        if cf.extra is not None:  # the lexicon's code length of the sampled chunks, bits per byte
            metrics["lexicon_bpb"] = cf.extra.mean() / (self.lexicon_weight * LN2)
        return [pl.surrogate], metrics, None

    def state_dict(self) -> dict:
        return {"lexicon": self.lexicon.state_dict()} if self.lexicon is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.lexicon is not None and state.get("lexicon") is not None:
            self.lexicon.load_state_dict(state["lexicon"])
