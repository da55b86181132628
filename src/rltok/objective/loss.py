"""The training objective of the hierarchical LM.

    L = (1 - alpha) CE_final + alpha CE_early + [boundary estimator's terms] + [rate control's terms]

`compute_loss` composes the pieces built once from the config (build.py): the LM loss, the
boundary estimator (score function or flips, each with its reward), the rate control, and a
two-stage model's supertoken policy. It never branches on which estimator or reward runs.
The LM loss never reaches the boundary probabilities (hard selection). `BoundaryObjective` is
what the trainer holds: those pieces, their state, the warm start and the FLOPs meter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rltok.config import ObjectiveConfig
from rltok.model.output import ModelOutput, token_nll
from rltok.objective.batch import (LOCAL, Counterfactual, LocalMean, PolicyBatch, boundary_rate, expected_rate,
                                   per_segmentation)
from rltok.objective.build import ESTIMATORS, build_estimator, build_lexicon
from rltok.objective.controller import LagrangePrice, LossSlopePrice
from rltok.objective.estimator import BoundaryEstimator
from rltok.objective.flips_estimator import LN2, Flips, with_lexicon_costs
from rltok.objective.policy_gradient import masked_mean
from rltok.objective.rate import ChunkPrice, RateControl, make_chunk_price
from rltok.objective.rewards import boundary_reward, probe_reward, probe_sign
from rltok.objective.score_function import ScoreFunction, boundary_advantages, supertoken_terms

# the names other layers and tests import from here
__all__ = ["BoundaryObjective", "ChunkPrice", "Counterfactual", "ESTIMATORS", "Flips", "LocalMean", "LOCAL",
           "PolicyBatch", "RateControl", "ScoreFunction", "boundary_advantages", "boundary_rate", "boundary_reward",
           "build_estimator", "build_lexicon", "compute_loss", "counterfactual_pass", "expected_rate",
           "make_chunk_price", "per_segmentation", "probe_reward", "probe_sign", "token_nll", "with_lexicon_costs"]


def counterfactual_pass(model, idx: torch.Tensor, targets: torch.Tensor, out: ModelOutput, cfg: ObjectiveConfig,
                        generator: torch.Generator | None = None) -> Counterfactual:
    """The flips' counterfactual of `cfg` on one batch, without a lexicon."""
    return Flips(cfg, build_estimator(cfg).reward_fn).counterfactual(model, idx, targets, out, generator)


