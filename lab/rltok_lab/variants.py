"""The studies' own variants of rltok's components, registered as a plugin (entry point
`rltok.plugins`; or `--plugin rltok_lab.variants`), so old run folders and configs naming them
still load:

- `model.chunker=teacher`: another trained hierarchy's rule, frozen and greedy (the frozen-cuts
  diagnostic of the scaling study);
- `objective.reward=whitespace_probe` / `token_probe`: synthetic rewards that check the estimator
  path learns at all;
- `objective.estimator.price=loss_slope`: a price per boundary read from the run's own loss slope;
- `objective.rate.cost_estimator=reward`: a chunk price charged in the sampled reward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from rltok.config import CHUNKERS, COST_ESTIMATORS, CREDIT_PRICES, REWARDS, ConfigError, Section
from rltok.data.bytes_classes import is_whitespace_byte
from rltok.model.chunkers import Boundaries, Chunker
from rltok.objective.flips_estimator import Credit
from rltok.objective.credit_prices import CreditPrice
from rltok.objective.rate import ClosedFormChunkPrice, RateSettings, Stage
from rltok.objective.rewards import Reward
from rltok.objective.terms import StepEnd


# ---- model.chunker=teacher ----------------------------------------------------------------------

@dataclass
class TeacherChunkerSettings(Section):
    """Another trained hierarchy's rule, frozen and greedy (TeacherChunker)."""
    kind: str = "teacher"
    checkpoint: str = ""  # its model folder or training checkpoint (required when the rule is built)


