"""The one place the objective is read from the config: the registries (one entry per kind) and
the functions that turn a config into the list of terms (build_objective) and, for tests and
tools holding a bare ObjectiveConfig, into the same terms without a trainer (terms_of_objective).

Adding an estimator, a reward or a rate control is one class and one entry here: an estimator is
built as `cls(reward, EstimatorSettings, lexicon, credit_price)`, a reward as `cls()`, a rate
control as `cls(RateSettings)` (a rate.PriceTerm; its `multiplier`, if any, joins the chunk price).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rltok.config import ObjectiveConfig
from rltok.objective.credit_prices import LossSlopeCreditPrice, TargetCreditPrice
from rltok.objective.estimator import BoundaryEstimator, EstimatorSettings
from rltok.objective.flips_estimator import Flips
from rltok.objective.lm_terms import BoundaryRule, EarlyExitCE, FinalCE, PlainLM
from rltok.objective.rate import (ChunkPrice, ChunkPriceInReward, ClosedFormChunkPrice, LagrangeRate, NoRateControl,
                                  RatePenalty, RateSettings, compute_price)
from rltok.objective.rewards import REWARDS, make_reward  # noqa: F401  (REWARDS: the reward registry)
from rltok.objective.score_function import Returns, ScoreFunction
from rltok.objective.supertokens import Supertokens
from rltok.objective.terms import ObjectiveTerms, PolicyTerms

# objective.estimator -> class
ESTIMATORS: dict[str, type[BoundaryEstimator]] = {e.name: e for e in (ScoreFunction, Flips)}
# objective.rate_control -> class (one stage's: built once per stage)
RATE_CONTROLS: dict[str, type] = {"penalty": RatePenalty, "lagrange": LagrangeRate, "none": NoRateControl}
# objective.cost_estimator -> how a chunk price reaches the policy
COST_ESTIMATORS: dict[str, type] = {"exact": ClosedFormChunkPrice, "reward": ChunkPriceInReward}
# objective.rate_price -> the flips' price per boundary in their credit (objective.flip_rate_control)
CREDIT_PRICES: dict[str, type] = {"target": TargetCreditPrice, "loss_slope": LossSlopeCreditPrice}
# model.arch -> whether the model has a boundary rule and an early exit (the hierarchical LM)
HIERARCHICAL: dict[str, bool] = {"hourglass": True, "flat": False, "bpe_token": False}
# model.chunker kinds trained by the boundary policy's estimator
LEARNED_RULES = frozenset({"rl"})

LEXICON_CONCENTRATION = 100.0  # the Dirichlet process' weight of the base model (never tuned)


@dataclass(frozen=True)
class Schedule:
    """What the objective container needs of the config beside its terms."""
    policy_start_step: int = 0  # the warm start: the policy is left alone before this step
    tokenizer_phase: float = 0.0  # the share of the training compute spent in the tokenizer phase
    has_encoder_phase: bool = False  # whether the model has an encoder-only phase (the hierarchical LM)
    flops_budget: float = 0.0
    max_steps: int = 0
    flip_seed: int = 2  # the flips' random stream


@dataclass
class BuiltObjective:
    terms: ObjectiveTerms
    schedule: Schedule
    # the pieces tests and tools inspect, by the names older callers use (price, price2,
    # flip_price: the controllers; lexicon; target_rate2)
    named: dict = field(default_factory=dict)


def returns_of(o: ObjectiveConfig) -> Returns:
    """The score function's returns settings of an objective config."""
    parts = o.baseline_parts()
    return Returns(batch_baseline="batch" in parts, group_size=o.group_size, group_baseline="group" in parts,
                   critic="value" in parts, gamma=o.gamma, gae_lambda=o.gae_lambda, normalize=o.normalize_advantages)


def estimator_settings(o: ObjectiveConfig) -> EstimatorSettings:
    return EstimatorSettings(o.pg_weight, returns_of(o), o.flip_stride, o.flip_model_pass, o.lexicon_weight)


def rate_settings(o: ObjectiveConfig, target: float, stage: int = 1, device=None, cost_slope=None) -> RateSettings:
    return RateSettings(target, o.rate_weight, o.lagrange_lr, o.lagrange_gain, stage, device, cost_slope)


def build_estimator(o: ObjectiveConfig, lexicon=None, credit_price=None) -> BoundaryEstimator:
    """The estimator objective.estimator names, with its reward (objective.reward) and, for the
    flips, the lexicon whose code length it credits and the price in its credit."""
    return ESTIMATORS[o.estimator](make_reward(o.reward), estimator_settings(o), lexicon, credit_price)


def build_lexicon(cfg, device=None):
    """The lexicon prior of a Config (objective.lexicon_*, base mean length 1 / model.target_rate)."""
    from rltok.objective.lexicon import ChunkLexicon

    o = cfg.objective
    return ChunkLexicon(o.lexicon_size, LEXICON_CONCENTRATION, 1.0 / cfg.model.target_rate, o.lexicon_decay,
                        device=device)


