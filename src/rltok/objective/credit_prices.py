"""The flips' price per boundary, inside their credit (objective.estimator.price): each is a
term with `price_credit(Credit) -> Credit`, which the flips estimator is given. A strong credit
(the lexicon's) overpowers a separate rate penalty, so the rate is held in the credit itself."""

from __future__ import annotations

import torch

from rltok.objective.controller import LagrangePrice, LossSlopePrice
from rltok.objective.flips_estimator import Credit
from rltok.objective.rate import PriceTerm, RateSettings
from rltok.objective.terms import StepEnd


class _CreditPrice(PriceTerm):
    controller = None  # the price's own state (what `flip_price` names in the objective's state)

    def __call__(self, stage):
        return None, {"flip_price": self.controller.price.detach()}

    def state_dict(self) -> dict:
        return {"flip_price": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("flip_price") is not None:
            self.controller.load_state_dict(state["flip_price"])


class TargetCreditPrice(_CreditPrice):
    """objective.estimator.price=target: a price in normalised credit units, raised by dual ascent
    while the expected rate is above model.target_rate."""

    def __init__(self, settings: RateSettings):
        self.controller = LagrangePrice(settings.target, settings.lr, settings.gain, settings.device)

    def price_credit(self, credit: Credit) -> Credit:
        return Credit(credit.values, credit.flips, credit.center, self.controller.price)

    def after_step(self, end: StepEnd) -> None:
        if end.rates["expected_rate"] is not None:
            self.controller.update(end.rates["expected_rate"])


class LossSlopeCreditPrice(_CreditPrice):
    """objective.estimator.price=loss_slope: a price in nats per boundary read from the run (what the
    compute one more boundary costs would buy as more data; controller.LossSlopePrice), set
    against the credits as they are: not centred, so the rate is where the credit of one more
    boundary meets its price. `settings.cost_slope(rate)`: d ln(FLOPs per byte) / d rate."""

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
