"""The configuration's sections: one typed dataclass per section (model, objective, data, train),
each declaring, commenting and validating its own keys. A component chosen by kind is a nested
section whose `kind` names a registry entry and whose other keys are that kind's own settings
(`model.chunker: {kind: rl, window: 1}`). The registries' built-in entries are at the end."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

from rltok.config.registry import ConfigError, Registry, Section, unknown

__all__ = ["BOS", "CHUNKERS", "COST_ESTIMATORS", "CREDIT_PRICES", "ConfigError", "DataConfig", "ESTIMATORS", "EOS", "FAMILIES",
           "ModelConfig", "ObjectiveConfig", "PAD", "RATES", "RECIPES", "REWARDS", "Section", "TrainConfig",
           "REGISTRIES", "VOCAB_SIZE", "section_field"]

# Vocabulary: the 256 byte values, then specials. Padded to a multiple of 8 for matmul tiles.
BOS, EOS, PAD = 256, 257, 258
VOCAB_SIZE = 264

# The registries of the components a config names by kind (registry.py). Built-in entries are
# registered at the end of this file.
CHUNKERS = Registry("model.chunker")  # boundary rules (rltok.model.chunkers)
FAMILIES = Registry("model.arch")  # model families: the hierarchy and the flat references
ESTIMATORS = Registry("objective.estimator")  # the boundary policy's gradient estimators
REWARDS = Registry("objective.reward")  # per-position rewards of the boundary decisions
CREDIT_PRICES = Registry("objective.estimator.price")  # what holds the rate inside the flips' credit
# how a price per chunk reaches the policy: a plain setting of every rate control, named here
COST_ESTIMATORS = Registry("objective.rate.cost_estimator")


def section_field(registry: Registry, kind: str) -> Any:
    """A nested component section defaulting to `kind`; the registry says which kinds it takes."""
    return field(default_factory=lambda: registry.settings(kind), metadata={"registry": registry})


def kinds_from_names(obj: Any) -> None:
    """A component field given as its kind's name (`ModelConfig(chunker="fixed")`) becomes that
    kind's default settings."""
    for f in fields(obj):
        registry = f.metadata.get("registry")
        if registry is not None and isinstance(getattr(obj, f.name), str):
            setattr(obj, f.name, registry.settings(getattr(obj, f.name)))


def check(ok: bool, key: str, allowed: str) -> None:
    """One ConfigError naming the key and what it allows."""
    if not ok:
        raise ConfigError(f"{key} must be {allowed}")


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# ---- boundary rules: model.chunker ------------------------------------------------------------

@dataclass
class RLChunkerSettings(Section):
    """The learned policy: an autoregressive Bernoulli over its own last `window` decisions."""
    kind: str = "rl"
    window: int = 1  # w: the policy sees its own last w - 1 decisions (1: independent given the encoder)
    detach: bool = False  # True: the policy and rate losses do not flow into the encoder

    def validate(self, where: str) -> None:
        check(1 <= self.window <= 12, f"{where}.window", "between 1 and 12")


@dataclass
class FixedChunkerSettings(Section):
    kind: str = "fixed"
    stride: int = 5  # a chunk every `stride` bytes

    def validate(self, where: str) -> None:
        check(1 <= self.stride <= 1 << 20, f"{where}.stride", "between 1 and 2^20")


@dataclass
class HNetChunkerSettings(Section):
    kind: str = "hnet"
    ratio_weight: float = 0.03  # H-Net's ratio loss weight

    def validate(self, where: str) -> None:
        check(finite(self.ratio_weight) and self.ratio_weight >= 0, f"{where}.ratio_weight", "a number >= 0")


@dataclass
class GumbelChunkerSettings(Section):
    kind: str = "gumbel"
    temperature: float = 1.0
    prior_weight: float = 1.0  # binomial prior on the boundary count (dynamic pooling)

    def validate(self, where: str) -> None:
        check(finite(self.temperature) and self.temperature > 0, f"{where}.temperature", "a number > 0")
        check(finite(self.prior_weight) and self.prior_weight >= 0, f"{where}.prior_weight", "a number >= 0")


@dataclass
class DynamicPoolingSettings(Section):
    """Dynamic pooling as published: the Gumbel-sigmoid rule with chunks pooled as segment means."""
    kind: str = "dynamic_pooling"
    temperature: float = 0.5  # the original's
    prior_weight: float = 1.0  # binomial prior on the boundary count
    hidden_mult: int = 4  # the scorer's hidden layer, as a multiple of the byte width

    def validate(self, where: str) -> None:
        check(finite(self.temperature) and self.temperature > 0, f"{where}.temperature", "a number > 0")
        check(finite(self.prior_weight) and self.prior_weight >= 0, f"{where}.prior_weight", "a number >= 0")
        check(1 <= self.hidden_mult <= 64, f"{where}.hidden_mult", "between 1 and 64")


