"""A two-stage model's supertoken terms: its policy's gradient and the prices on its rate."""

from __future__ import annotations

import torch

from rltok.objective.batch import MicroBatch, boundary_rate, expected_rate
from rltok.objective.policy_gradient import policy_gradient_loss
from rltok.objective.rate import Stage
from rltok.objective.terms import StepEnd, Term


class Supertokens(Term):
    """Policy-gradient, price and rate terms of the supertoken policy. Its decision at chunk j first
    changes the prediction at chunk j's last byte, so it is credited with the stage-1 `returns`
    from that byte on. `prices`: its stage's price terms, in order. Under data parallelism the
    means over chunks are per rank, except the rate loss' mean probability."""

    def __init__(self, pg_weight: float, prices: list):
        self.pg_weight, self.prices = pg_weight, prices

    def __call__(self, mb: MicroBatch, returns: torch.Tensor | None):
        bd2 = mb.out.boundaries2
        if bd2 is None or bd2.logits is None:  # no supertoken policy drew this batch's chunk level
            return None, {}
        if returns is None:
            raise ValueError("the supertoken policy is credited with the estimator's returns: use the score function")
        out = mb.out
        loss = self.pg_weight * policy_gradient_loss(bd2.logp, torch.gather(returns, 1, out.chunk_pos), bd2.free)
        # the rate over free chunk slots (as for stage 1); compute follows supertokens per chunk
        per_chunk = (bd2.b.sum() / out.n_chunks.sum().clamp(min=1)).detach().float()
        metrics = {"rate2": boundary_rate(bd2.b, bd2.free).detach(),
                   "expected_rate2": expected_rate(bd2.logits, bd2.free), "supertokens_per_chunk": per_chunk}
        stage = Stage(bd2, mb.reduce, lambda: per_chunk, suffix="2")
        for price in self.prices:
            part, m = price(stage)
            metrics.update(m)
            loss = loss if part is None else loss + part
        return loss, metrics

    def after_step(self, end: StepEnd) -> None:
        for price in self.prices:
            price.after_step(end)

    def state_dict(self) -> dict:
        return {k: v for price in self.prices for k, v in price.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        for price in self.prices:
            price.load_state_dict(state)
