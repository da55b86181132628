"""Rate control: what holds the boundary rate, in one object (RateControl): the rate penalty
(objective.rate_control="penalty"), a price per chunk (ChunkPrice: the compute price and/or the
Lagrange multiplier of rate_control="lagrange"), the flips' price per boundary in credit units
(flip_rate_control), and the same for a two-stage model's supertoken policy."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rltok.config import ModelConfig, ObjectiveConfig
from rltok.objective.batch import PolicyBatch
from rltok.objective.controller import LagrangePrice, LossSlopePrice
from rltok.objective.policy_gradient import masked_mean, rate_loss

LN2 = math.log(2.0)


@dataclass
class ChunkPrice:
    """What the boundary policy pays per chunk, in nats: the compute one more chunk costs
    (a + c * chunks_per_byte, from the chunk-level network's FLOPs, times
    objective.compute_price), plus the Lagrange multiplier of the rate constraint when there is one."""
    compute: float = 0.0  # nats per chunk with no chunks
    compute_per_rate: float = 0.0  # its growth with chunks per byte (attention over more chunks)
    lagrange: LagrangePrice | None = None

    def __call__(self, chunks_per_byte: torch.Tensor) -> torch.Tensor:
        price = self.compute + self.compute_per_rate * chunks_per_byte.detach().float()
        return price + self.lagrange.price if self.lagrange is not None else price


def make_chunk_price(model_cfg: ModelConfig, cfg: ObjectiveConfig, seq_len: int, device=None,
                     cost=None) -> ChunkPrice | None:
    """The price the config asks for (None when chunks are free, as in the reference recipe).
    `cost`: the model's (rltok.model.flops.ModelCost), by default HourglassLM(model_cfg)'s."""
    lagrange = None
    if cfg.rate_control == "lagrange":
        lagrange = LagrangePrice(model_cfg.target_rate, cfg.lagrange_lr, cfg.lagrange_gain, device)
    if cfg.compute_price == 0 and lagrange is None:
        return None
    from rltok.model.flops import chunk_cost_flops

    a, c = cost.at(seq_len).chunk_cost() if cost is not None else chunk_cost_flops(model_cfg, seq_len)
    nats_per_flop = cfg.compute_price * LN2 / 1e6  # compute_price is in bits per MFLOP
    return ChunkPrice(a * nats_per_flop, c * nats_per_flop, lagrange)


class RateControl:
    """`prepare` (before the estimator: the chunk price, and with cost_estimator="reward" the
    price in the reward), `add` (after it: the price's closed-form term and the rate penalty),
    `add_stage2` (the supertoken policy's), `after_step` (the controllers' dual ascent)."""

    def __init__(self, cfg: ObjectiveConfig, target_rate: float, price: ChunkPrice | None = None,
                 target_rate2: float | None = None, price2: ChunkPrice | None = None,
                 flip_price: LagrangePrice | None = None):
        self.target_rate, self.target_rate2 = target_rate, target_rate2
        self.price, self.price2, self.flip_price = price, price2, flip_price
        self.penalty = cfg.rate_control == "penalty"
        self.cost_in_reward = cfg.cost_estimator == "reward"
        self.pg_weight, self.rate_weight = cfg.pg_weight, cfg.rate_weight

    @classmethod
    def from_config(cls, cfg, learned: bool, uses_flips: bool, device=None, cost=None) -> "RateControl":
        """A Config's rate control; `learned`: the RL policy (prices apply to it only); `cost`:
        what the model costs (its chunk price's), by default the config's model's."""
        m, o = cfg.model, cfg.objective
        price = make_chunk_price(m, o, cfg.train.seq_len, device, cost) if learned else None
        two_stage = learned and m.stages == 2
        price2 = None  # the supertoken policy's rate multiplier
        if two_stage and o.rate_control == "lagrange":
            price2 = ChunkPrice(lagrange=LagrangePrice(m.stage2_target_rate, o.lagrange_lr, o.lagrange_gain, device))
        # the flips' rate controller: a price in normalised credit units, by dual ascent
        flip_price = None
        if uses_flips and o.flip_rate_control:
            flip_price = LossSlopePrice(device=device) if o.rate_price == "loss_slope" else \
                LagrangePrice(m.target_rate, o.lagrange_lr, o.lagrange_gain, device)
        return cls(o, m.target_rate, price, m.stage2_target_rate if two_stage else None, price2, flip_price)

    def prepare(self, batch: PolicyBatch) -> None:
        bd = batch.bd
        batch.credit_price = self.flip_price
        if self.price is None:
            return
        # data parallel: the price grows with the global rate, the same on every rank
        batch.chunk_price = self.price(batch.reduce.masked_mean(bd.b.float(), torch.ones_like(bd.b)))
        if self.cost_in_reward:  # sampled cost, score-function gradient
            batch.reward = batch.reward - batch.chunk_price * (bd.b & bd.free).to(batch.reward.dtype)

    def add(self, loss: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
        bd = batch.bd
        if batch.chunk_price is not None:
            batch.metrics["chunk_price"] = batch.chunk_price.detach()
            if not self.cost_in_reward:
                # a chunk's cost depends on its own decision, E[price * b_t] = price * p_t: for
                # w = 1 the same expected gradient as the sampled cost in the reward, with no variance
                loss = loss + self.pg_weight * batch.chunk_price * masked_mean(torch.sigmoid(bd.logits.float()), bd.free)
        if self.penalty:
            # a data-parallel reduce also supplies the global mean boundary probability
            l_rate = rate_loss(bd.logits, bd.free, self.target_rate, mean=batch.reduce.masked_mean)
            loss = loss + self.rate_weight * l_rate
            batch.metrics["rate_loss"] = l_rate.detach()
        return loss

    def add_stage2(self, loss: torch.Tensor, bd2, metrics: dict, reduce) -> torch.Tensor:
        """The supertoken policy's price (always in closed form) and rate penalty."""
        free2 = bd2.free
        p2 = torch.sigmoid(bd2.logits.float())
        if self.price2 is not None:
            pr = self.price2(metrics["supertokens_per_chunk"])
            metrics["chunk_price2"] = pr.detach()
            loss = loss + self.pg_weight * pr * masked_mean(p2, free2)
        if self.penalty and self.target_rate2 is not None:
            l_rate2 = rate_loss(bd2.logits, free2, self.target_rate2, mean=reduce.masked_mean)
            metrics["rate_loss2"] = l_rate2.detach()
            loss = loss + self.rate_weight * l_rate2
        return loss

    def after_step(self, rates: dict) -> None:
        """One dual-ascent step of each controller from the step's global expected rates (only
        while the policy learns: a frozen policy cannot answer a price)."""
        if self.price is not None and self.price.lagrange is not None and rates["expected_rate"] is not None:
            self.price.lagrange.update(rates["expected_rate"])
        if isinstance(self.flip_price, LagrangePrice) and rates["expected_rate"] is not None:
            self.flip_price.update(rates["expected_rate"])
        if self.price2 is not None and rates["expected_rate2"] is not None:
            self.price2.lagrange.update(rates["expected_rate2"])

    def state_dict(self) -> dict:
        lagrange = self.price.lagrange if self.price is not None else None
        return {"lagrange": lagrange.state_dict() if lagrange is not None else None,
                "lagrange2": self.price2.lagrange.state_dict() if self.price2 is not None else None,
                "flip_price": self.flip_price.state_dict() if self.flip_price is not None else None}

    def load_state_dict(self, state: dict) -> None:
        if self.price is not None and self.price.lagrange is not None and state.get("lagrange"):
            self.price.lagrange.load_state_dict(state["lagrange"])
        if self.price2 is not None and state.get("lagrange2"):
            self.price2.lagrange.load_state_dict(state["lagrange2"])
        if self.flip_price is not None and state.get("flip_price") is not None:
            self.flip_price.load_state_dict(state["flip_price"])