@dataclass
class ModelConfig:
    d_byte: int = 128  # width of the byte-level encoder/decoder
    d_chunk: int = 256  # width of the chunk-level main network
    n_heads_byte: int = 4  # attention heads of the byte level
    n_heads_chunk: int = 4  # attention heads of the chunk level
    # most of the depth sits at the chunk level, which runs on ~rate of the bytes: with one byte
    # layer on each side the model trains ~3x faster per byte than a flat byte transformer of
    # the same size (bench/bench_train.py), where 2+2 byte layers gave ~2.3x
    encoder_layers: int = 1
    main_layers: int = 5  # transformer layers of the chunk-level main network
    decoder_layers: int = 1  # byte layers after the upsample
    window: int = 64  # sliding-window size of byte-level attention (blocked kernel when 4*window <= T)
    mlp_ratio: float = 4.0  # MLP width as a multiple of the model width
    max_seq_len: int = 8192  # longest sequence the model accepts
    rope_base: float = 10000.0  # RoPE frequency base (positions are byte positions)
    dropout: float = 0.0  # dropout in every block
    # the model family (FAMILIES): "hourglass", or a reference: "flat" (a byte transformer of
    # d_chunk x flat_layers) or "bpe_token" (a transformer over BPE tokens of the same size)
    arch: str = "hourglass"
    flat_layers: int = 6  # depth of the flat byte model (arch=flat) and the BPE-token model
    # sliding-window size of the flat byte model's attention (arch=flat; 0 = full causal attention):
    # at small width a full-attention flat model spends most of its FLOPs on attention
    flat_window: int = 0
    chunker: Section = section_field(CHUNKERS, "rl")  # the boundary rule: a kind (CHUNKERS) and its settings
    target_rate: float = 0.2  # chunks per byte the rules aim at (the policy's initial bias, the rate loss)
    force_last_boundary: bool = True  # training: the last byte of a window closes a chunk
    value_head: bool = False  # a critic V(h_t) on the encoder state (set by objective.estimator.baseline=...+value)
    # BPE pre-tokenisation for chunker=bpe / arch=bpe_token: "gpt2" (tokens within words; cannot
    # go below ~0.24 tokens/byte on our corpora) or "line" (tokens may span words, not lines)
    bpe_pretokenize: str = "gpt2"
    # BPE vocabulary for arch=bpe_token and chunker=bpe: 0 = sized so its tokens per byte come
    # closest to target_rate (rltok.data.bpe.fit_bpe_to_rate), otherwise exactly this many (>= 256)
    bpe_vocab: int = 0
    # bytes of the training split (random blocks) the BPE learns its merges on; sizing a vocabulary
    # to target_rate also reads a held-out quarter of this, at most 1 MB
    bpe_sample_bytes: int = 4_000_000
    # stages=2: chunks of chunks, grouped into supertokens by a second policy at stage2_target_rate
    stages: int = 1
    stage2_layers: int = 1  # layers of the second stage's main network
    stage2_target_rate: float = 0.33  # supertokens per chunk the second policy aims at
    # a learned vocabulary of chunk contents, hashed (0 = off; docs/CONFIG.md, "Vocabularies for a byte model")
    chunk_vocab: int = 0
    chunk_vocab_max_len: int = 16  # a chunk's last bytes the chunk vocabulary hashes (with its length)
    ngram_vocab: int = 0  # hashed byte n-gram embeddings, ngram_vocab rows per n in ngram_sizes (0 = off)
    ngram_sizes: tuple[int, ...] = (3, 4, 5, 6)  # the n of the hashed n-gram tables
    # Run the chunk-level layers on the batch's real chunks only, packed end to end (attention
    # alone pads them per sequence), instead of padding every sequence to the batch's largest
    # chunk count. The same model; results differ from the padded path in the last float bits.
    pack_chunks: bool = True

    def __post_init__(self) -> None:
        kinds_from_names(self)

    def validate(self) -> None:
        _check_numbers(self, 'model', _MODEL_RANGES)
        if self.d_byte % self.n_heads_byte or self.d_chunk % self.n_heads_chunk:
            raise ConfigError("d_byte/d_chunk must be divisible by their number of heads")
        if (self.d_byte // self.n_heads_byte) % 2 or (self.d_chunk // self.n_heads_chunk) % 2:
            raise ConfigError("head dimension must be even (RoPE rotates pairs)")
        if self.arch not in FAMILIES:
            raise unknown(self.arch, FAMILIES.names(), "", what="model.arch")
        validate_section(self.chunker, CHUNKERS)
        if self.bpe_pretokenize not in ("gpt2", "line"):
            raise unknown(self.bpe_pretokenize, ["gpt2", "line"], "", what="model.bpe_pretokenize")
        if self.bpe_vocab != 0 and self.bpe_vocab < 256:
            raise ConfigError(f"model.bpe_vocab must be 0 (fit to model.target_rate) or >= 256 (the byte alphabet), "
                              f"got {self.bpe_vocab}")
        # a BPE learns at most one merge per byte of its sample, which is model.bpe_sample_bytes
        # rounded up to whole blocks of at most 64 KiB (rltok.data.bpe): refused before any data is read
        most = 256 + self.bpe_sample_bytes + (1 << 16) - 2
        if self.bpe_vocab > most:
            raise ConfigError(f"model.bpe_vocab={self.bpe_vocab} is more tokens than a BPE can learn from "
                              f"model.bpe_sample_bytes={self.bpe_sample_bytes} (one merge per sample byte at most: "
                              f"{most} tokens): lower model.bpe_vocab or raise model.bpe_sample_bytes")
        check(0 < self.target_rate <= 1, "model.target_rate", "in (0, 1]")
        check(self.stages in (1, 2), "model.stages", f"1 or 2, got {self.stages}")
        if self.stages == 2 and (self.arch != "hourglass" or not isinstance(self.chunker, RLChunkerSettings)):
            raise ConfigError("model.stages=2 needs model.arch=hourglass and model.chunker=rl (or a rule built on it)")
        check(0 < self.stage2_target_rate <= 1, "model.stage2_target_rate", "in (0, 1] and model.stage2_layers >= 0")
        if self.ngram_vocab and not self.ngram_sizes:  # (the numbers' ranges are checked above)
            raise ConfigError("model.ngram_vocab must be >= 0 (0 = off) and model.ngram_sizes between 1 and 16")
        if self.chunk_vocab and self.arch != "hourglass":
            raise ConfigError("model.chunk_vocab needs chunks: it is for model.arch=hourglass")
        if self.ngram_vocab and self.arch == "bpe_token":
            raise ConfigError("model.ngram_vocab is for byte models (hourglass, flat); bpe_token has a vocabulary")
        check(0 <= self.dropout < 1, "model.dropout", "in [0, 1)")


def validate_section(section: Section, registry: Registry, where: str | None = None) -> None:
    """A component section's kind is registered and its settings are valid."""
    where = registry.key if where is None else where
    _check_numbers(section, where, {})
    if section.kind not in registry:
        raise unknown(section.kind, registry.names(), "", what=f"{where} kind")
    if not isinstance(section, registry.entry(section.kind).settings):
        raise ConfigError(f"{where} holds settings of another kind than {section.kind!r}")
    section.validate(where)


# ---- the boundary policy's estimators: objective.estimator ------------------------------------

BASELINE_PARTS = ("none", "batch", "batch_loo", "group", "value")  # objective.estimator.baseline's


@dataclass
class ScoreFunctionSettings(Section):
    """REINFORCE on the discounted, baselined reward (the reference recipe)."""
    kind: str = "score_function"
    gamma: float = 0.99  # time discount of the boundary return
    # variance reducers, joined with "+": "batch" (per-position mean over the batch, the reference's:
    # it holds the row's own reward, so the expected gradient shrinks by (n - 1) / n for n rows),
    # "batch_loo" (the mean of the batch's other rows: no shrinking) or "group" (leave-one-out mean
    # over the objective.group_size segmentations of the same sequence), and/or "value" (a critic
    # on the encoder state, advantages by GAE(gamma, gae_lambda)); "none": plain REINFORCE
    baseline: str = "batch"
    gae_lambda: float = 0.95
    normalize_advantages: bool = False

    def baseline_parts(self) -> set[str]:
        return {p.strip() for p in self.baseline.split("+") if p.strip()}

    def validate(self, where: str) -> None:
        parts = self.baseline_parts()
        for part in parts:
            if part not in BASELINE_PARTS:
                raise unknown(part, list(BASELINE_PARTS), "", what=f"{where}.baseline part")
        if "none" in parts and len(parts) > 1:
            raise ConfigError(f"{where}.baseline 'none' cannot be combined with other parts")
        if len(parts & {"batch", "batch_loo", "group"}) > 1:
            raise ConfigError(f"{where}.baseline: choose one of 'batch', 'batch_loo' and 'group'")
        check(finite(self.gamma) and 0 <= self.gamma <= 1, f"{where}.gamma", "in [0, 1]")
        check(finite(self.gae_lambda) and 0 <= self.gae_lambda <= 1, f"{where}.gae_lambda", "in [0, 1]")


@dataclass
class LexiconSettings:
    """The lexicon prior (rltok.objective.lexicon): the flips' credits also count the segmentation's
    code length under a unigram model of the policy's own recent chunks, times `weight` (0 = off)."""
    weight: float = 0.0
    size: int = 1 << 20  # hash-table rows of chunk counts
    decay: float = 0.995  # counts decay by this per training step (old segmentations fade)

    def validate(self, where: str) -> None:
        check(finite(self.weight) and self.weight >= 0, f"{where}.weight", "a number >= 0")
        check(2 <= self.size <= 1 << 28, f"{where}.size", "between 2 and 2^28")
        check(finite(self.decay) and 0 < self.decay <= 1, f"{where}.decay", "in (0, 1]")


@dataclass
class TargetPriceSettings(Section):
    """A price per boundary in units of the normalised credit, raised by dual ascent while the
    expected rate is above model.target_rate (a strong credit, the lexicon's, overpowers a
    separate rate penalty)."""
    kind: str = "target"
    lr: float = 0.2  # dual ascent step per unit of rate error, per step
    gain: float = 5.0  # proportional term added to the price (damps the integral's swing)

    def validate(self, where: str) -> None:
        check(finite(self.lr) and self.lr >= 0, f"{where}.lr", "a number >= 0")
        check(finite(self.gain) and self.gain >= 0, f"{where}.gain", "a number >= 0")


@dataclass
class FlipsSettings(Section):
    """Counterfactual flips: every `stride`-th free decision flipped in one extra no-grad pass after
    the encoder, each credited with the loss change up to the next flip (a truncated
    local-expectation gradient), centred and scaled over the flips."""
    kind: str = "flips"
    stride: int = 16
    # False: no counterfactual model pass, the credit is the lexicon's alone (a decision moves the
    # LM loss by ~0.01 nats and the lexicon's code length by several, and the pass costs about a
    # quarter of a training step's FLOPs)
    model_pass: bool = True
    lexicon: LexiconSettings = field(default_factory=LexiconSettings)
    # what holds the rate inside the credit (CREDIT_PRICES): "none" or "target" (dual ascent
    # towards model.target_rate)
    price: Section = section_field(CREDIT_PRICES, "none")

    def __post_init__(self) -> None:
        kinds_from_names(self)

    def validate(self, where: str) -> None:
        check(1 <= self.stride <= 1 << 20, f"{where}.stride", "between 1 and 2^20")
        _check_numbers(self.lexicon, f"{where}.lexicon", {})
        self.lexicon.validate(f"{where}.lexicon")
        validate_section(self.price, CREDIT_PRICES, f"{where}.price")
        if not self.model_pass and self.lexicon.weight <= 0:
            raise ConfigError(f"{where}.model_pass=false leaves the flips' credit to the lexicon: "
                              f"set {where}.lexicon.weight > 0")


# ---- rate control: objective.rate -------------------------------------------------------------

@dataclass
class RateSettings(Section):
    """What every rate control has: the compute-aware price and how a price reaches the policy
    (docs/CONFIG.md, "The rate")."""
    compute_price: float = 0.0  # bits per MFLOP that a chunk adds (ModelCost.chunk_cost); 0 = off
    cost_estimator: str = "exact"  # COST_ESTIMATORS; the supertoken policy of stages=2 always uses "exact"

    def validate(self, where: str) -> None:
        check(finite(self.compute_price) and self.compute_price >= 0, f"{where}.compute_price", "a number >= 0")
        if self.cost_estimator not in COST_ESTIMATORS:
            raise unknown(self.cost_estimator, COST_ESTIMATORS.names(), "", what=f"{where}.cost_estimator")


@dataclass
class PenaltyRateSettings(RateSettings):
    """The reference's rate loss towards model.target_rate."""
    kind: str = "penalty"
    weight: float = 0.01  # lambda_rate

    def validate(self, where: str) -> None:
        super().validate(where)
        check(finite(self.weight) and self.weight >= 0, f"{where}.weight", "a number >= 0")


@dataclass
class LagrangeRateSettings(RateSettings):
    """A price per chunk (a Lagrange multiplier) raised or lowered by dual ascent every step until
    the expected rate equals model.target_rate."""
    kind: str = "lagrange"
    lr: float = 0.2  # dual ascent step: nats per chunk, per unit of rate error, per step
    gain: float = 5.0  # proportional term added to the price (damps the integral's swing)

    def validate(self, where: str) -> None:
        super().validate(where)
        check(finite(self.lr) and self.lr >= 0, f"{where}.lr", "a number >= 0")
        check(finite(self.gain) and self.gain >= 0, f"{where}.gain", "a number >= 0")


RATES = Registry("objective.rate", base=RateSettings)  # what holds the boundary rate
# every registry, each named by the config path that chooses one of its entries (Registry.key)
REGISTRIES = (CHUNKERS, FAMILIES, ESTIMATORS, REWARDS, RATES, CREDIT_PRICES, COST_ESTIMATORS)


@dataclass
class ObjectiveConfig:
    # Which boundary-learning recipe the keys below start from (RECIPES): "reference" (the published
    # score-function recipe) or "lexicon" (flips credited by the lexicon prior, the rate held inside
    # the credit). Keys set explicitly win.
    recipe: str = "reference"
    alpha: float = 0.1  # weight of the early-exit CE: L = (1-a) CE_final + a CE_early + ...
    # lambda_PG: weight of the score-function estimator's loss, a closed-form chunk price and the
    # supertoken policy (the flips' normalised credits are not weighted: unread there, it is refused)
    pg_weight: float = 0.01
    group_size: int = 1  # K segmentations sampled per sequence, sharing one encoder pass
    # the per-position reward (REWARDS): "early_exit" (CE_early - CE_final) | "final" (-CE_final)
    reward: Section = section_field(REWARDS, "early_exit")
    # how the boundary policy's gradient is estimated (ESTIMATORS): "score_function" | "flips"
    estimator: Section = section_field(ESTIMATORS, "score_function")
    # how the boundary rate is held (RATES): "penalty" | "lagrange" | "none" (no rate term: with
    # compute_price the rate is set by the loss/compute trade-off)
    rate: RateSettings = section_field(RATES, "penalty")
    # the policy settings below: docs/CONFIG.md, "Estimators of the policy gradient"
    policy_start_step: int = 0  # a warm start: the policy is left alone for this many steps
    tokenizer_phase: float = 0.0  # the share of the compute that trains only the encoder side (0 = off)
    policy_until: float = 1.0  # the share of the compute after which the policy settles (1 = never)
    settle_threshold: str = "rate"  # where a settled policy cuts: "rate" (holds its drawn rate) | "half"
    policy_lr_mult: float = 1.0  # the boundary policy's learning rate as a multiple of train.lr

    def __post_init__(self) -> None:
        kinds_from_names(self)

    def validate(self) -> None:
        _check_numbers(self, 'objective', _OBJECTIVE_RANGES)
        if self.recipe not in RECIPES:
            raise unknown(self.recipe, list(RECIPES), "", what="objective.recipe")
        validate_section(self.reward, REWARDS)
        validate_section(self.estimator, ESTIMATORS)
        validate_section(self.rate, RATES)
        est = self.estimator
        if "group" in getattr(est, "baseline_parts", set)() and self.group_size < 2:
            raise ConfigError("objective.estimator.baseline 'group' needs objective.group_size >= 2")
        check(finite(self.tokenizer_phase) and 0 <= self.tokenizer_phase < 1, "objective.tokenizer_phase",
              "a share of the training compute: 0 <= it < 1 (0 = off)")
        check(finite(self.policy_until) and self.tokenizer_phase < self.policy_until <= 1, "objective.policy_until",
              "a share of the training compute after objective.tokenizer_phase: tokenizer_phase < it <= 1 (1 = never settles)")
        check(self.settle_threshold in ("rate", "half"), "objective.settle_threshold", "'rate' or 'half'")
        check(finite(self.policy_lr_mult) and self.policy_lr_mult > 0, "objective.policy_lr_mult", "a number > 0")
        check(finite(self.pg_weight) and self.pg_weight >= 0, "objective.pg_weight", "a number >= 0")
        check(finite(self.alpha) and 0 <= self.alpha <= 1, "objective.alpha", "in [0, 1]")


@dataclass
class DataConfig:
    # "stdlib" (this Python's standard library source), a file, a folder, a glob, "hf:name[:config]",
    # a folder written by `rltok prepare` (read from its shards), or "mix:DIR=W,DIR=W" (prepared
    # folders drawn with weights W)
    train: str = "stdlib"
    # explicit validation data; empty: a folder with train*/val* files uses them, otherwise about
    # `val_fraction` of the source is held out: whole documents (chosen by a hash of their bytes)
    # from 20 documents up, otherwise the last `val_fraction` of every document
    val: str = ""
    val_fraction: float = 0.02  # share of each source's bytes held out as val when it has no val split
    max_bytes: int = 0  # cap on bytes read (0 = no cap); useful for hub datasets
    hf_text_field: str = "text"  # hub datasets: the record field holding the text
    # an unprepared source of more bytes than this on disk (a hub dataset: unless max_bytes caps
    # it below) is prepared into byte shards under cache_dir on first use, not read into memory
    # (0 = never)
    prepare_above: int = 1_000_000_000
    cache_dir: str = ""  # empty: $RLTOK_CACHE, else ~/.cache/rltok

    def validate(self) -> None:
        _check_numbers(self, 'data', _DATA_RANGES)
        check(0 < self.val_fraction < 0.5, "data.val_fraction", "in (0, 0.5)")


LR_SCHEDULES = ("cosine", "wsd")  # train.lr_schedule (rltok.training.schedule.lr_at)
OPTIMIZER_KERNELS = ("auto", "loop", "foreach", "fused")  # train.optimizer_kernel (trainer.make_optimizer)


@dataclass
class TrainConfig:
    seq_len: int = 512  # bytes per training window (the model reads seq_len, predicts the next byte of each)
    batch_size: int = 8  # windows per micro-batch (with group_size K: segmentations, batch_size / K windows)
    grad_accum: int = 1  # micro-batches per optimiser step
    max_steps: int = 400  # training steps (under flops_budget: a cap)
    lr: float = 2e-3  # peak learning rate of AdamW
    min_lr_ratio: float = 0.1  # the rate decays to lr x this
    warmup_steps: int = 50  # linear warm-up steps (see warmup_frac)
    # Warm-up as a share of the run's steps (0: warmup_steps as given). Under a FLOPs budget the
    # share is of the steps the budget plans, so runs of any length warm up alike.
    warmup_frac: float = 0.0
    weight_decay: float = 0.1  # AdamW weight decay (matrices only)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas
    grad_clip: float = 1.0  # the gradients' global norm is clipped to this (> 0)
    eval_every: int = 100  # steps between val evaluations
    eval_batches: int = 8  # val batches per evaluation
    log_every: int = 10  # steps between log records
    checkpoint_every: int = 200  # steps between checkpoints
    keep_checkpoints: int = 3  # newest checkpoints kept in <out_dir>/checkpoints (0 = all)
    seed: int = 0  # seeds the model's init, the data order and the boundary draws
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N" | "mps"
    dtype: str = "auto"  # "auto" (bf16 on CUDA, fp32 otherwise) | "fp32" | "bf16"
    compile: bool = False  # torch.compile the training module
    out_dir: str = "runs/default"  # the run folder
    threads: int = 0  # torch CPU threads (0 = torch's default)
    # batch_size is per rank (torchrun); fsdp: FSDP2 instead of DDP (docs/DISTRIBUTED.md, "Options")
    fsdp: bool = False
    ddp_find_unused: bool = False  # DDP find_unused_parameters, for configs with idle parameters
    # peak FLOP/s of one device for the MFU log (0: measure a matmul at start-up)
    peak_flops: float = 0.0
    # Stop after this many training FLOPs, each step counted at the chunks (tokens) per byte it
    # drew, and decay the learning rate by FLOPs spent instead of steps (0 = off; max_steps still
    # caps the run). Equal training compute for rules whose rate is not known in advance. The
    # budget is checked before each step, so the last step may overshoot it (train_flops says by
    # how much); a skipped non-finite step is not charged.
    flops_budget: float = 0.0
    # metric sinks besides metrics.jsonl (docs/CONFIG.md, "What a run writes"); wandb: a project ("" = off)
    tensorboard: bool = False
    wandb: str = ""  # (see above)
    # a resume that changes max_steps: "keep" (no jump in the learning rate) | "restart" (docs/CONFIG.md)
    schedule_on_resume: str = "keep"
    lr_schedule: str = "cosine"  # LR_SCHEDULES (docs/CONFIG.md, "The learning-rate schedule")
    cooldown_frac: float = 0.2  # lr_schedule=wsd: the share of the steps the final cool-down spans
    optimizer_kernel: str = "auto"  # OPTIMIZER_KERNELS (docs/CONFIG.md, "The optimiser's kernel")

    @property
    def constant_phase(self) -> bool:
        """Whether the learning rate holds at lr until a cool-down ("wsd"): the state before the
        cool-down then serves every longer budget."""
        return self.lr_schedule == "wsd"

    def warmup_for(self, steps: int) -> int:
        """Warm-up steps of a run planned at `steps` steps: warmup_frac of them (at least 1) when
        set, else warmup_steps."""
        return max(1, round(self.warmup_frac * steps)) if self.warmup_frac else self.warmup_steps

    def validate(self) -> None:
        _check_numbers(self, 'train', _TRAIN_RANGES)  # (the counts' ranges too; no number is nan or inf)
        check(0 <= self.min_lr_ratio <= 1, "train.min_lr_ratio", "in [0, 1]")
        check(0 <= self.warmup_frac < 1, "train.warmup_frac", f"in [0, 1), got {self.warmup_frac}")
        if self.batch_size * self.seq_len > MAX_BATCH_BYTES:
            raise ConfigError(f"train.batch_size x train.seq_len = {self.batch_size * self.seq_len:,} bytes per "
                              f"micro-batch, more than {MAX_BATCH_BYTES:,} would fit in memory; lower one of them")
        if not self.out_dir.strip():
            raise ConfigError("train.out_dir must not be empty")
        check(self.dtype in ("auto", "fp32", "bf16"), "train.dtype", f"auto, fp32 or bf16, got {self.dtype!r}")
        check(self.lr > 0, "train.lr", f"a positive number, got {self.lr}")
        check(self.peak_flops >= 0, "train.peak_flops", ">= 0 (0 = measure)")
        check(0 <= self.flops_budget <= MAX_FLOPS_BUDGET, "train.flops_budget", f"in [0, {MAX_FLOPS_BUDGET:.0e}] (0 = "
              f"off; more is beyond any run a computer can finish), got {self.flops_budget}")
        check(self.schedule_on_resume in ("keep", "restart"), "train.schedule_on_resume",
              f"keep or restart, got {self.schedule_on_resume!r}")
        check(self.optimizer_kernel in OPTIMIZER_KERNELS, "train.optimizer_kernel",
              f"one of {', '.join(OPTIMIZER_KERNELS)}, got {self.optimizer_kernel!r}")
        check(self.lr_schedule in LR_SCHEDULES, "train.lr_schedule",
              f"{' or '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        check(0 < self.cooldown_frac <= 1, "train.cooldown_frac", f"in (0, 1], got {self.cooldown_frac}")


_PLAIN_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool}


def _check_numbers(section: Any, name: str, ranges: dict[str, tuple[float, float]]) -> None:
    """Every number of a section is a number (not true/false), finite, and in its range where
    `ranges` gives one ([low, high], both included): checked before any other rule reads it, so
    no value can divide by zero, overflow or ask for more memory than exists."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        key = f"{name}.{f.name}"
        if f.type in ("int", "float") and isinstance(value, bool):
            raise ConfigError(f"{key} expects a number ({f.type}), got {str(value).lower()}")
        # a config built in Python is not coerced as overrides and files are: its types are checked here
        declared = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")  # a plugin's may be a type
        expected = _PLAIN_TYPES.get(declared)
        if expected is not None and not isinstance(value, expected):
            raise ConfigError(f"{key} expects {declared}, got {type(value).__name__} {value!r}")
        if declared.startswith("tuple["):
            if isinstance(value, list):  # the declared kind, as a file gives it
                value = tuple(value)
                setattr(section, f.name, value)
            if not isinstance(value, tuple):
                raise ConfigError(f"{key} expects a {declared}, got {type(value).__name__} {value!r}")
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not math.isfinite(v):
                raise ConfigError(f"{key} must be a finite number, got {v}")
            low, high = ranges.get(f.name, (-math.inf, math.inf))
            if v < low:
                raise ConfigError(f"{key} must be >= {_shown(low)} (at most {_shown(high)}), got {_shown(v)}")
            if v > high:
                raise ConfigError(f"{key} must be <= {_shown(high)} (at least {_shown(low)}), got {_shown(v)}")


def _shown(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


# The largest values a key may take: beyond them a model or batch cannot fit any machine's memory
# (or an index overflows); what runs and what fits is then for the device to say.
_BIG = float(1 << 40)  # steps and counts of things that cost no memory each
_MODEL_RANGES = {"d_byte": (1, 65536), "d_chunk": (1, 65536), "n_heads_byte": (1, 1024), "n_heads_chunk": (1, 1024),
                 "encoder_layers": (0, 1024), "main_layers": (0, 1024), "decoder_layers": (0, 1024),
                 "flat_layers": (0, 1024), "flat_window": (0, 1 << 24), "stage2_layers": (0, 1024), "window": (1, 1 << 24),
                 "mlp_ratio": (1e-6, 1024), "max_seq_len": (1, 1 << 24), "rope_base": (1, 1e12),
                 "bpe_vocab": (0, 1 << 22), "bpe_sample_bytes": (1, 1 << 50), "chunk_vocab": (0, 1 << 26),
                 "chunk_vocab_max_len": (1, 1024), "ngram_vocab": (0, 1 << 26), "ngram_sizes": (1, 16)}
_OBJECTIVE_RANGES = {"group_size": (1, 1024), "policy_start_step": (0, _BIG), "policy_lr_mult": (0, 1e6)}
_DATA_RANGES = {"max_bytes": (0, 1 << 50), "prepare_above": (0, 1 << 62)}
_TRAIN_RANGES = {"seq_len": (1, 1 << 24), "batch_size": (1, 1 << 20), "grad_accum": (1, 1 << 20),
                 "max_steps": (1, _BIG), "warmup_steps": (0, _BIG), "weight_decay": (0, 1e3), "betas": (0, 0.999999),
                 "grad_clip": (1e-12, 1e12), "eval_every": (1, _BIG), "eval_batches": (1, 1 << 20),
                 "log_every": (1, _BIG), "checkpoint_every": (1, _BIG), "keep_checkpoints": (0, 1 << 20),
                 "seed": (0, (1 << 32) - 1), "threads": (0, 1024)}
MAX_BATCH_BYTES = 1 << 32  # train.batch_size x train.seq_len: bytes of one micro-batch
# training FLOPs: a hundred times the largest runs yet; a budget above it would train without end
MAX_FLOPS_BUDGET = 1e27


# Boundary-learning recipes (objective.recipe): the objective keys each one sets.
RECIPES: dict[str, dict[str, Any]] = {
    "reference": {"estimator": {"kind": "score_function"}},
    "lexicon": {"estimator": {"kind": "flips", "model_pass": False, "lexicon": {"weight": 1.0},
                              "price": {"kind": "target"}}},
}


# ---- the built-in components of each registry -------------------------------------------------
# (settings above; components imported from the model and objective layers when first built)

_C = "rltok.model.chunkers:"
CHUNKERS.register("rl", _C + "RLPolicy", RLChunkerSettings)
CHUNKERS.register("fixed", _C + "FixedChunker", FixedChunkerSettings)
CHUNKERS.register("uniform", _C + "UniformChunker")
CHUNKERS.register("whitespace", _C + "WhitespaceChunker")
CHUNKERS.register("entropy", _C + "EntropyChunker")
CHUNKERS.register("hnet", _C + "HNetRouter", HNetChunkerSettings)
CHUNKERS.register("gumbel", _C + "GumbelChunker", GumbelChunkerSettings)
CHUNKERS.register("dynamic_pooling", _C + "DynamicPooling", DynamicPoolingSettings)
CHUNKERS.register("bpe", _C + "BPEChunker")

FAMILIES.register("hourglass", "rltok.model.hourglass:HourglassLM")
FAMILIES.register("flat", "rltok.model.flat:FlatByteLM")
FAMILIES.register("bpe_token", "rltok.model.token_lm:BPETokenLM")

ESTIMATORS.register("score_function", "rltok.objective.score_function:ScoreFunction", ScoreFunctionSettings)
ESTIMATORS.register("flips", "rltok.objective.flips_estimator:Flips", FlipsSettings)

_R = "rltok.objective.rewards:"
REWARDS.register("early_exit", _R + "EarlyExit")
REWARDS.register("final", _R + "Final")

RATES.register("penalty", "rltok.objective.rate:RatePenalty", PenaltyRateSettings)
RATES.register("lagrange", "rltok.objective.rate:LagrangeRate", LagrangeRateSettings)
RATES.register("none", "rltok.objective.rate:NoRateControl")

CREDIT_PRICES.register("none", None)
CREDIT_PRICES.register("target", "rltok.objective.credit_prices:TargetCreditPrice", TargetPriceSettings)

COST_ESTIMATORS.register("exact", "rltok.objective.rate:ClosedFormChunkPrice")
