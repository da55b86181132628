"""The interface every boundary-gradient estimator implements (see build.ESTIMATORS).

An estimator owns its settings and its reward. Per micro-batch the objective calls
`counterfactual` (any extra pass it learns from; after the model's forward), `observe` (state
it keeps from the sampled decisions, e.g. the lexicon's counts), then `reward` and `add`, which
adds its weighted loss terms to the running loss and writes its metrics. `policy_loss` is the
unweighted surrogate alone (what diagnostics differentiate).
"""

from __future__ import annotations

import torch

from rltok.objective.batch import PolicyBatch
from rltok.objective.rewards import Reward


class BoundaryEstimator:
    name = ""
    model_pass = False  # whether `counterfactual` runs the model (charged in the FLOPs meter)

    def __init__(self, cfg, reward: Reward, lexicon=None):
        self.cfg = cfg
        self.reward_fn = reward

    def counterfactual(self, model, idx, targets, out, generator=None):
        return None

    def observe(self, idx: torch.Tensor, out) -> None:
        """Called for every micro-batch, the warm start's too."""

    def reward(self, batch: PolicyBatch) -> torch.Tensor:
        cf = batch.counterfactual
        if cf is not None and cf.reward is not None:  # a probe's, computed with the counterfactual's
            return cf.reward
        return self.reward_fn(batch.ce_early, batch.ce_final, batch.bd.b, batch.targets)

    def policy_loss(self, batch: PolicyBatch) -> torch.Tensor:
        raise NotImplementedError

    def add(self, loss: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
        raise NotImplementedError
