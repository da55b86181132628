"""A Lagrange multiplier that holds the expected boundary rate at a target.

The constraint E[rate] = target enters the policy's objective as a price per chunk, lambda. After
every step the price moves by dual ascent, lambda += lr * (rate - target): chunks get dearer
while the policy draws too many of them and cheaper (even subsidised) while it draws too few, so
the rate is held in expectation without a penalty weight to tune. A proportional term
gain * (rate - target) on top of the integral damps the overshoot of pure dual ascent.
"""

from __future__ import annotations

import math

import torch


class LagrangePrice:
    # bound on the integral (nats per chunk): a saturated policy barely responds to the price,
    # and an unbounded integral would then wind up and overshoot for a long time afterwards
    max_price = 10.0

    def __init__(self, target: float, lr: float, gain: float = 0.0, device=None):
        self.target, self.lr, self.gain = float(target), float(lr), float(gain)
        self.integral = torch.zeros((), device=device)  # the multiplier, nats per chunk
        self.error = torch.zeros((), device=device)  # the last rate error

    @property
    def price(self) -> torch.Tensor:
        return self.integral + self.gain * self.error

    def update(self, expected_rate: torch.Tensor | float) -> None:
        """One dual-ascent step from the step's expected rate (kept on the device: no sync)."""
        err = torch.as_tensor(expected_rate, dtype=torch.float32, device=self.integral.device).detach() - self.target
        self.error = err
        self.integral = (self.integral + self.lr * err).clamp(-self.max_price, self.max_price)

    def state_dict(self) -> dict:
        return {"integral": self.integral.cpu(), "error": self.error.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.integral = state["integral"].to(self.integral.device)
        self.error = state["error"].to(self.integral.device)


class LossSlopePrice:
    """A price per boundary read from the run itself (objective.estimator.price=loss_slope): what
    the compute one more boundary costs would buy as more data instead.

    At a fixed FLOPs budget F, a model that costs c(r) FLOPs per byte at rate r sees F / c(r)
    bytes, so raising the rate trades bytes for chunks. With the loss falling as
    dL/d ln F = -s (s: nats per byte per e-fold of compute, the run's recent slope), one more
    boundary in a window costs s * d ln c / d r nats of the window's loss by the end of training.
    `s` is a least-squares slope of the training loss against ln(FLOPs spent) over recent steps
    (exponentially weighted, `decay` per step), never below 0. The price is in nats, the unit of
    the credits it is set against (the LM's loss, and the lexicon's code length at weight 1)."""

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
        """One step: the step's mean training loss (nats per byte), the FLOPs spent after it, and
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
