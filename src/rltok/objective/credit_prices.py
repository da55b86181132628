"""The flips' price per boundary, inside their credit (objective.estimator.price): each is a
term with `price_credit(Credit) -> Credit`, which the flips estimator is given. A strong credit
(the lexicon's) overpowers a separate rate penalty, so the rate is held in the credit itself."""

from __future__ import annotations

from rltok.objective.controller import LagrangePrice
from rltok.objective.flips_estimator import Credit
from rltok.objective.rate import PriceTerm, RateSettings
from rltok.objective.terms import StepEnd


class CreditPrice(PriceTerm):
    """A price whose state is a controller with `.price` (what `flip_price` names in the objective's state)."""
    controller = None

    def __call__(self, stage):
        return None, {"flip_price": self.controller.price.detach()}

    def state_dict(self) -> dict:
        return {"flip_price": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("flip_price") is not None:
            self.controller.load_state_dict(state["flip_price"])


class TargetCreditPrice(CreditPrice):
    """objective.estimator.price=target: a price in normalised credit units, raised by dual ascent
    while the expected rate is above model.target_rate."""

    def __init__(self, settings: RateSettings):
        self.controller = LagrangePrice(settings.target, settings.lr, settings.gain, settings.device)

    def price_credit(self, credit: Credit) -> Credit:
        return Credit(credit.values, credit.flips, credit.center, self.controller.price)

    def after_step(self, end: StepEnd) -> None:
        if end.rates["expected_rate"] is not None:
            self.controller.update(end.rates["expected_rate"])
