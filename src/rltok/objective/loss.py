"""The training objective of the hierarchical LM.

    L = (1 - alpha) CE_final + alpha CE_early + lambda_PG L_PG + lambda_rate L_rate

Reward per byte position (detached): r_t = CE_early(t) - CE_final(t), how much the deep path
improved the prediction of byte t+1 over the encoder-only head. Baseline, then discounted
return G_t = sum_{k>=t} gamma^(k-t) A_k, then the score-function loss on the boundary
decisions. The LM loss never reaches the boundary probabilities (hard selection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rltok.data.bytes_classes import is_whitespace_byte
from rltok.config import PROBE_REWARDS, ModelConfig, ObjectiveConfig
from rltok.model.output import ModelOutput, token_nll
from rltok.objective.advantages import batch_relative, discounted_cumsum, gae, group_relative
from rltok.objective.controller import LagrangePrice
from rltok.objective.policy_gradient import masked_mean, policy_gradient_loss, rate_loss
from rltok.objective.flips import boundary_values, draw_flips, local_expectation_loss

LN2 = math.log(2.0)


class LocalMean:
    """Batch statistics within one process. The reduction protocol the objective uses:
    `reduce(x)` is the per-position mean over the batch rows of a (B, T) tensor, and
    `reduce.masked_mean(x, mask)` a scalar mean over a mask; both of detached quantities.
    Data-parallel training passes the global implementation (distributed.GlobalBatchMean)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().mean(0, keepdim=True)

    def masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_mean(x.detach(), mask)


LOCAL = LocalMean()


@dataclass
class ChunkPrice:
    """What the boundary policy pays per chunk, in nats: the compute one more chunk costs
    (a + c * chunks_per_byte, from the chunk-level network's FLOPs, times
    objective.compute_price), plus the Lagrange multiplier of the rate constraint when there is one."""
    compute: float = 0.0  # nats per chunk with no chunks
    compute_per_rate: float = 0.0  # its growth with chunks per byte (attention over more chunks)
    lagrange: LagrangePrice | None = None

    def __call__(self, chunks_per_byte: torch.Tensor) -> torch.Tensor:
        price = self.compute + self.compute_per_rate * chunks_per_byte.detach().float()
        return price + self.lagrange.price if self.lagrange is not None else price


def make_chunk_price(model_cfg: ModelConfig, cfg: ObjectiveConfig, seq_len: int, device=None) -> ChunkPrice | None:
    """The price the config asks for (None when chunks are free, as in the reference recipe)."""
    lagrange = None
    if cfg.rate_control == "lagrange":
        lagrange = LagrangePrice(model_cfg.target_rate, cfg.lagrange_lr, cfg.lagrange_gain, device)
    if cfg.compute_price == 0 and lagrange is None:
        return None
    from rltok.model.flops import chunk_cost_flops

    a, c = chunk_cost_flops(model_cfg, seq_len)
    nats_per_flop = cfg.compute_price * LN2 / 1e6  # compute_price is in bits per MFLOP
    return ChunkPrice(a * nats_per_flop, c * nats_per_flop, lagrange)