def make_chunk_price(model_cfg, o: ObjectiveConfig, seq_len: int, device=None, control=None) -> ChunkPrice | None:
    """The price per chunk the config asks for: objective.compute_price plus the multiplier of the
    rate control (`control`, or objective.rate_control's own); None when chunks are free."""
    control = RATE_CONTROLS[o.rate_control](rate_settings(o, model_cfg.target_rate, device=device)) \
        if control is None else control
    if o.compute_price == 0 and control.multiplier is None:
        return None
    from rltok.model.flops import chunk_cost_flops

    a, c = chunk_cost_flops(model_cfg, seq_len)
    return compute_price(a, c, o.compute_price, control.multiplier)


def lm_terms(alpha: float, hierarchical: bool) -> list:
    """(1 - alpha) CE_final, alpha CE_early and the rule's own loss; or a plain LM's loss."""
    return [FinalCE(1 - alpha), EarlyExitCE(alpha), BoundaryRule()] if hierarchical else [PlainLM()]


def build_objective(cfg, device=None, cost_slope=None) -> BuiltObjective:
    """The terms a Config's training minimises, and the container's schedule. `cost_slope(rate)`:
    d ln(training FLOPs per byte) / d rate (what the loss-slope price needs)."""
    m, o, t = cfg.model, cfg.objective, cfg.train
    hierarchical = HIERARCHICAL[m.arch]
    schedule = Schedule(o.policy_start_step, o.tokenizer_phase, hierarchical, t.flops_budget, t.max_steps, t.seed + 2)
    terms = ObjectiveTerms(lm_terms(o.alpha, hierarchical))
    if not (hierarchical and m.chunker in LEARNED_RULES):
        return BuiltObjective(terms, schedule)
    terms.policy, named = _policy_terms(cfg, device, cost_slope)
    return BuiltObjective(terms, schedule, named)


def _policy_terms(cfg, device, cost_slope) -> tuple[PolicyTerms, dict]:
    m, o = cfg.model, cfg.objective
    cls = ESTIMATORS[o.estimator]
    credit_price = lexicon = None
    if cls.credits_each_decision and o.flip_rate_control:
        credit_price = CREDIT_PRICES[o.rate_price](rate_settings(o, m.target_rate, 1, device, cost_slope))
    if cls.credits_each_decision and o.lexicon_weight > 0:  # its chunk counts (per rank under data parallelism)
        lexicon = build_lexicon(cfg, device)
    control = RATE_CONTROLS[o.rate_control](rate_settings(o, m.target_rate, 1, device))
    price = make_chunk_price(m, o, cfg.train.seq_len, device, control)
    prices = [] if price is None else [COST_ESTIMATORS[o.cost_estimator](price, o.pg_weight)]
    prices += [control] + ([] if credit_price is None else [credit_price])
    policy = PolicyTerms(build_estimator(o, lexicon, credit_price), prices)
    named = {"price": price, "flip_price": getattr(credit_price, "controller", None), "lexicon": lexicon}
    if m.stages == 2:  # the supertoken policy: its own rate control, its price always in closed form
        control2 = RATE_CONTROLS[o.rate_control](rate_settings(o, m.stage2_target_rate, 2, device))
        price2 = None if control2.multiplier is None else ChunkPrice(lagrange=control2.multiplier)
        prices2 = ([] if price2 is None else [ClosedFormChunkPrice(price2, o.pg_weight)]) + [control2]
        policy.stage2 = [Supertokens(o.pg_weight, prices2)]
        named.update(price2=price2, target_rate2=m.stage2_target_rate)
    return policy, named


def terms_of_objective(o: ObjectiveConfig, target_rate: float, hierarchical: bool = True,
                       price: ChunkPrice | None = None, target_rate2: float | None = None,
                       estimator: BoundaryEstimator | None = None) -> ObjectiveTerms:
    """The terms of a bare ObjectiveConfig, for tests and tools that run `compute_loss` without a
    trainer: no controller of its own (a rate control's multiplier is left out), the chunk price
    `price` if given, a supertoken rate control only with `target_rate2`, and `estimator` (one
    built with a lexicon, say) in place of the one `o` names."""
    lm = lm_terms(o.alpha, hierarchical)
    if not hierarchical:
        return ObjectiveTerms(lm)
    prices = [] if price is None else [COST_ESTIMATORS[o.cost_estimator](price, o.pg_weight)]
    prices.append(RATE_CONTROLS[o.rate_control](rate_settings(o, target_rate)))
    prices2 = [] if target_rate2 is None else [RATE_CONTROLS[o.rate_control](rate_settings(o, target_rate2, 2))]
    estimator = build_estimator(o) if estimator is None else estimator
    return ObjectiveTerms(lm, PolicyTerms(estimator, prices, [Supertokens(o.pg_weight, prices2)]))


def counterfactual_pass(model, idx, targets, out, o: ObjectiveConfig, generator=None):
    """The flips' counterfactual of `o`'s settings on one batch, without a lexicon."""
    return Flips(make_reward(o.reward), estimator_settings(o)).counterfactual(model, idx, targets, out, generator)
