"""The interface every boundary-gradient estimator implements, a term of the objective that owns its
reward (its protocol: docs/ARCHITECTURE.md, "Where to add things")."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rltok.objective.batch import MicroBatch
from rltok.objective.rewards import Reward
from rltok.objective.terms import Term


@dataclass(frozen=True)
class EstimatorSettings:
    """Every estimator's settings, plain values (build.py reads them); each estimator uses its own."""
    pg_weight: float = 1.0  # the policy term's weight
    returns: object = None  # score function: score_function.Returns (baselines, discount, critic)
    flip_stride: int = 16  # flips: every stride-th free decision is flipped
    flip_model_pass: bool = True  # flips: re-run the model on the flipped decisions
    lexicon_weight: float = 0.0  # flips: nats of the lexicon's code length per nat of LM loss


@dataclass
class PolicyLoss:
    surrogate: torch.Tensor  # the unweighted surrogate
    returns: torch.Tensor | None = None  # per-decision returns (the supertoken policy is credited with them)
    value_loss: torch.Tensor | None = None  # the critic's
    metrics: dict = field(default_factory=dict)


class BoundaryEstimator(Term):
    name = ""
    model_pass = False  # whether `counterfactual` runs the model (charged in the FLOPs meter)
    # whether it credits each decision on its own (then a lexicon's code length and a price per
    # boundary in credit units apply to it)
    credits_each_decision = False
    weighted = True  # whether objective.pg_weight weights its loss

    def __init__(self, reward: Reward, settings: EstimatorSettings, lexicon=None, credit_price=None):
        self.reward_fn = reward
        self.settings = settings

    def counterfactual(self, model, idx, targets, out, generator=None):
        return None

    def observe(self, idx: torch.Tensor, out) -> None:
        """Called for every micro-batch, the warm start's too."""

    def reward(self, mb: MicroBatch) -> torch.Tensor:
        """(B, T) the detached per-position reward of the sampled decisions."""
        cf = mb.counterfactual
        if cf is not None and cf.reward is not None:  # a probe's, computed with the counterfactual's
            return cf.reward
        return self.reward_fn(mb.ce_early, mb.ce_final, mb.bd.b, mb.targets)

    def policy_loss(self, mb: MicroBatch, reward: torch.Tensor) -> PolicyLoss:
        raise NotImplementedError

    def __call__(self, mb: MicroBatch, reward: torch.Tensor):
        """(loss parts, metrics, returns)."""
        raise NotImplementedError
