"""The one place the objective is read from the config: its registries turned into the list of terms
(build_objective; how each kind is built: docs/ARCHITECTURE.md, "Where to add things")."""

from __future__ import annotations

from dataclasses import dataclass, field

from rltok.config import CHUNKERS, COST_ESTIMATORS, ESTIMATORS, FAMILIES, RATES, ConfigError, ObjectiveConfig
from rltok.config import CREDIT_PRICES as CREDIT_PRICE_KINDS
from rltok.config import FlipsSettings, ScoreFunctionSettings
from rltok.objective.estimator import BoundaryEstimator, EstimatorSettings
from rltok.objective.lm_terms import BoundaryRule, EarlyExitCE, FinalCE, PlainLM
from rltok.objective.rate import ChunkPrice, ClosedFormChunkPrice, RateSettings, compute_price
from rltok.objective.rewards import make_reward
from rltok.objective.score_function import Returns
from rltok.objective.supertokens import Supertokens
from rltok.objective.terms import ObjectiveTerms, PolicyTerms

LEXICON_CONCENTRATION = 100.0  # the Dirichlet process' weight of the base model (never tuned)


@dataclass(frozen=True)
class Schedule:
    """What the objective container needs of the config beside its terms."""
    policy_start_step: int = 0  # the warm start: the policy is left alone before this step
    tokenizer_phase: float = 0.0  # the share of the training compute spent in the tokenizer phase
    has_encoder_phase: bool = False  # whether the model has an encoder-only phase (the hierarchical LM)
    flip_seed: int = 2  # the flips' random stream
    policy_until: float = 1.0  # the share of the training compute after which the policy settles
    settle_threshold: str = "rate"  # where it then cuts: at the logit keeping its rate, or at p > 0.5


@dataclass
class BuiltObjective:
    terms: ObjectiveTerms
    schedule: Schedule
    # the pieces tests and tools inspect, by the names older callers use (price, flip_price: the
    # controllers; lexicon)
    named: dict = field(default_factory=dict)


def _setting(section, name: str, defaults):
    """A setting of the estimator's section, or `defaults`' where its kind has none (a new kind may)."""
    return getattr(section, name, getattr(defaults, name))


def returns_of(o: ObjectiveConfig) -> Returns:
    """The score function's returns settings of an objective config (their defaults where the
    estimator's kind has none: the instruments that compare estimators read them)."""
    sf, est = ScoreFunctionSettings(), o.estimator
    parts = {p.strip() for p in str(_setting(est, "baseline", sf)).split("+") if p.strip()}
    return Returns(batch_baseline=bool({"batch", "batch_loo"} & parts), leave_one_out="batch_loo" in parts,
                   group_size=o.group_size, group_baseline="group" in parts,
                   critic="value" in parts, gamma=_setting(est, "gamma", sf), gae_lambda=_setting(est, "gae_lambda", sf),
                   normalize=_setting(est, "normalize_advantages", sf))


def estimator_settings(o: ObjectiveConfig) -> EstimatorSettings:
    fl, est = FlipsSettings(), o.estimator
    return EstimatorSettings(o.pg_weight, returns_of(o), _setting(est, "stride", fl), _setting(est, "model_pass", fl),
                             _setting(est, "lexicon", fl).weight)


def rate_settings(section, target: float, stage: int = 1, device=None, cost_slope=None) -> RateSettings:
    """What a rate control or a credit price reads of its config section (the settings its kind has)."""
    return RateSettings(target, getattr(section, "weight", 0.0), getattr(section, "lr", 0.0),
                        getattr(section, "gain", 0.0), stage, device, cost_slope)


def rate_control(o: ObjectiveConfig, target: float, stage: int = 1, device=None):
    """The rate control objective.rate names, for one stage's policy."""
    return RATES.component(o.rate.kind)(rate_settings(o.rate, target, stage, device))


def build_estimator(o: ObjectiveConfig, lexicon=None, credit_price=None) -> BoundaryEstimator:
    """The estimator objective.estimator names, with its reward (objective.reward) and, for the
    flips, the lexicon whose code length it credits and the price in its credit."""
    return ESTIMATORS.component(o.estimator.kind)(make_reward(o.reward.kind), estimator_settings(o), lexicon,
                                                   credit_price)


def build_lexicon(cfg, device=None):
    """The lexicon prior of a Config (objective.lexicon_*, base mean length 1 / model.target_rate)."""
    from rltok.objective.lexicon import ChunkLexicon

    lex = cfg.objective.estimator.lexicon
    return ChunkLexicon(lex.size, LEXICON_CONCENTRATION, 1.0 / cfg.model.target_rate, lex.decay, device=device)


def make_chunk_price(model_cfg, o: ObjectiveConfig, seq_len: int, device=None, control=None,
                     cost=None) -> ChunkPrice | None:
    """The price per chunk the config asks for: objective.rate.compute_price plus the multiplier of
    the rate control (`control`, or objective.rate's own); None when chunks are free. `cost`: what
    the model costs (rltok.model.flops.ModelCost)."""
    control = rate_control(o, model_cfg.target_rate, device=device) if control is None else control
    if o.rate.compute_price == 0 and control.multiplier is None:
        return None
    a, c = cost.at(seq_len).chunk_cost()
    return compute_price(a, c, o.rate.compute_price, control.multiplier)