def compute_loss(out: ModelOutput, targets: torch.Tensor, cfg: ObjectiveConfig, target_rate: float,
                 batch_mean: LocalMean | None = None, price: ChunkPrice | None = None,
                 target_rate2: float | None = None,
                 price2: ChunkPrice | None = None, counterfactual: Counterfactual | None = None,
                 policy_on: bool = True, flip_price: LagrangePrice | None = None,
                 estimator: BoundaryEstimator | None = None, rate: RateControl | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss and detached metrics. `estimator` and `rate` (BoundaryObjective passes the ones
    it built) default to those `cfg` names, with the prices and targets given here: `price`
    (nats per chunk, see ChunkPrice), `target_rate2` and `price2` (a two-stage model's supertoken
    policy), `flip_price` (objective.flip_rate_control: the flips' price per boundary in
    normalised credit units). `batch_mean`: the batch-statistics protocol (data-parallel training
    passes a global one). `counterfactual`: what the flips estimator learns from.
    `policy_on=False` (the warm start) leaves the boundary policy untouched: no policy, rate or
    price term, so an RL policy keeps drawing its initial i.i.d. boundaries."""
    batch_mean = LOCAL if batch_mean is None else batch_mean
    targets = out.rows_targets(targets)
    ce_final, counted = out.per_byte_nll(targets)
    bpb = masked_mean(ce_final.detach(), counted) / LN2
    if not out.hierarchical:  # a plain LM (flat byte or BPE-token): the mean over the counted bytes
        loss = ce_final.sum() / counted.sum().clamp(min=1)
        metrics = {"loss": loss.detach(), "ce_final": loss.detach(), "bpb": bpb}
        if out.n_chunks is not None:  # tokens per byte: what a token model's compute scales with
            metrics["chunks_per_byte"] = (out.n_chunks.sum() / ce_final.numel()).detach().float()
        return loss, metrics
    metrics: dict[str, torch.Tensor] = {"ce_final": ce_final.mean().detach(), "bpb": bpb}

    ce_early = token_nll(out.early_logits, targets)
    loss = (1 - cfg.alpha) * ce_final.mean() + cfg.alpha * ce_early.mean()
    metrics["ce_early"] = ce_early.mean().detach()
    metrics["bpb_early"] = masked_mean(ce_early.detach(), counted) / LN2

    bd = out.boundaries
    metrics["rate"] = boundary_rate(bd.b, bd.free).detach()
    metrics["chunks_per_byte"] = bd.b.float().mean().detach()  # what the chunk-level compute scales with
    if bd.aux_loss is not None:
        loss = loss + bd.aux_loss
        metrics["aux_loss"] = bd.aux_loss.detach()
    if bd.logits is not None and not policy_on:
        metrics.update(expected_rate=expected_rate(bd.logits, free=bd.free),
                       p_mean=masked_mean(torch.sigmoid(bd.logits.detach()), bd.free))
    if bd.logits is not None and policy_on:
        estimator = build_estimator(cfg) if estimator is None else estimator
        if rate is None:
            rate = RateControl(cfg, target_rate, price, target_rate2, price2, flip_price)
        batch = PolicyBatch(out, targets, ce_early, ce_final, counterfactual, batch_mean, metrics)
        batch.reward = estimator.reward(batch)
        rate.prepare(batch)
        loss = estimator.add(loss, batch)
        loss = rate.add(loss, batch)
        # a supertoken policy (a learned rule at the first chunk level) learns from the stage-1 returns
        if out.boundaries2 is not None and out.boundaries2.logits is not None:
            loss = loss + supertoken_terms(out, batch.returns, cfg, rate, metrics, batch_mean)
        free = bd.free
        metrics.update(
            pg_loss=batch.pg_loss.detach(),
            # data parallel: the global mean, so the controller moves as in one process
            expected_rate=batch_mean.masked_mean(torch.sigmoid(bd.logits.detach().float()), free),
            p_mean=masked_mean(torch.sigmoid(bd.logits.detach()), free),
            reward=batch.reward.mean(),
        )
        if batch.returns is not None:
            metrics["return_std"] = batch.returns.std(correction=0)
        metrics["entropy"] = masked_mean(F.binary_cross_entropy_with_logits(
            bd.logits.detach(), torch.sigmoid(bd.logits.detach()), reduction="none"), free)
    metrics["loss"] = loss.detach()
    return loss, metrics


class BoundaryObjective:
    """Everything about the boundary decisions' part of training, in one place: the estimator
    (and its lexicon), the rate control of both stages, the flips' random stream, the warm start,
    and the meter of training FLOPs spent. The trainer calls `counterfactual` and `loss` for
    every micro-batch and `after_step` once per optimiser step with the step's global rates;
    `state_dict`/`load_state_dict` carry its state through checkpoints.

    `reduce`: the batch-statistics protocol (LocalMean, or distributed.GlobalBatchMean)."""

    def __init__(self, cfg, device=None, reduce: LocalMean | None = None, vocab_size: int | None = None):
        from rltok.config import VOCAB_SIZE

        self.cfg = cfg
        m, o = cfg.model, cfg.objective
        self.reduce = reduce or LOCAL
        self.vocab_size = vocab_size or VOCAB_SIZE
        self.learned = m.arch == "hourglass" and m.chunker == "rl"
        # the lexicon prior's chunk counts (per rank under data parallelism)
        lexicon = build_lexicon(cfg, device) if self.learned and o.estimator == "flips" and o.lexicon_weight > 0 \
            else None
        self.estimator = build_estimator(o, lexicon)
        self.rate = RateControl.from_config(cfg, self.learned, self.uses_flips, device)
        self.flip_gen = torch.Generator().manual_seed(cfg.train.seed + 2)  # which decisions get flipped
        self.flops_spent = 0.0  # training FLOPs, each step counted at the chunks it drew

    # the pieces the rate control holds, under the names older callers use
    price = property(lambda self: self.rate.price)
    price2 = property(lambda self: self.rate.price2)
    flip_price = property(lambda self: self.rate.flip_price)
    target_rate2 = property(lambda self: self.rate.target_rate2)
    lexicon = property(lambda self: getattr(self.estimator, "lexicon", None))

    @property
    def uses_flips(self) -> bool:
        """Whether the policy learns from a counterfactual (and needs the flips' stream)."""
        return self.learned and isinstance(self.estimator, Flips)

    def tokenizer_phase(self, step_bytes: int, seq_len: int) -> bool:
        """Whether the next step belongs to the tokenizer phase (objective.tokenizer_phase): only
        the encoder, the early-exit head and the boundary rule run, until that share of the
        training compute is spent. Under a fixed rule the same phase is an encoder warm-up at the
        same cost: the control that tells the rule found from the cheap byte-level training."""
        share = self.cfg.objective.tokenizer_phase
        if not (self.cfg.model.arch == "hourglass" and share > 0):
            return False
        return self.flops_spent < share * self.planned_flops(step_bytes, seq_len)

    def planned_flops(self, step_bytes: int, seq_len: int) -> float:
        """The run's training compute: train.flops_budget, or (without one) what train.max_steps
        full steps cost at the target rate."""
        from rltok.model.flops import step_train_flops_per_byte

        tc = self.cfg.train
        if tc.flops_budget > 0:
            return tc.flops_budget
        return tc.max_steps * step_bytes * step_train_flops_per_byte(self.cfg, seq_len, vocab_size=self.vocab_size)

    def policy_on(self, step: int) -> bool:
        """False during the warm start (objective.policy_start_step)."""
        return step >= self.cfg.objective.policy_start_step

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
        return compute_loss(out, targets, self.cfg.objective, self.cfg.model.target_rate, batch_mean=self.reduce,
                            counterfactual=counterfactual, policy_on=self.policy_on(step),
                            estimator=self.estimator, rate=self.rate)

    RATE_KEYS = ("expected_rate", "chunks_per_byte", "expected_rate2", "supertokens_per_chunk", "ce_final")

    def after_step(self, step: int, rates: dict[str, float | None], step_bytes: int, seq_len: int) -> None:
        """Feed the step's global rates (RATE_KEYS; None where the model has none) to the rate
        controllers and the FLOPs meter. `step` is the index of the step just taken."""
        from rltok.model.flops import step_train_flops_per_byte, tokenizer_phase_flops_per_byte

        phase = self.tokenizer_phase(step_bytes, seq_len)  # decided as at the step's start: nothing counted yet
        on = phase or self.policy_on(step)
        if on:  # a frozen (warm-start) policy cannot answer a price
            self.rate.after_step(rates)
        if phase:
            self.flops_spent += tokenizer_phase_flops_per_byte(self.cfg) * step_bytes
        else:
            # a probe's credit is a function of the decisions alone: no model pass is run or charged
            model_pass = self.learned and on and self.estimator.model_pass
            self.flops_spent += step_train_flops_per_byte(
                self.cfg, seq_len, rates["chunks_per_byte"], rates["supertokens_per_chunk"], self.vocab_size,
                counterfactual=model_pass) * step_bytes
        if isinstance(self.flip_price, LossSlopePrice) and on:
            if phase and not self.tokenizer_phase(step_bytes, seq_len):
                self.flip_price.restart()  # the full model's loss from the next step on
            else:
                self.flip_price.update(rates["ce_final"], self.flops_spent, self.cost_slope(rates["chunks_per_byte"]))

    def cost_slope(self, rate: float | None) -> float:
        """d ln(training FLOPs per byte) / d rate at `rate`: what one more boundary per byte costs,
        relative to what a byte costs (model.flops.chunk_cost_flops)."""
        from rltok.model.flops import chunk_cost_flops, config_forward_flops_per_byte

        rate = self.cfg.model.target_rate if rate is None else rate
        a, c = chunk_cost_flops(self.cfg.model, self.cfg.train.seq_len)
        return (a + c * rate) / config_forward_flops_per_byte(self.cfg, rate, self.vocab_size)

    def state_dict(self) -> dict:
        rate = self.rate.state_dict()
        return {"flops_spent": self.flops_spent, "flip_gen": self.flip_gen.get_state(),
                "lagrange": rate["lagrange"], "lagrange2": rate["lagrange2"],
                "lexicon": self.lexicon.state_dict() if self.lexicon is not None else None,
                "flip_price": rate["flip_price"]}

    def load_state_dict(self, state: dict) -> None:
        """Also reads the keys older trainer states kept at their top level."""
        self.flops_spent = state.get("flops_spent", 0.0)
        if state.get("flip_gen") is not None:
            self.flip_gen.set_state(state["flip_gen"])
        self.rate.load_state_dict(state)
        if self.lexicon is not None and state.get("lexicon") is not None:
            self.lexicon.load_state_dict(state["lexicon"])
