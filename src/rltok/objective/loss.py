"""The training objective: an ordered list of terms built once (build.py) and added up by
`compute_loss`, which never branches on which estimator, reward or rate control runs
(docs/ARCHITECTURE.md, "One training step"); `BoundaryObjective` is what the trainer holds."""

from __future__ import annotations

import torch

from rltok.model.chunkers import learned_rules
from rltok.model.output import ModelOutput, token_nll
from rltok.objective.batch import LOCAL, Counterfactual, LocalMean, MicroBatch, boundary_rate
from rltok.objective.build import build_lexicon, build_objective, make_chunk_price, returns_of, terms_of_objective
from rltok.objective.flips_estimator import Flips
from rltok.objective.lm_terms import frozen_policy_metrics, policy_metrics
from rltok.objective.rate import ChunkPrice, Stage
from rltok.objective.score_function import boundary_advantages
from rltok.objective.terms import ObjectiveTerms, StepEnd, Total

# the names other layers, the lab and tests import from here
__all__ = ["BoundaryObjective", "ChunkPrice", "Flips", "LocalMean", "boundary_advantages", "boundary_rate",
           "build_lexicon", "compute_loss", "make_chunk_price", "returns_of", "token_nll"]


def compute_loss(out: ModelOutput, targets: torch.Tensor, terms, target_rate: float | None = None,
                 batch_mean: LocalMean | None = None, counterfactual: Counterfactual | None = None,
                 policy_on: bool = True, price: ChunkPrice | None = None, target_rate2: float | None = None,
                 settled: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss and detached metrics: the sum of `terms` (ObjectiveTerms; an ObjectiveConfig means
    build.terms_of_objective's). `batch_mean`: the batch-statistics protocol (data parallel: a global
    one). `policy_on=False` (the warm start, or `settled`: objective.policy_until): no policy, rate or
    price term, the policy is left alone."""
    if not isinstance(terms, ObjectiveTerms):  # a bare ObjectiveConfig; a plain LM has no early exit
        terms = terms_of_objective(terms, target_rate, out.hierarchical, price, target_rate2)
    mb, total = MicroBatch.of(out, targets, counterfactual, LOCAL if batch_mean is None else batch_mean), Total()
    for term in terms.lm:  # the LM loss, the early exit, the rule's own loss
        total.add(*term(mb))
    policy = terms.policy if mb.learns_boundaries else None
    if policy is not None and not policy_on:
        total.add(None, frozen_policy_metrics(mb, settled))
    elif policy is not None:
        reward, stage = policy.estimator.reward(mb), Stage.first(mb)
        for price_term in policy.prices:  # a price in the reward reaches the estimator through it
            reward, metrics = price_term.shape_reward(stage, reward)
            total.add(None, metrics)
        loss, metrics, returns = policy.estimator(mb, reward)
        total.add(loss, metrics)
        for price_term in policy.prices:
            total.add(*price_term(stage))
        for term in policy.stage2:  # a supertoken policy, credited with the estimator's returns
            total.add(*term(mb, returns))
        total.add(None, policy_metrics(mb))
    total.metrics["loss"] = total.loss.detach()
    return total.loss, total.metrics


@torch.no_grad()
def rate_keeping_cut(model, x: torch.Tensor, hold: float | None = None) -> tuple[float, float]:
    """(cut, held): the logit quantile above which the byte-level rule's thresholded cuts on the
    windows x (N, T) make `hold` chunks per byte (None: the rate its policy draws there)."""
    was_training = model.training
    model.eval()
    try:
        bd = model(x, generator=torch.Generator(device=x.device).manual_seed(0), encoder_only=True).boundaries
    finally:
        model.train(was_training)
    logits = bd.logits[bd.free].float()
    if logits.numel() == 0:
        return 0.0, 0.0
    forced = float((~bd.free).sum())
    if hold is None:
        hold = (forced + float(torch.sigmoid(logits).sum())) / bd.free.numel()
    share = min(1.0, max(0.0, (hold * bd.free.numel() - forced) / logits.numel()))
    return float(torch.quantile(logits, 1 - share)), float(hold)


class BoundaryObjective:
    """The boundary decisions' part of training: the terms (and their state), the flips' random
    stream, the warm start and the meter of training FLOPs spent. The trainer calls
    `counterfactual` and `loss` per micro-batch and `after_step` per optimiser step. `reduce`: the
    batch-statistics protocol; `cost`: what the model costs (rltok.model.flops.ModelCost)."""

    def __init__(self, cfg, cost, device=None, reduce: LocalMean | None = None):
        self.cfg = cfg  # for the FLOPs counts
        self.reduce = reduce or LOCAL
        self.cost = cost
        built = build_objective(cfg, device, cost_slope=self.cost_slope, cost=self.cost)
        self.terms, self.schedule, self.named = built.terms, built.schedule, built.named
        self.learned = self.terms.policy is not None  # a boundary rule trained by an estimator
        self.flip_gen = torch.Generator().manual_seed(self.schedule.flip_seed)  # which decisions get flipped
        self.flops_spent = 0.0  # training FLOPs, each step counted at the chunks it drew
        self.settled = False  # the policy has settled (objective.policy_until): it learns no more
        self._rules = None  # the model's learned rules, found on the first step
        self.drawn_rate = None  # chunks per byte the learning policy drew (an average over steps): what settling holds

    # the pieces tests and tools inspect, under the names older callers use
    price = property(lambda self: self.named.get("price"))
    flip_price = property(lambda self: self.named.get("flip_price"))
    lexicon = property(lambda self: self.named.get("lexicon"))
    estimator = property(lambda self: self.terms.policy.estimator if self.learned else None)

    def tokenizer_phase(self, step_bytes: int, seq_len: int) -> bool:
        """Whether the next step belongs to the tokenizer phase (objective.tokenizer_phase): the
        encoder, the early-exit head and the rule alone, until that share of the compute is spent."""
        share = self.schedule.tokenizer_phase
        if not (self.schedule.has_encoder_phase and share > 0):
            return False
        return self.flops_spent < share * self.planned_flops(step_bytes, seq_len)

    def planned_flops(self, step_bytes: int, seq_len: int) -> float:
        """The run's training compute: train.flops_budget, or (without one) what train.max_steps
        full steps cost at the target rate."""
        tc = self.cfg.train
        if tc.flops_budget > 0:
            return tc.flops_budget
        return tc.max_steps * step_bytes * self.cost.at(seq_len).step_train_per_byte()

    def policy_on(self, step: int) -> bool:
        """False during the warm start (objective.policy_start_step) and once the policy settled."""
        return step >= self.schedule.policy_start_step and not self.settled

    def begin_step(self, model, step: int, step_bytes: int, seq_len: int, windows=None) -> bool:
        """At each step's start: once objective.policy_until of the compute is spent (by the FLOPs
        meter, so a resume settles at the same step), settle the learned rules for good (with
        settle_threshold=rate the byte rule's cut keeps the rate it drew on `windows()`), and tell
        each rule whether it is trained this step. True when a rule settled now."""
        if self._rules is None:  # the model's learned rules: its modules do not change after building
            self._rules = [rule for _, rule in learned_rules(model)]
        rules, newly = self._rules, False
        until = self.schedule.policy_until
        # sticky: a rule that settled stays settled (a resume that moved the budget or the share
        # would otherwise run the policy's terms beside a rule that no longer learns)
        due = until < 1 and self.flops_spent >= until * self.planned_flops(step_bytes, seq_len)
        if self.learned and (due or any(rule.is_settled for rule in rules)):
            if not any(rule.is_settled for rule in rules) and step <= self.schedule.policy_start_step:
                # policy_until is a share of compute, policy_start_step a step count: they can cross
                raise ValueError(
                    f"objective.policy_until={until} is reached at step {step}, before the policy learned "
                    f"a step (objective.policy_start_step={self.schedule.policy_start_step}): the rule "
                    f"would settle untrained. Raise policy_until or lower policy_start_step.")
            self.settled = True
            fresh = [rule for rule in rules if not rule.is_settled]
            newly = bool(fresh)
            for rule in fresh:
                keep_rate = self.schedule.settle_threshold == "rate" and windows is not None and rule is model.chunker
                rule.settle(*(rate_keeping_cut(model, windows(), self.drawn_rate) if keep_rate else (0.0, 0.0)))
        for rule in rules:
            rule.learns = self.policy_on(step) or self.tokenizer_phase(step_bytes, seq_len)
        return newly

    def counterfactual(self, model, idx: torch.Tensor, targets: torch.Tensor, out: ModelOutput,
                       step: int) -> Counterfactual | None:
        """The extra pass the estimator learns from (None when it needs none)."""
        if not self.learned:
            return None
        cf = None
        if self.policy_on(step):
            cf = self.estimator.counterfactual(model, idx, targets, out, self.flip_gen)
        self.estimator.observe(idx, out)
        return cf

    def loss(self, out: ModelOutput, targets: torch.Tensor, step: int,
             counterfactual: Counterfactual | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return compute_loss(out, targets, self.terms, batch_mean=self.reduce, counterfactual=counterfactual,
                            policy_on=self.policy_on(step), settled=self.settled)

    RATE_KEYS = ("expected_rate", "chunks_per_byte", "expected_rate2", "supertokens_per_chunk", "ce_final")

    def after_step(self, step: int, rates: dict[str, float | None], step_bytes: int, seq_len: int) -> None:
        """Add the step's training FLOPs to the meter, then feed the step's global rates
        (RATE_KEYS; None where the model has none) to every term (rate controllers, prices).
        `step` is the index of the step just taken."""
        phase = self.tokenizer_phase(step_bytes, seq_len)  # decided as at the step's start: nothing counted yet
        on = phase or self.policy_on(step)
        if phase:
            self.flops_spent += self.cost.tokenizer_phase_per_byte() * step_bytes
        else:
            # a probe's credit is a function of the decisions alone: no model pass is run or charged
            model_pass = self.learned and on and self.estimator.model_pass
            self.flops_spent += self.cost.at(seq_len).step_train_per_byte(
                rates["chunks_per_byte"], rates["supertokens_per_chunk"], counterfactual=model_pass) * step_bytes
        drawn = rates.get("chunks_per_byte")
        if self.settled and drawn is not None:  # a settled rule holding its rate
            for rule in self._rules or []:
                rule.follow_rate(drawn)
        elif self.learned and drawn is not None and self.policy_on(step) and not phase:
            # the global rate (the same on every rank), averaged over the last ~10 steps
            self.drawn_rate = drawn if self.drawn_rate is None else 0.9 * self.drawn_rate + 0.1 * drawn
        if on:  # a frozen (warm-start) policy cannot answer a price
            end = StepEnd(rates, self.flops_spent, phase_ended=phase and not self.tokenizer_phase(step_bytes, seq_len))
            for term in self.terms.all():
                term.after_step(end)

    def cost_slope(self, rate: float | None) -> float:
        """d ln(training FLOPs per byte) / d rate at `rate`: what one more boundary per byte costs,
        relative to what a byte costs (ModelCost.cost_slope)."""
        return self.cost.cost_slope(self.cfg.model.target_rate if rate is None else rate)

    def state_dict(self) -> dict:
        """The meter, the flips' stream and every term's own keys (lagrange, lagrange2, lexicon, flip_price)."""
        state = {"flops_spent": self.flops_spent, "flip_gen": self.flip_gen.get_state()}
        if self.drawn_rate is not None:
            state["drawn_rate"] = self.drawn_rate
        for term in self.terms.all():
            state.update(term.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Also reads the keys older trainer states kept at their top level."""
        self.flops_spent = state.get("flops_spent", 0.0)
        self.drawn_rate = state.get("drawn_rate")
        if state.get("flip_gen") is not None:
            self.flip_gen.set_state(state["flip_gen"])
        for term in self.terms.all():
            term.load_state_dict(state)