def lm_terms(alpha: float, hierarchical: bool) -> list:
    """(1 - alpha) CE_final, alpha CE_early and the rule's own loss; or a plain LM's loss."""
    return [FinalCE(1 - alpha), EarlyExitCE(alpha), BoundaryRule()] if hierarchical else [PlainLM()]


def build_objective(cfg, device=None, cost_slope=None, cost=None) -> BuiltObjective:
    """The terms a Config's training minimises, and the container's schedule. `cost_slope(rate)`:
    d ln(training FLOPs per byte) / d rate (what the loss-slope price needs)."""
    m, o, t = cfg.model, cfg.objective, cfg.train
    hierarchical = FAMILIES.component(m.arch).hierarchical
    schedule = Schedule(o.policy_start_step, o.tokenizer_phase, hierarchical, t.seed + 2, o.policy_until,
                        o.settle_threshold)
    terms = ObjectiveTerms(lm_terms(o.alpha, hierarchical))
    if not (hierarchical and CHUNKERS.component(m.chunker.kind).learned):
        return BuiltObjective(terms, schedule)
    terms.policy, named = _policy_terms(cfg, device, cost_slope, cost)
    return BuiltObjective(terms, schedule, named)


def _policy_terms(cfg, device, cost_slope, cost=None) -> tuple[PolicyTerms, dict]:
    m, o = cfg.model, cfg.objective
    cls = ESTIMATORS.component(o.estimator.kind)
    credit_price = lexicon = None
    if cls.credits_each_decision:
        price_cls = CREDIT_PRICE_KINDS.component(o.estimator.price.kind)  # None: no price in the credit
        if price_cls is not None:
            credit_price = price_cls(rate_settings(o.estimator.price, m.target_rate, 1, device, cost_slope))
        if o.estimator.lexicon.weight > 0:  # its chunk counts (per rank under data parallelism)
            lexicon = build_lexicon(cfg, device)
    control = rate_control(o, m.target_rate, 1, device)
    price = make_chunk_price(m, o, cfg.train.seq_len, device, control, cost)
    prices = [] if price is None else [COST_ESTIMATORS.component(o.rate.cost_estimator)(price, o.pg_weight)]
    prices += [control] + ([] if credit_price is None else [credit_price])
    _refuse_unread_pg_weight(o, cls, price, m.stages)
    policy = PolicyTerms(build_estimator(o, lexicon, credit_price), prices)
    named = {"price": price, "flip_price": getattr(credit_price, "controller", None), "lexicon": lexicon}
    if m.stages == 2:  # the supertoken policy: its own rate control, its price always in closed form
        control2 = rate_control(o, m.stage2_target_rate, 2, device)
        price2 = None if control2.multiplier is None else ChunkPrice(lagrange=control2.multiplier)
        prices2 = ([] if price2 is None else [ClosedFormChunkPrice(price2, o.pg_weight)]) + [control2]
        policy.stage2 = [Supertokens(o.pg_weight, prices2)]
    return policy, named


def _refuse_unread_pg_weight(o: ObjectiveConfig, estimator_cls, price, stages: int) -> None:
    """objective.pg_weight weights the estimator's loss (the score function's), a closed-form chunk
    price and the supertoken policy. Set where none of them is (the lexicon recipe's flips with a rate
    penalty), it would change nothing, silently: refused."""
    read = getattr(estimator_cls, "weighted", True) or price is not None or stages == 2
    if read or o.pg_weight == ObjectiveConfig().pg_weight:
        return
    raise ConfigError(f"objective.pg_weight={o.pg_weight:g} changes nothing here: the {o.estimator.kind} estimator's "
                      "credits are normalised, not weighted by it, and there is no closed-form chunk price "
                      "(objective.rate.compute_price > 0 or objective.rate=lagrange) or supertoken policy for it to "
                      "weight. To leave the boundary policy untrained, set objective.policy_start_step beyond "
                      "the run's steps")


def terms_of_objective(o: ObjectiveConfig, target_rate: float | None, hierarchical: bool = True,
                       price: ChunkPrice | None = None, target_rate2: float | None = None,
                       estimator: BoundaryEstimator | None = None) -> ObjectiveTerms:
    """The terms of a bare ObjectiveConfig, for tests and tools that run `compute_loss` without a
    trainer: no controller of its own (a rate control's multiplier is left out), the chunk price
    `price` if given, a supertoken rate control only with `target_rate2`, and `estimator` (one
    built with a lexicon, say) in place of the one `o` names."""
    lm = lm_terms(o.alpha, hierarchical)
    if not hierarchical:
        return ObjectiveTerms(lm)
    if target_rate is None:
        raise ValueError("compute_loss of a chunked model's output with an ObjectiveConfig needs target_rate "
                         "(the model's: cfg.model.target_rate) for its rate term")
    prices = [] if price is None else [COST_ESTIMATORS.component(o.rate.cost_estimator)(price, o.pg_weight)]
    prices.append(rate_control(o, target_rate))
    prices2 = [] if target_rate2 is None else [rate_control(o, target_rate2, 2)]
    estimator = build_estimator(o) if estimator is None else estimator
    return ObjectiveTerms(lm, PolicyTerms(estimator, prices, [Supertokens(o.pg_weight, prices2)]))
