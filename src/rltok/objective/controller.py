"""A Lagrange multiplier that holds the expected boundary rate at a target: a price per chunk moved
by dual ascent plus a proportional term (docs/CONFIG.md, "The objective")."""

from __future__ import annotations

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
