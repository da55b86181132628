"""The objective as an ordered list of terms (ObjectiveTerms), what a term is (Term; docs/ARCHITECTURE.md,
"Where to add things") and the running sum they are added into (Total), in a fixed order so the
sum is the same bit for bit."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class StepEnd:
    """What a term may learn from at the end of an optimiser step: the step's global rates
    (BoundaryObjective.RATE_KEYS; None where the model has none), the training FLOPs spent after
    it, and whether the tokenizer phase ended with it (the loss changed meaning)."""
    rates: dict
    flops_spent: float
    phase_ended: bool = False


class Term:
    """The default of every hook: no loss, no metrics, no state."""

    def after_step(self, end: StepEnd) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Total:
    """The running sum of the terms' losses, in the order they are added, and their metrics."""

    def __init__(self):
        self.loss: torch.Tensor | None = None
        self.metrics: dict[str, torch.Tensor] = {}

    def add(self, loss, metrics: dict | None = None) -> None:
        for part in (loss if isinstance(loss, (list, tuple)) else [loss]):
            if part is not None:
                self.loss = part if self.loss is None else self.loss + part
        self.metrics.update(metrics or {})


@dataclass
class PolicyTerms:
    """The boundary policy's terms, in order: its estimator (which brings the reward), each price
    or penalty on its rate (a price may first reshape the reward the estimator is given), and a
    two-stage model's supertoken terms (given the estimator's returns)."""
    estimator: object  # estimator.BoundaryEstimator
    prices: list = field(default_factory=list)
    stage2: list = field(default_factory=list)

    def all(self) -> list:
        return [self.estimator, *self.prices, *self.stage2]


@dataclass
class ObjectiveTerms:
    """`lm`: the terms every micro-batch adds (LM loss, early exit, the rule's own loss);
    `policy`: a learned boundary rule's (None: the rule, if any, learns from `lm` alone)."""
    lm: list
    policy: PolicyTerms | None = None

    def all(self) -> list:
        return [*self.lm, *(self.policy.all() if self.policy is not None else [])]