class TeacherChunker(Chunker):
    """Another trained hierarchy's byte-level rule, frozen and greedy: the boundaries a finished
    run's rule settled on, given from the first step to a model trained from scratch. It separates
    where a learned rule cuts from what learning to cut costs its language model. The teacher is
    loaded on first use and kept outside this module's parameters and state, so nothing trains it,
    the student's checkpoints do not hold it and its FLOPs are not charged. Windows only."""

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(settings.checkpoint)

    def __init__(self, checkpoint: str):
        super().__init__()
        if not checkpoint:
            raise ConfigError("model.chunker=teacher needs model.chunker.checkpoint: the teacher's model folder or "
                              "training checkpoint")
        if not Path(checkpoint).expanduser().exists():
            raise ConfigError(f"model.chunker.checkpoint: no model folder or checkpoint at {checkpoint}")
        self.checkpoint = checkpoint
        self._teacher = []  # in a list: not a submodule (no parameters, state or FLOPs of this rule)

    def teacher(self, device) -> nn.Module:
        """The teacher model, loaded on first use (a model built on the meta device reads no weights)."""
        if not self._teacher:
            from rltok.model.hourglass import HourglassLM

            self._teacher.append(HourglassLM.from_pretrained(self.checkpoint).eval().requires_grad_(False))
        return self._teacher[0].to(device)

    def forward(self, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        if b is None:
            with torch.no_grad():
                b = self.teacher(idx.device)(idx, encoder_only=True, mode="greedy", force_last=False).boundaries.b
        return Boundaries(b=b.bool() | forced, free=~forced)


# ---- objective.reward: the probes ---------------------------------------------------------------

class WhitespaceProbe(Reward):
    """+1 for a boundary on a wanted byte (here: whitespace), -1 for one anywhere else, 0 without
    a boundary. Byte t is targets[t - 1] (position 0 is forced)."""
    name = "whitespace_probe"
    probe = True

    def sign(self, targets: torch.Tensor) -> torch.Tensor:
        """Per position, what a boundary there earns: a function of the bytes alone."""
        return is_whitespace_byte(targets.roll(1, dims=1)).float() * 2 - 1

    def __call__(self, ce_early, ce_final, b, targets):
        return b.float() * self.sign(targets)


class TokenProbe(WhitespaceProbe):
    """Wanted: the first byte of a Python lexical unit (rltok.data.python_tokens), read one byte
    late; 0 at byte 1, whose predecessor the targets do not hold. Lexed per row on the host."""
    name = "token_probe"

    def sign(self, targets: torch.Tensor) -> torch.Tensor:
        from rltok.data.python_tokens import token_ends

        seen = targets[:, :-1].cpu()  # bytes 1 .. T-1
        ends = torch.stack([token_ends(bytes(row.tolist())) for row in seen]).to(targets.device)
        sign = torch.zeros(targets.shape, device=targets.device)
        sign[:, 2:] = ends[:, :-1].float() * 2 - 1  # byte t starts a unit when byte t - 1 ends one
        return sign


# ---- objective.estimator.price=loss_slope -------------------------------------------------------

class LossSlopePrice:
    """A price per boundary read from the run itself: what the compute one more boundary costs
    would buy as more data instead.

    At a fixed FLOPs budget F, a model that costs c(r) FLOPs per byte at rate r sees F / c(r)
    bytes. With the loss falling as dL/d ln F = -s (the run's recent slope), one more boundary
    costs s * d ln c / d r nats. `s` is a least-squares slope of the training loss against
    ln(FLOPs spent), exponentially weighted (`decay` per step), never below 0."""

    def __init__(self, decay: float = 0.98, device=None):
        self.decay = float(decay)
        self.sums = torch.zeros(5, dtype=torch.float64, device=device)  # w, x, y, xx, xy
        self.cost_slope = torch.zeros((), device=device)  # d ln c / d r at the last step's rate
        self.price = torch.zeros((), device=device)  # nats per boundary

    @property
    def slope(self) -> torch.Tensor:
        w, x, y, xx, xy = self.sums
        var = xx / w.clamp(min=1e-12) - (x / w.clamp(min=1e-12)) ** 2
        cov = xy / w.clamp(min=1e-12) - x * y / w.clamp(min=1e-12) ** 2
        s = torch.where(var > 1e-12, -cov / var.clamp(min=1e-12), torch.zeros_like(var))
        return s.clamp(min=0.0).float()

    def update(self, loss: float, flops_spent: float, cost_slope: float) -> None:
        """One step: its mean training loss (nats per byte), the FLOPs spent after it, and
        d ln c / d r at the rate it drew."""
        if flops_spent <= 0 or not math.isfinite(loss):
            return
        x = math.log(flops_spent)
        point = torch.tensor([1.0, x, loss, x * x, x * loss], dtype=torch.float64, device=self.sums.device)
        self.sums = self.decay * self.sums + point
        self.cost_slope = torch.as_tensor(cost_slope, dtype=torch.float32, device=self.price.device)
        self.price = self.slope * self.cost_slope

    def restart(self) -> None:
        """Forget the loss history (the loss changed meaning: the tokenizer phase ended)."""
        self.sums = torch.zeros_like(self.sums)

    def state_dict(self) -> dict:
        return {"sums": self.sums.cpu(), "cost_slope": self.cost_slope.cpu(), "price": self.price.cpu()}

    def load_state_dict(self, state: dict) -> None:
        dev = self.price.device
        self.sums, self.cost_slope, self.price = (state[k].to(dev) for k in ("sums", "cost_slope", "price"))


class LossSlopeCreditPrice(CreditPrice):
    """objective.estimator.price=loss_slope: LossSlopePrice set against the credits as they are
    (not centred), so the rate is where the credit of one more boundary meets its price."""

    def __init__(self, settings: RateSettings):
        self.controller = LossSlopePrice(device=settings.device)
        self.cost_slope = settings.cost_slope

    def price_credit(self, credit: Credit) -> Credit:
        values = torch.where(credit.flips, credit.values - self.controller.price, credit.values)
        return Credit(values, credit.flips, center=False)

    def after_step(self, end: StepEnd) -> None:
        if end.phase_ended:
            self.controller.restart()  # the full model's loss from the next step on
        else:
            slope = self.cost_slope(end.rates["chunks_per_byte"])
            self.controller.update(end.rates["ce_final"], end.flops_spent, slope)


# ---- objective.rate.cost_estimator=reward -------------------------------------------------------

class ChunkPriceInReward(ClosedFormChunkPrice):
    """The chunk price subtracted from the sampled reward at each boundary the rule drew (a
    sampled cost, estimated by the score function) instead of charged in closed form."""

    def shape_reward(self, stage: Stage, reward: torch.Tensor) -> tuple[torch.Tensor, dict]:
        price, bd = self.price(stage.density()), stage.bd
        return reward - price * (bd.b & bd.free).to(reward.dtype), {f"chunk_price{stage.suffix}": price.detach()}

    def __call__(self, stage: Stage):
        return None, {}


CHUNKERS.register("teacher", TeacherChunker, settings=TeacherChunkerSettings)
REWARDS.register("whitespace_probe", WhitespaceProbe)
REWARDS.register("token_probe", TokenProbe)
CREDIT_PRICES.register("loss_slope", LossSlopeCreditPrice)
COST_ESTIMATORS.register("reward", ChunkPriceInReward)
