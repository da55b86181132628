"""The score-function (REINFORCE) estimator of the reference recipe: per-position reward,
baseline (batch / group / value / none), discounted return G_t = sum_{k>=t} gamma^(k-t) A_k (or
GAE on the critic), then -mean(G_t log pi(b_t))."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rltok.objective.advantages import batch_relative, discounted_cumsum, gae, group_relative
from rltok.objective.batch import LOCAL, LocalMean, MicroBatch
from rltok.objective.estimator import BoundaryEstimator, PolicyLoss
from rltok.objective.policy_gradient import masked_mean, policy_gradient_loss

VALUE_WEIGHT = 0.1  # weight of the critic's squared error (never tuned: it only trains the value head)


@dataclass(frozen=True)
class Returns:
    """How per-position rewards become per-decision returns (build.returns_of reads a config's)."""
    batch_baseline: bool = True  # subtract the per-position mean over the batch
    # ... over the batch's other rows: a row's own reward then never enters its baseline, which
    # otherwise shrinks the expected gradient by (n - 1) / n for n rows (to nothing at n = 1)
    leave_one_out: bool = False
    group_size: int = 1  # > 1 with group_baseline: K segmentations of each sequence
    group_baseline: bool = False  # leave-one-out mean over the K segmentations of the same sequence
    critic: bool = False  # GAE on the model's value head, which regresses on the discounted return
    gamma: float = 0.99
    gae_lambda: float = 0.95
    normalize: bool = False  # scale the returns to unit variance over the free positions


def boundary_advantages(reward: torch.Tensor, free: torch.Tensor, settings: Returns,
                        values: torch.Tensor | None = None, batch_mean: LocalMean = LOCAL
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-decision advantages from per-position rewards (B, T), and the critic's loss: the
    baseline first (batch or group), then the discounted return sum_k gamma^(k-t) A_k, or with the
    critic GAE(gamma, lambda) on it (the critic regresses on that discounted return)."""
    s = settings
    if s.batch_baseline:
        # (one row: its own reward is its baseline and every return is 0; the trainer refuses that)
        reward = batch_relative(reward, s.leave_one_out, mean=batch_mean(reward), rows=batch_mean.rows(reward))
    elif s.group_baseline:
        reward = group_relative(reward, s.group_size)
    returns = discounted_cumsum(reward, s.gamma)
    value_loss = None
    if s.critic:
        if values is None:
            raise ValueError("objective.estimator.baseline uses 'value' but the model has no value head")
        value_loss = masked_mean((values.float() - returns).square(), free)
        returns = gae(reward, values.detach().float(), s.gamma, s.gae_lambda)
    if s.normalize:  # over the whole (global) batch, so that every rank scales alike
        mu = batch_mean.masked_mean(returns, free)
        sd = batch_mean.masked_mean((returns - mu).square(), free).sqrt()
        # no free position (or returns all equal): nothing to scale, and 1/sd would blow them up
        returns = (returns - mu) / torch.where(sd > 1e-6, sd, torch.ones_like(sd))
    return returns, value_loss


class ScoreFunction(BoundaryEstimator):
    """objective.estimator="score_function": the reward, baselined and discounted (settings.returns),
    weighted by pg_weight; with the critic also its squared error (VALUE_WEIGHT)."""
    name = "score_function"

    def policy_loss(self, mb: MicroBatch, reward: torch.Tensor) -> PolicyLoss:
        bd = mb.bd
        returns, value_loss = boundary_advantages(reward, bd.free, self.settings.returns, mb.out.values, mb.reduce)
        return PolicyLoss(policy_gradient_loss(bd.logp, returns, bd.free), returns, value_loss)

    def __call__(self, mb: MicroBatch, reward: torch.Tensor):
        pl = self.policy_loss(mb, reward)
        parts, metrics = [], {}
        if pl.value_loss is not None:
            parts.append(VALUE_WEIGHT * pl.value_loss)
            metrics["value_loss"] = pl.value_loss.detach()
        parts.append(self.settings.pg_weight * pl.surrogate)
        metrics.update(pg_loss=pl.surrogate.detach(), reward=reward.mean(), return_std=pl.returns.std(correction=0))
        return parts, metrics, pl.returns