def boundary_rate(b: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """THE rate, used by the logs, eval, the rate loss and the controller alike: boundaries per
    byte over the free positions (the decisions the rule makes; forced ones are left out)."""
    return masked_mean(b.float(), free)


def expected_rate(logits: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """E[rate] under the policy: the mean boundary probability over free positions."""
    return masked_mean(torch.sigmoid(logits.detach().float()), free)


def supertoken_terms(out: ModelOutput, returns: torch.Tensor, cfg: ObjectiveConfig, target_rate2: float | None,
                     price2: ChunkPrice | None, metrics: dict, batch_mean: LocalMean = LOCAL) -> torch.Tensor:
    """Policy-gradient, price and rate terms of a two-stage model's supertoken policy. Its
    decision at chunk j first changes the prediction made at chunk j's last byte, so it is
    credited with the stage-1 return from that byte on (same reward, baseline and discount).
    Under data parallelism the means over chunks are per rank (ranks hold different numbers of
    chunks), except the rate loss' mean probability, which is global."""
    bd2 = out.boundaries2
    free2 = bd2.free
    adv2 = torch.gather(returns, 1, out.chunk_pos)
    loss = cfg.pg_weight * policy_gradient_loss(bd2.logp, adv2, free2)
    p2 = torch.sigmoid(bd2.logits.float())
    # the rate over free chunk slots (as for stage 1); compute follows supertokens per chunk
    metrics["rate2"] = boundary_rate(bd2.b, free2).detach()
    metrics["expected_rate2"] = expected_rate(bd2.logits, free2)
    metrics["supertokens_per_chunk"] = (bd2.b.sum() / out.n_chunks.sum().clamp(min=1)).detach().float()
    if price2 is not None:
        pr = price2(metrics["supertokens_per_chunk"])
        metrics["chunk_price2"] = pr.detach()
        loss = loss + cfg.pg_weight * pr * masked_mean(p2, free2)
    if cfg.rate_control == "penalty" and target_rate2 is not None:
        l_rate2 = rate_loss(bd2.logits, free2, target_rate2, mean=batch_mean.masked_mean)
        metrics["rate_loss2"] = l_rate2.detach()
        loss = loss + cfg.rate_weight * l_rate2
    return loss


def probe_sign(targets: torch.Tensor, kind: str = "whitespace_probe") -> torch.Tensor:
    """Per position, what a boundary there earns under the probe reward `kind` (see probe_reward):
    +1 on a wanted byte, -1 elsewhere, 0 at byte 1 for the token probe. A function of the bytes
    alone, so one call serves every segmentation of the same rows."""
    if kind == "token_probe":
        from rltok.data.python_tokens import token_ends

        seen = targets[:, :-1].cpu()  # bytes 1 .. T-1
        ends = torch.stack([token_ends(bytes(row.tolist())) for row in seen]).to(targets.device)
        sign = torch.zeros(targets.shape, device=targets.device)
        sign[:, 2:] = ends[:, :-1].float() * 2 - 1  # byte t starts a unit when byte t - 1 ends one
        return sign
    return is_whitespace_byte(targets.roll(1, dims=1)).float() * 2 - 1


def probe_reward(b: torch.Tensor, targets: torch.Tensor, kind: str = "whitespace_probe") -> torch.Tensor:
    """The synthetic rewards of the plumbing checks: +1 for a boundary on a wanted byte, -1 for one
    anywhere else, 0 without a boundary. Wanted: "whitespace_probe", a whitespace byte;
    "token_probe", the first byte of a Python lexical unit (rltok.data.python_tokens, read one byte
    late: can the policy learn code's tokens when the reward names them?; 0 at byte 1, whose
    predecessor the targets do not hold). Byte t is targets[t - 1] (position 0 is forced)."""
    return b.float() * probe_sign(targets, kind)


def boundary_reward(ce_early: torch.Tensor, ce_final: torch.Tensor, kind: str, b: torch.Tensor | None = None,
                    targets: torch.Tensor | None = None) -> torch.Tensor:
    """Detached per-position reward: "early_exit" = CE_early - CE_final (how much the deep path
    helped), "final" = -CE_final, the probes = the synthetic rewards of `probe_reward`
    (needs the decisions `b` and the `targets`): a check that the estimator learns at all."""
    if kind in PROBE_REWARDS:
        return probe_reward(b, targets, kind)
    return (ce_early - ce_final).detach() if kind == "early_exit" else -ce_final.detach()


@dataclass
class Counterfactual:
    """The loss of the same batch with a sparse set of boundary decisions flipped."""
    flips: torch.Tensor  # (B, T) bool: the flipped decisions
    nll: torch.Tensor | None  # (B, T) the model's per-position loss with them flipped (no grad); None: not re-run
    extra: torch.Tensor | None = None  # (B, T) extra per-position cost of the sampled decisions (the lexicon's)
    extra_flipped: torch.Tensor | None = None  # the same with the flips applied
    # (B, T) each flipped decision's credit D_f = L(b_f = 0) - L(b_f = 1) when it is known exactly
    # (the lexicon's, objective.lexicon_credit="exact"); None: from the costs above
    credit: torch.Tensor | None = None
    # (B, T) a probe's reward of the sampled decisions, from the same lexing as the flipped ones'
    reward: torch.Tensor | None = None


def per_segmentation(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A batch's per-sequence tensor repeated for its K segmentations per sequence (group_size)."""
    return x if x.shape[0] == rows else x.repeat_interleave(rows // x.shape[0], 0)


def with_lexicon_costs(cf: Counterfactual, lexicon, idx: torch.Tensor, b: torch.Tensor, weight: float) -> Counterfactual:
    """Charge both segmentations their code length under the lexicon (rl/lexicon.py), in nats
    times `weight`, at the boundaries that close its units."""
    idx = per_segmentation(idx, b.shape[0])
    return Counterfactual(cf.flips, cf.nll, weight * lexicon.costs(idx, b), weight * lexicon.costs(idx, b ^ cf.flips),
                          reward=cf.reward)


def exact_lexicon_credit(lexicon, idx: torch.Tensor, bd, weight: float) -> Counterfactual:
    """Every free decision credited with exactly what flipping it alone would change in the
    segmentation's code length under the lexicon (no model pass; no truncation, since a flip
    changes the cost of the one or two units around it and nothing else)."""
    b = bd.b
    idx = per_segmentation(idx, b.shape[0])
    change = weight * lexicon.flip_deltas(idx, b)  # L(flipped) - L(taken)
    credit = change * (b.float() * 2 - 1)  # D = L(b = 0) - L(b = 1)
    return Counterfactual(bd.free.clone(), None, weight * lexicon.costs(idx, b), credit=credit)


@torch.no_grad()
def counterfactual_pass(model, idx: torch.Tensor, targets: torch.Tensor, out: ModelOutput, cfg: ObjectiveConfig,
                        generator: torch.Generator | None = None) -> Counterfactual:
    """Flip every `cfg.flip_stride`-th free decision (random phase per row) and re-run what
    comes after the encoder (its output is reused). With the synthetic probe reward no model
    pass is needed: its per-position loss is a function of the decisions alone."""
    bd = out.boundaries
    flips = draw_flips(bd.free, cfg.flip_stride, generator)
    b_flipped = bd.b ^ flips
    rows = bd.b.shape[0]
    idx, targets = per_segmentation(idx, rows), per_segmentation(targets, rows)
    if cfg.reward in PROBE_REWARDS:
        sign = probe_sign(targets, cfg.reward)  # the bytes are lexed once for both segmentations
        return Counterfactual(flips, -(b_flipped.float() * sign), reward=bd.b.float() * sign)
    if not cfg.flip_model_pass:  # the lexicon's credit alone: no model pass, no extra FLOPs
        return Counterfactual(flips, None)
    alt = model(idx, boundaries=b_flipped, encoded=(out.encoder_state.detach(), out.early_logits.detach()))
    return Counterfactual(flips, token_nll(alt.logits, targets))


def flips_counterfactual(model, idx: torch.Tensor, targets: torch.Tensor, out: ModelOutput, cfg: ObjectiveConfig,
                         generator: torch.Generator | None = None, lexicon=None) -> Counterfactual:
    """What the flips estimator learns from on one batch: with a lexicon and lexicon_credit="exact",
    the exact credit of every decision; otherwise the flipped pass, with both segmentations'
    code lengths under the lexicon (weight cfg.lexicon_weight) when there is one. The lexicon's
    counts are not touched."""
    if lexicon is not None and cfg.lexicon_credit == "exact":
        return exact_lexicon_credit(lexicon, idx, out.boundaries, cfg.lexicon_weight)
    cf = counterfactual_pass(model, idx, targets, out, cfg, generator)
    return cf if lexicon is None else with_lexicon_costs(cf, lexicon, idx, out.boundaries.b, cfg.lexicon_weight)


def build_lexicon(cfg, device=None):
    """The lexicon prior of a Config (objective.lexicon_*, base mean length 1 / model.target_rate):
    unigram or bigram (objective.lexicon_context)."""
    from rltok.objective.bigram_lexicon import BigramLexicon
    from rltok.objective.lexicon import ChunkLexicon

    o = cfg.objective
    kind = BigramLexicon if o.lexicon_context == "bigram" else ChunkLexicon
    return kind(o.lexicon_size, o.lexicon_concentration, 1.0 / cfg.model.target_rate, o.lexicon_decay,
                o.lexicon_lag, o.lexicon_collapse_blanks, device=device)


def boundary_advantages(reward: torch.Tensor, free: torch.Tensor, cfg: ObjectiveConfig,
                        values: torch.Tensor | None = None, batch_mean: LocalMean = LOCAL
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-decision advantages from per-position rewards (B, T), and the critic's loss.

    Baseline first ("batch": per-position mean over the batch; "group": leave-one-out mean over
    the K segmentations of the same sequence), then either the discounted return
    sum_k gamma^(k-t) A_k, or with "value" GAE(gamma, lambda) on the critic, whose regression
    target is that discounted return.
    """
    parts = cfg.baseline_parts()
    if "batch" in parts:
        reward = batch_relative(reward, mean=batch_mean(reward))
    elif "group" in parts:
        reward = group_relative(reward, cfg.group_size)
    returns = discounted_cumsum(reward, cfg.gamma)
    value_loss = None
    if "value" in parts:
        if values is None:
            raise ValueError("objective.baseline uses 'value' but the model has no value head")
        value_loss = masked_mean((values.float() - returns).square(), free)
        returns = gae(reward, values.detach().float(), cfg.gamma, cfg.gae_lambda)
    if cfg.normalize_advantages:
        mu = masked_mean(returns, free)
        sd = masked_mean((returns - mu).square(), free).sqrt().clamp(min=1e-6)
        returns = (returns - mu) / sd
    return returns, value_loss


def flips_policy_loss(bd, reward: torch.Tensor, ce_final: torch.Tensor, counterfactual: Counterfactual,
                      cfg: ObjectiveConfig, batch_mean: LocalMean = LOCAL,
                      flip_price: LagrangePrice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The flips estimator's surrogate (unweighted) and the per-flip credits D_f. The per-position
    loss it compares with the counterfactual one is the LM's (or, for the probe, minus the reward)."""
    values = counterfactual.credit
    if values is None:
        base = -reward if cfg.reward in PROBE_REWARDS else ce_final.detach()
        flipped = base if counterfactual.nll is None else counterfactual.nll  # not re-run: no change
        if counterfactual.extra is not None:
            base, flipped = base + counterfactual.extra, flipped + counterfactual.extra_flipped
        values = boundary_values(base, flipped, counterfactual.flips, bd.b)
    loss = local_expectation_loss(bd.logits, values, counterfactual.flips, cfg.flip_center, cfg.flip_normalize,
                                  mean=batch_mean.masked_mean, price=0.0 if flip_price is None else flip_price.price)
    return loss, values


def compute_loss(out: ModelOutput, targets: torch.Tensor, cfg: ObjectiveConfig, target_rate: float,
                 batch_mean: LocalMean | None = None, price: ChunkPrice | None = None,
                 target_rate2: float | None = None,
                 price2: ChunkPrice | None = None, counterfactual: Counterfactual | None = None,
                 policy_on: bool = True, flip_price: LagrangePrice | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss and detached metrics. `batch_mean` (optional) computes the per-position
    batch mean of a (B, T) tensor; data-parallel training passes a global one. `price` (nats
    per chunk, see ChunkPrice) makes every boundary cost the policy something. Two-stage
    models: `target_rate2` (supertokens per chunk) and `price2` do the same for the second
    policy. `counterfactual`: the flipped pass that objective.estimator="flips" learns from.
    `policy_on=False` (the warm start) leaves the boundary policy untouched: no policy, rate
    or price term, so an RL policy keeps drawing its initial i.i.d. boundaries. `flip_price`
    (objective.flip_rate_control): the flips' price per boundary in normalised credit units."""
    batch_mean = LOCAL if batch_mean is None else batch_mean
    targets = out.rows_targets(targets)
    ce_final, counted = out.per_byte_nll(targets)
    bpb = masked_mean(ce_final.detach(), counted) / LN2
    if out.early_logits is None:  # a plain LM (flat byte or BPE-token): the mean over the counted bytes
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
        free = bd.free
        if counterfactual is not None and counterfactual.reward is not None:
            reward = counterfactual.reward  # a probe's, computed with the counterfactual's
        else:
            reward = boundary_reward(ce_early, ce_final, cfg.reward, bd.b, targets)
        chunk_price = None
        if price is not None:  # data parallel: the price grows with the global rate, the same on every rank
            cpb = batch_mean.masked_mean(bd.b.float(), torch.ones_like(bd.b))
            chunk_price = price(cpb)
        if chunk_price is not None and cfg.cost_estimator == "reward":  # sampled cost, score-function gradient
            reward = reward - chunk_price * (bd.b & free).to(reward.dtype)
        returns, value_loss = boundary_advantages(reward, free, cfg, out.values, batch_mean)
        if value_loss is not None:
            loss = loss + cfg.value_weight * value_loss
            metrics["value_loss"] = value_loss.detach()
        if cfg.estimator == "flips":
            if counterfactual is None:
                raise ValueError("objective.estimator='flips' needs the counterfactual pass (counterfactual_pass)")
            l_pg, values = flips_policy_loss(bd, reward, ce_final, counterfactual, cfg, batch_mean, flip_price)
            loss = loss + cfg.flip_weight * l_pg
            metrics["flip_value"] = masked_mean(values, counterfactual.flips).detach()
            if flip_price is not None:
                metrics["flip_price"] = flip_price.price.detach()
            if counterfactual.extra is not None:  # the lexicon's code length of the sampled chunks, bits per byte
                metrics["lexicon_bpb"] = counterfactual.extra.mean() / (cfg.lexicon_weight * LN2)
        else:
            l_pg = policy_gradient_loss(bd.logp, returns, free)
            loss = loss + cfg.pg_weight * l_pg
        if chunk_price is not None:
            metrics["chunk_price"] = chunk_price.detach()
            if cfg.cost_estimator == "exact":
                # a chunk's cost depends on its own decision, E[price * b_t] = price * p_t: for
                # w = 1 the same expected gradient as the sampled cost in the reward, with no variance
                loss = loss + cfg.pg_weight * chunk_price * masked_mean(torch.sigmoid(bd.logits.float()), free)
        if cfg.rate_control == "penalty":
            # a data-parallel batch_mean also supplies the global mean boundary probability
            l_rate = rate_loss(bd.logits, free, target_rate, mean=batch_mean.masked_mean)
            loss = loss + cfg.rate_weight * l_rate
            metrics["rate_loss"] = l_rate.detach()
        if out.boundaries2 is not None:
            loss = loss + supertoken_terms(out, returns, cfg, target_rate2, price2, metrics, batch_mean)
        metrics.update(
            pg_loss=l_pg.detach(),
            # data parallel: the global mean, so the controller moves as in one process
            expected_rate=batch_mean.masked_mean(torch.sigmoid(bd.logits.detach().float()), free),
            p_mean=masked_mean(torch.sigmoid(bd.logits.detach()), free),
            reward=reward.mean(), return_std=returns.std(correction=0),
            entropy=masked_mean(F.binary_cross_entropy_with_logits(
                bd.logits.detach(), torch.sigmoid(bd.logits.detach()), reduction="none"), free),
        )
    metrics["loss"] = loss.detach()
    return loss, metrics


class BoundaryObjective:
    """Everything about the boundary decisions' part of training, in one place: the targets, the
    prices and rate controllers of both stages, the estimator's counterfactual pass and its
    random stream, the warm start, and the meter of training FLOPs spent. The trainer calls
    `loss` for every micro-batch and `after_step` once per optimiser step with the step's global
    rates; `state_dict`/`load_state_dict` carry its state through checkpoints.

    `reduce`: the batch-statistics protocol (LocalMean, or distributed.GlobalBatchMean)."""

    def __init__(self, cfg, device=None, reduce: LocalMean | None = None, vocab_size: int | None = None):
        from rltok.config import VOCAB_SIZE

        self.cfg = cfg
        m, o = cfg.model, cfg.objective
        self.reduce = reduce or LOCAL
        self.vocab_size = vocab_size or VOCAB_SIZE
        learned = m.arch == "hourglass" and m.chunker == "rl"
        # a price per chunk (compute-aware objective, Lagrange rate control): the RL policy only
        self.price = make_chunk_price(m, o, cfg.train.seq_len, device) if learned else None
        two_stage = learned and m.stages == 2
        self.target_rate2 = m.stage2_target_rate if two_stage else None
        self.price2 = None  # the supertoken policy's rate multiplier
        if two_stage and o.rate_control == "lagrange":
            self.price2 = ChunkPrice(lagrange=LagrangePrice(m.stage2_target_rate, o.lagrange_lr, o.lagrange_gain, device))
        self.uses_flips = learned and o.estimator == "flips"
        self.flip_gen = torch.Generator().manual_seed(cfg.train.seed + 2)  # which decisions get flipped
        self.flops_spent = 0.0  # training FLOPs, each step counted at the chunks it drew
        # the flips' rate controller: a price in normalised credit units, by dual ascent
        self.flip_price = None
        if self.uses_flips and o.flip_rate_control:
            self.flip_price = LagrangePrice(m.target_rate, o.lagrange_lr, o.lagrange_gain, device)
        self.lexicon = None  # the lexicon prior's chunk counts (per rank under data parallelism)
        if self.uses_flips and o.lexicon_weight > 0:
            self.lexicon = build_lexicon(cfg, device)

    def policy_on(self, step: int) -> bool:
        """False during the warm start (objective.policy_start_step)."""
        return step >= self.cfg.objective.policy_start_step

    def counterfactual(self, model, idx: torch.Tensor, targets: torch.Tensor, out: ModelOutput,
                       step: int) -> Counterfactual | None:
        """The flipped pass the flips estimator learns from (None when it is not needed)."""
        if not self.uses_flips:
            return None
        cf = None
        if self.policy_on(step):
            cf = flips_counterfactual(model, idx, targets, out, self.cfg.objective, self.flip_gen, self.lexicon)
        if self.lexicon is not None:  # then count the sampled units (the warm start's too)
            b = out.boundaries.b
            self.lexicon.update(per_segmentation(idx, b.shape[0]), b)
        return cf

    def loss(self, out: ModelOutput, targets: torch.Tensor, step: int,
             counterfactual: Counterfactual | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return compute_loss(out, targets, self.cfg.objective, self.cfg.model.target_rate, batch_mean=self.reduce,
                            price=self.price, target_rate2=self.target_rate2, price2=self.price2,
                            counterfactual=counterfactual, policy_on=self.policy_on(step), flip_price=self.flip_price)

    def flip_rate_target(self, step: int) -> float:
        """The rate the flips' price holds at `step`: objective.flip_rate_start moving linearly to
        model.target_rate over flip_rate_anneal_steps steps from the policy's first step."""
        o, target = self.cfg.objective, self.cfg.model.target_rate
        if o.flip_rate_start <= 0:
            return target
        done = (step - o.policy_start_step + 1) / max(1, o.flip_rate_anneal_steps)
        return o.flip_rate_start + (target - o.flip_rate_start) * min(1.0, max(0.0, done))

    RATE_KEYS = ("expected_rate", "chunks_per_byte", "expected_rate2", "supertokens_per_chunk")

    def after_step(self, step: int, rates: dict[str, float | None], step_bytes: int, seq_len: int) -> None:
        """Feed the step's global rates (RATE_KEYS; None where the model has none) to the rate
        controllers and the FLOPs meter. `step` is the index of the step just taken."""
        from rltok.model.flops import step_train_flops_per_byte

        on = self.policy_on(step)
        if on and self.price is not None and self.price.lagrange is not None and rates["expected_rate"] is not None:
            self.price.lagrange.update(rates["expected_rate"])  # a frozen (warm-start) policy cannot answer a price
        if on and self.flip_price is not None and rates["expected_rate"] is not None:
            self.flip_price.target = self.flip_rate_target(step)
            self.flip_price.update(rates["expected_rate"])
        if on and self.price2 is not None and rates["expected_rate2"] is not None:
            self.price2.lagrange.update(rates["expected_rate2"])
        o = self.cfg.objective
        # a probe's credit is a function of the decisions alone: no model pass is run or charged
        model_pass = self.uses_flips and on and o.flip_model_pass and o.reward not in PROBE_REWARDS
        self.flops_spent += step_train_flops_per_byte(
            self.cfg, seq_len, rates["chunks_per_byte"], rates["supertokens_per_chunk"], self.vocab_size,
            counterfactual=model_pass) * step_bytes

    def state_dict(self) -> dict:
        lagrange = self.price.lagrange if self.price is not None else None
        return {"flops_spent": self.flops_spent, "flip_gen": self.flip_gen.get_state(),
                "lagrange": lagrange.state_dict() if lagrange is not None else None,
                "lagrange2": self.price2.lagrange.state_dict() if self.price2 is not None else None,
                "lexicon": self.lexicon.state_dict() if self.lexicon is not None else None,
                "flip_price": self.flip_price.state_dict() if self.flip_price is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Also reads the keys older trainer states kept at their top level."""
        self.flops_spent = state.get("flops_spent", 0.0)
        if state.get("flip_gen") is not None:
            self.flip_gen.set_state(state["flip_gen"])
        if self.price is not None and self.price.lagrange is not None and state.get("lagrange"):
            self.price.lagrange.load_state_dict(state["lagrange"])
        if self.price2 is not None and state.get("lagrange2"):
            self.price2.lagrange.load_state_dict(state["lagrange2"])
        if self.flip_price is not None and state.get("flip_price") is not None:
            self.flip_price.load_state_dict(state["flip_price"])
        if self.lexicon is not None and state.get("lexicon") is not None:
            self.lexicon.load_state_dict(state["lexicon"])
