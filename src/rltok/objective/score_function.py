"""The score-function (REINFORCE) estimator of the reference recipe: per-position reward,
baseline (batch / group / value / none), discounted return G_t = sum_{k>=t} gamma^(k-t) A_k (or
GAE on the critic), then -mean(G_t log pi(b_t)). Also the two-stage model's supertoken policy,
which is credited with the same stage-1 returns."""

from __future__ import annotations

import torch

from rltok.config import ObjectiveConfig
from rltok.model.output import ModelOutput
from rltok.objective.advantages import batch_relative, discounted_cumsum, gae, group_relative
from rltok.objective.batch import LOCAL, LocalMean, PolicyBatch, boundary_rate, expected_rate
from rltok.objective.estimator import BoundaryEstimator
from rltok.objective.policy_gradient import masked_mean, policy_gradient_loss

VALUE_WEIGHT = 0.1  # weight of the critic's squared error (never tuned: it only trains the value head)


def boundary_advantages(reward: torch.Tensor, free: torch.Tensor, cfg: ObjectiveConfig,
                        values: torch.Tensor | None = None, batch_mean: LocalMean = LOCAL
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-decision advantages from per-position rewards (B, T), and the critic's loss.

    Baseline first ("batch": per-position mean over the batch; "group": leave-one-out mean over
    the K segmentations of the same sequence), then either the discounted return
    sum_k gamma^(k-t) A_k, or with "value" GAE(gamma, lambda) on the critic, whose regression
    target is that discounted return.
    """
    est = cfg.estimator
    parts = est.baseline_parts()
    if "batch" in parts:
        reward = batch_relative(reward, mean=batch_mean(reward))
    elif "group" in parts:
        reward = group_relative(reward, cfg.group_size)
    returns = discounted_cumsum(reward, est.gamma)
    value_loss = None
    if "value" in parts:
        if values is None:
            raise ValueError("objective.baseline uses 'value' but the model has no value head")
        value_loss = masked_mean((values.float() - returns).square(), free)
        returns = gae(reward, values.detach().float(), est.gamma, est.gae_lambda)
    if est.normalize_advantages:
        mu = masked_mean(returns, free)
        sd = masked_mean((returns - mu).square(), free).sqrt().clamp(min=1e-6)
        returns = (returns - mu) / sd
    return returns, value_loss


class ScoreFunction(BoundaryEstimator):
    """objective.estimator="score_function" (settings: reward, baseline, group_size, gamma,
    gae_lambda, normalize_advantages, pg_weight)."""
    name = "score_function"

    def policy_loss(self, batch: PolicyBatch) -> torch.Tensor:
        bd = batch.bd
        batch.returns, batch.value_loss = boundary_advantages(batch.reward, bd.free, self.cfg, batch.out.values,
                                                              batch.reduce)
        return policy_gradient_loss(bd.logp, batch.returns, bd.free)

    def add(self, loss: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
        batch.pg_loss = self.policy_loss(batch)
        if batch.value_loss is not None:
            loss = loss + VALUE_WEIGHT * batch.value_loss
            batch.metrics["value_loss"] = batch.value_loss.detach()
        return loss + self.cfg.pg_weight * batch.pg_loss


def supertoken_terms(out: ModelOutput, returns: torch.Tensor, cfg: ObjectiveConfig, rate, metrics: dict,
                     batch_mean: LocalMean = LOCAL) -> torch.Tensor:
    """Policy-gradient, price and rate terms of a two-stage model's supertoken policy. Its
    decision at chunk j first changes the prediction made at chunk j's last byte, so it is
    credited with the stage-1 return from that byte on (same reward, baseline and discount).
    Under data parallelism the means over chunks are per rank (ranks hold different numbers of
    chunks), except the rate loss' mean probability, which is global. `rate`: the RateControl."""
    bd2 = out.boundaries2
    free2 = bd2.free
    adv2 = torch.gather(returns, 1, out.chunk_pos)
    loss = cfg.pg_weight * policy_gradient_loss(bd2.logp, adv2, free2)
    # the rate over free chunk slots (as for stage 1); compute follows supertokens per chunk
    metrics["rate2"] = boundary_rate(bd2.b, free2).detach()
    metrics["expected_rate2"] = expected_rate(bd2.logits, free2)
    metrics["supertokens_per_chunk"] = (bd2.b.sum() / out.n_chunks.sum().clamp(min=1)).detach().float()
    return rate.add_stage2(loss, bd2, metrics, batch_mean)
