"""The terms that hold a boundary rate, each one stage's (`Stage`): the price per chunk (ChunkPrice,
charged in closed form) and the rate controls of the RATES registry (docs/CONFIG.md, "The rate")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rltok.objective.batch import LocalMean, MicroBatch
from rltok.objective.controller import LagrangePrice
from rltok.objective.policy_gradient import LN2, masked_mean, rate_loss
from rltok.objective.terms import StepEnd, Term


@dataclass(frozen=True)
class Stage:
    """One stage's boundary decisions as the price terms see them."""
    bd: object  # model.chunkers.Boundaries, with the policy's logits
    reduce: LocalMean
    density: Callable[[], torch.Tensor]  # what the chunk price grows with (units per byte or per chunk)
    suffix: str = ""  # of its metric names: "" for chunks, "2" for supertokens

    @classmethod
    def first(cls, mb: MicroBatch) -> "Stage":
        bd = mb.bd
        # data parallel: the price grows with the global rate, the same on every rank
        return cls(bd, mb.reduce, lambda: mb.reduce.masked_mean(bd.b.float(), torch.ones_like(bd.b)))


class PriceTerm(Term):
    """A term on a stage's rate. `shape_reward` may change the reward before the estimator sees
    it; `__call__(stage)` returns its own (loss, metrics), added after the estimator's. A rate
    control's `multiplier` (a price per chunk with `.price`, or None) joins the chunk price."""
    multiplier = None

    def shape_reward(self, stage: Stage, reward: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return reward, {}

    def __call__(self, stage: Stage):
        return None, {}


@dataclass
class ChunkPrice:
    """What the boundary policy pays per chunk, in nats: the compute one more chunk costs
    (a + c * chunks_per_byte, from the chunk-level network's FLOPs, times
    objective.rate.compute_price), plus the Lagrange multiplier of the rate constraint when there is one."""
    compute: float = 0.0  # nats per chunk with no chunks
    compute_per_rate: float = 0.0  # its growth with chunks per byte (attention over more chunks)
    lagrange: LagrangePrice | None = None

    def __call__(self, chunks_per_byte: torch.Tensor) -> torch.Tensor:
        price = self.compute + self.compute_per_rate * chunks_per_byte.detach().float()
        return price + self.lagrange.price if self.lagrange is not None else price


def compute_price(a: float, c: float, bits_per_mflop: float, multiplier=None) -> ChunkPrice:
    """A chunk price from the chunk-level network's FLOPs per chunk (a + c * rate) at
    `bits_per_mflop`, plus a rate control's multiplier."""
    nats_per_flop = bits_per_mflop * LN2 / 1e6
    return ChunkPrice(a * nats_per_flop, c * nats_per_flop, multiplier)


class ClosedFormChunkPrice(PriceTerm):
    """objective.rate.cost_estimator=exact: a chunk's cost depends on its own decision,
    E[price * b_t] = price * p_t: for policy_window = 1 the same expected gradient as the sampled
    cost in the reward, with no variance."""

    def __init__(self, price: ChunkPrice, pg_weight: float):
        self.price, self.pg_weight = price, pg_weight

    def __call__(self, stage: Stage):
        price, bd = self.price(stage.density()), stage.bd
        loss = self.pg_weight * price * masked_mean(torch.sigmoid(bd.logits.float()), bd.free)
        return loss, {f"chunk_price{stage.suffix}": price.detach()}


@dataclass(frozen=True)
class RateSettings:
    """One stage's rate-control settings, plain values (build.py reads them from the config)."""
    target: float  # boundaries per free decision
    weight: float = 0.01  # the rate penalty's
    lr: float = 0.2  # dual ascent: nats per chunk, per unit of rate error, per step
    gain: float = 5.0  # proportional term of the multiplier
    stage: int = 1  # 1: chunks, 2: a two-stage model's supertokens
    device: object = None
    cost_slope: Callable | None = None  # d ln(FLOPs per byte) / d rate at a rate (loss-slope price)

    @property
    def suffix(self) -> str:
        """Of its metrics' and state's names: "" for stage 1, "2" for stage 2."""
        return "" if self.stage == 1 else str(self.stage)


class RatePenalty(PriceTerm):
    """objective.rate=penalty: the reference's rate loss towards the target."""

    def __init__(self, settings: RateSettings):
        self.target, self.weight = settings.target, settings.weight

    def __call__(self, stage: Stage):
        # a data-parallel reduce also supplies the global mean boundary probability
        l_rate = rate_loss(stage.bd.logits, stage.bd.free, self.target, mean=stage.reduce.masked_mean)
        return self.weight * l_rate, {f"rate_loss{stage.suffix}": l_rate.detach()}


class LagrangeRate(PriceTerm):
    """objective.rate=lagrange: a price per chunk (the multiplier) raised by dual ascent
    while the expected rate is above the target; charged through the stage's chunk price."""

    def __init__(self, settings: RateSettings):
        self.multiplier = LagrangePrice(settings.target, settings.lr, settings.gain, settings.device)
        self.key, self.rate_key = f"lagrange{settings.suffix}", f"expected_rate{settings.suffix}"

    def after_step(self, end: StepEnd) -> None:
        if end.rates[self.rate_key] is not None:
            self.multiplier.update(end.rates[self.rate_key])

    def state_dict(self) -> dict:
        return {self.key: self.multiplier.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get(self.key):
            self.multiplier.load_state_dict(state[self.key])


class NoRateControl(PriceTerm):
    """objective.rate=none: the rate is what the loss (and any compute price) settle on."""

    def __init__(self, settings: RateSettings):
        pass
