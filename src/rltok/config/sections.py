"""The configuration's sections: one typed dataclass per component (model, objective, data,
train), each declaring, commenting and validating its own keys, and the boundary-learning recipes
the objective section starts from."""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

# Vocabulary: the 256 byte values, then specials. Padded to a multiple of 8 for matmul tiles.
BOS, EOS, PAD = 256, 257, 258
VOCAB_SIZE = 264
# model.chunker: the boundary rules rltok.model.chunkers.build_chunker makes
CHUNKERS = ("rl", "fixed", "uniform", "whitespace", "entropy", "hnet", "gumbel", "bpe")


class ConfigError(ValueError):
    """A user mistake in a configuration (unknown key, bad value)."""


@dataclass
class ModelConfig:
    d_byte: int = 128  # width of the byte-level encoder/decoder
    d_chunk: int = 256  # width of the chunk-level main network
    n_heads_byte: int = 4
    n_heads_chunk: int = 4
    # most of the depth sits at the chunk level, which runs on ~rate of the bytes: with one byte
    # layer on each side the model trains ~3x faster per byte than a flat byte transformer of
    # the same size (bench/bench_train.py), where 2+2 byte layers gave ~2.3x
    encoder_layers: int = 1
    main_layers: int = 5
    decoder_layers: int = 1
    window: int = 64  # sliding-window size of byte-level attention (blocked kernel when 4*window <= T)
    mlp_ratio: float = 4.0
    max_seq_len: int = 8192  # longest sequence the model accepts
    rope_base: float = 10000.0
    dropout: float = 0.0
    # "hourglass" (the hierarchical model), "flat" (byte transformer of d_chunk x flat_layers),
    # "bpe_token" (transformer over BPE tokens of the same size); the last two are references
    arch: str = "hourglass"
    flat_layers: int = 6
    # boundary rule: rl (learned policy) | fixed | uniform | whitespace | entropy | hnet | gumbel | bpe
    chunker: str = "rl"
    policy_window: int = 1  # w: how many of its own previous decisions the policy sees
    policy_detach: bool = False  # True: policy/rate losses do not flow into the encoder
    target_rate: float = 0.2  # used to initialise the policy bias (and by the rate loss)
    fixed_stride: int = 5
    force_last_boundary: bool = True  # training: the last byte of a window closes a chunk
    value_head: bool = False  # a critic V(h_t) on the encoder state (set by objective.baseline=...+value)
    hnet_ratio_weight: float = 0.03  # H-Net ratio loss weight
    gumbel_temperature: float = 1.0
    gumbel_prior_weight: float = 1.0  # binomial prior on the boundary count (dynamic pooling)
    # BPE pre-tokenisation for chunker=bpe / arch=bpe_token: "gpt2" (tokens within words; cannot
    # go below ~0.24 tokens/byte on our corpora) or "line" (tokens may span words, not lines)
    bpe_pretokenize: str = "gpt2"
    # BPE vocabulary for arch=bpe_token and chunker=bpe: 0 = sized so its tokens per byte come
    # closest to target_rate (rltok.data.bpe.fit_bpe_to_rate; with gpt2 pre-tokenisation 0.2 is out
    # of reach, so the largest vocabulary the 4 MB sample supports), otherwise exactly this many
    # tokens (>= 256, the byte alphabet), trained on the same sample; target_rate is then unused.
    bpe_vocab: int = 0
    # stages=2: chunks of chunks. A chunk-level encoder (stage2_layers, full causal attention),
    # a second RL policy that groups chunks into supertokens at stage2_target_rate supertokens
    # per chunk, the main network over supertokens, then a chunk-level decoder (stage2_layers).
    stages: int = 1
    stage2_layers: int = 1
    stage2_target_rate: float = 0.33
    # A learned vocabulary of chunks: the content of each chunk (its last chunk_vocab_max_len
    # bytes and its length) is hashed into chunk_vocab embeddings added to the chunk vector before
    # the main network (0 = off). Parameters and memory, no FLOPs: recurring chunks get their own
    # vector, so where the boundaries fall starts to matter (rltok.model.chunk_vocab).
    chunk_vocab: int = 0
    chunk_vocab_max_len: int = 16
    # Hashed byte n-gram embeddings (Byte Latent Transformer): for each byte, the n-grams ending at
    # it (n in ngram_sizes) are hashed into ngram_vocab rows per n, and their vectors are added to
    # the byte embedding (0 = off). On the hourglass and on the flat byte model; a lookup, no
    # matrix product (rltok.model.ngram_embed).
    ngram_vocab: int = 0
    ngram_sizes: tuple[int, ...] = (3, 4, 5, 6)
    # Run the chunk-level layers on the batch's real chunks only, packed end to end (attention
    # alone pads them per sequence), instead of padding every sequence to the batch's largest
    # chunk count. The same model; results differ from the padded path in the last float bits.
    pack_chunks: bool = True

    def validate(self) -> None:
        _check_numbers(self, 'model', _MODEL_RANGES)
        if self.d_byte % self.n_heads_byte or self.d_chunk % self.n_heads_chunk:
            raise ConfigError("d_byte/d_chunk must be divisible by their number of heads")
        if (self.d_byte // self.n_heads_byte) % 2 or (self.d_chunk // self.n_heads_chunk) % 2:
            raise ConfigError("head dimension must be even (RoPE rotates pairs)")
        chunkers = CHUNKERS
        if self.chunker not in chunkers:
            raise _unknown(self.chunker, list(chunkers), "", what="model.chunker")
        if self.bpe_pretokenize not in ("gpt2", "line"):
            raise _unknown(self.bpe_pretokenize, ["gpt2", "line"], "", what="model.bpe_pretokenize")
        if self.bpe_vocab != 0 and self.bpe_vocab < 256:
            raise ConfigError(f"model.bpe_vocab must be 0 (fit to model.target_rate) or >= 256 (the byte alphabet), "
                              f"got {self.bpe_vocab}")
        if self.arch not in ("hourglass", "flat", "bpe_token"):
            raise _unknown(self.arch, ["hourglass", "flat", "bpe_token"], "", what="model.arch")
        if not 0 < self.target_rate <= 1:
            raise ConfigError("model.target_rate must be in (0, 1]")
        if self.stages not in (1, 2):
            raise ConfigError(f"model.stages must be 1 or 2, got {self.stages}")
        if self.stages == 2 and (self.arch != "hourglass" or self.chunker != "rl"):
            raise ConfigError("model.stages=2 needs model.arch=hourglass and model.chunker=rl")
        if not 0 < self.stage2_target_rate <= 1 or self.stage2_layers < 0:
            raise ConfigError("model.stage2_target_rate must be in (0, 1] and model.stage2_layers >= 0")
        if not 1 <= self.policy_window <= 12:
            raise ConfigError("model.policy_window must be between 1 and 12")
        if self.chunk_vocab < 0 or self.chunk_vocab_max_len < 1:
            raise ConfigError("model.chunk_vocab must be >= 0 (0 = off) and model.chunk_vocab_max_len >= 1")
        if self.ngram_vocab < 0 or (self.ngram_vocab and (not self.ngram_sizes or min(self.ngram_sizes) < 1
                                                          or max(self.ngram_sizes) > 16)):
            raise ConfigError("model.ngram_vocab must be >= 0 (0 = off) and model.ngram_sizes between 1 and 16")
        if self.chunk_vocab and self.arch != "hourglass":
            raise ConfigError("model.chunk_vocab needs chunks: it is for model.arch=hourglass")
        if self.ngram_vocab and self.arch == "bpe_token":
            raise ConfigError("model.ngram_vocab is for byte models (hourglass, flat); bpe_token has a vocabulary")
        if self.window < 1 or self.fixed_stride < 1:
            raise ConfigError("model.window and model.fixed_stride must be >= 1")
        for name in ("d_byte", "d_chunk", "n_heads_byte", "n_heads_chunk", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1")
        for name in ("encoder_layers", "main_layers", "decoder_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"model.{name} must be >= 0")
        if not 0 <= self.dropout < 1:
            raise ConfigError("model.dropout must be in [0, 1)")
        if self.mlp_ratio <= 0:
            raise ConfigError("model.mlp_ratio must be > 0")


# the synthetic rewards of the plumbing checks (rltok.objective.rewards, Reward.probe): no model pass needed
PROBE_REWARDS = ("whitespace_probe", "token_probe")


@dataclass
class ObjectiveConfig:
    # Which boundary-learning recipe the keys below start from (RECIPES): "reference" (the
    # published one: score function on the early-exit reward, discount, batch baseline, rate
    # penalty) or "lexicon" (flips credited by the lexicon prior alone, no extra model pass, the
    # rate held inside the credit: the one that learns word boundaries at CPU scale). Keys set
    # explicitly win.
    recipe: str = "reference"
    alpha: float = 0.1  # weight of the early-exit CE: L = (1-a) CE_final + a CE_early + ...
    pg_weight: float = 0.01  # lambda_PG
    rate_weight: float = 0.01  # lambda_rate
    gamma: float = 0.99  # time discount of the boundary return
    # variance reducers, joined with "+": "batch" (per-position batch mean) or "group" (leave-one-
    # out mean over the group_size segmentations of the same sequence), and/or "value" (a critic
    # on the encoder state, advantages by GAE(gamma, gae_lambda)); "none" for plain REINFORCE
    baseline: str = "batch"
    group_size: int = 1  # K segmentations sampled per sequence, sharing one encoder pass
    gae_lambda: float = 0.95
    # "early_exit": CE_early - CE_final | "final": -CE_final | plumbing checks with a synthetic
    # reward: "whitespace_probe" (cut on whitespace), "token_probe" (cut where a Python token starts)
    reward: str = "early_exit"
    normalize_advantages: bool = False
    # How the boundary rate is held. "penalty": the reference's rate loss (weight rate_weight)
    # towards model.target_rate. "lagrange": a price per chunk (a Lagrange multiplier) raised or
    # lowered by dual ascent every step until the expected rate equals model.target_rate.
    # "none": no rate term, so with compute_price the rate is set by the loss/compute trade-off.
    rate_control: str = "penalty"
    lagrange_lr: float = 0.2  # dual ascent step: nats per chunk, per unit of rate error, per step
    lagrange_gain: float = 5.0  # proportional term added to the price (damps the integral's swing)
    # The compute-aware objective: every chunk costs compute_price bits per million forward FLOPs
    # that one more chunk adds to the chunk-level network (rltok.model.flops.chunk_cost_flops); 0 = off.
    compute_price: float = 0.0
    # How a price per chunk (compute_price, the Lagrange multiplier) reaches the policy: "exact"
    # (its expected cost is p_t x price, differentiated in closed form: no variance; the same
    # expected gradient as "reward" for policy_window=1, while for w > 1 it leaves out how b_t
    # changes the later decisions' costs) or "reward" (subtracted from the sampled reward at each
    # boundary and estimated by the score function, with the other rewards' baseline/discount).
    # The supertoken policy of stages=2 (w = 1) always uses "exact".
    cost_estimator: str = "exact"
    # How the boundary policy's gradient is estimated. "score_function": REINFORCE on the
    # discounted, baselined reward above (the reference recipe). "flips": counterfactual flips —
    # one extra pass without gradients through the chunk level and decoder with every
    # flip_stride-th free decision flipped; each flipped decision gets the loss change up to the
    # next flip as its own credit (a truncated local-expectation gradient, objective/flips.py),
    # centred and scaled over the flips. Exact in expectation for policy_window=1 when a
    # decision's effect ends within flip_stride bytes.
    estimator: str = "score_function"
    flip_stride: int = 16
    # Hold the rate inside the flips' credit: a price per boundary, in units of the normalised
    # credit, raised by dual ascent (lagrange_lr, lagrange_gain) while the expected rate is above
    # model.target_rate. A strong credit (the lexicon's) overpowers the separate rate penalty.
    flip_rate_control: bool = False
    # What that price answers to: "target" (dual ascent towards model.target_rate) or "loss_slope"
    # (no rate target: a price in nats per boundary read from the run, the slope of its training
    # loss against ln FLOPs spent times d ln(FLOPs per byte)/d rate: what the compute a boundary
    # costs would buy as more data; the credits are then not centred, so the rate is what the
    # credit and the price settle on).
    rate_price: str = "target"
    # Warm start: for this many steps the policy is left alone (no policy, rate or price term),
    # so an RL policy draws its initial i.i.d. boundaries at the target rate while the
    # chunk-level path learns to use chunks; then it learns where to cut.
    policy_start_step: int = 0
    # Tokenizer phase: the first share of the training compute (of train.flops_budget, or of the
    # FLOPs max_steps full steps cost at the target rate) runs only the encoder, the early-exit
    # head and the boundary rule: the policy learns from the lexicon's credit and the encoder from
    # the early-exit loss, at about a quarter of a full step's FLOPs per byte (counted in the
    # budget). Then everything trains together on the rule found. A learned rule (chunker=rl)
    # needs a credit that does not read the full model (the lexicon recipe); under a fixed rule
    # the phase trains the encoder alone (the control for what the cheap steps give). 0 = off.
    tokenizer_phase: float = 0.0
    policy_lr_mult: float = 1.0  # the boundary policy's learning rate as a multiple of train.lr
    # A lexicon prior (rl/lexicon.py, flips estimator only): the flips' credits also count the
    # code length of the segmentation under a unigram model of chunk contents learned from the
    # policy's own recent chunks, times lexicon_weight (nats of lexicon code per nat of LM loss;
    # 0 = off). It rewards cutting the same strings the same way: minimum description length.
    lexicon_weight: float = 0.0
    # False: no counterfactual model pass, the flips' credit is the lexicon's alone (a decision
    # moves the LM loss by ~0.01 nats and the lexicon's code length by several, and the pass costs
    # about a quarter of a training step's FLOPs)
    flip_model_pass: bool = True
    lexicon_size: int = 1 << 20  # hash-table rows of chunk counts
    lexicon_decay: float = 0.995  # counts decay by this per training step (old segmentations fade)

    def baseline_parts(self) -> set[str]:
        return {p.strip() for p in self.baseline.split("+") if p.strip()}

    def validate(self) -> None:
        _check_numbers(self, 'objective', _OBJECTIVE_RANGES)
        if self.recipe not in RECIPES:
            raise _unknown(self.recipe, list(RECIPES), "", what="objective.recipe")
        parts = self.baseline_parts()
        for part in parts:
            if part not in ("none", "batch", "group", "value"):
                raise _unknown(part, ["none", "batch", "group", "value"], "", what="objective.baseline part")
        if "none" in parts and len(parts) > 1:
            raise ConfigError("objective.baseline 'none' cannot be combined with other parts")
        if {"batch", "group"} <= parts:
            raise ConfigError("objective.baseline: choose one of 'batch' and 'group'")
        if "group" in parts and self.group_size < 2:
            raise ConfigError("objective.baseline 'group' needs objective.group_size >= 2")
        if self.group_size < 1:
            raise ConfigError("objective.group_size must be >= 1")
        if not 0 <= self.gae_lambda <= 1:
            raise ConfigError("objective.gae_lambda must be in [0, 1]")
        if self.rate_control not in ("penalty", "lagrange", "none"):
            raise _unknown(self.rate_control, ["penalty", "lagrange", "none"], "", what="objective.rate_control")
        if self.cost_estimator not in ("exact", "reward"):
            raise _unknown(self.cost_estimator, ["exact", "reward"], "", what="objective.cost_estimator")
        if self.compute_price < 0 or self.lagrange_lr < 0 or self.lagrange_gain < 0:
            raise ConfigError("objective.compute_price, lagrange_lr and lagrange_gain must be >= 0")
        if self.reward not in ("early_exit", "final", *PROBE_REWARDS):
            raise _unknown(self.reward, ["early_exit", "final", *PROBE_REWARDS], "", what="objective.reward")
        if self.estimator not in ("score_function", "flips"):
            raise _unknown(self.estimator, ["score_function", "flips"], "", what="objective.estimator")
        if self.rate_price not in ("target", "loss_slope"):
            raise _unknown(self.rate_price, ["target", "loss_slope"], "", what="objective.rate_price")
        if self.rate_price == "loss_slope" and not (self.estimator == "flips" and self.flip_rate_control):
            raise ConfigError("objective.rate_price=loss_slope prices the flips' credit: it needs "
                              "objective.estimator=flips and objective.flip_rate_control=true (the lexicon recipe)")
        if not 0 <= self.tokenizer_phase < 1:
            raise ConfigError("objective.tokenizer_phase is a share of the training compute: 0 <= it < 1 (0 = off)")
        if self.flip_stride < 1 or self.policy_start_step < 0 or self.policy_lr_mult <= 0:
            raise ConfigError("objective.flip_stride >= 1, policy_start_step >= 0 and "
                              "policy_lr_mult > 0 are required")
        if self.lexicon_weight < 0 or self.lexicon_size < 2 or not 0 < self.lexicon_decay <= 1:
            raise ConfigError("objective.lexicon_weight >= 0, lexicon_size >= 2 and "
                              "lexicon_decay in (0, 1] are required")
        if self.estimator == "flips" and "value" in self.baseline_parts():
            raise ConfigError("objective.baseline 'value' is the score function's critic: the flips' credit is "
                              "per decision already (use baseline=batch with estimator=flips)")
        if not self.flip_model_pass and self.lexicon_weight <= 0:
            raise ConfigError("objective.flip_model_pass=false leaves the flips' credit to the lexicon: "
                              "set objective.lexicon_weight > 0")
        if self.lexicon_weight > 0 and self.estimator != "flips":
            raise ConfigError("objective.lexicon_weight needs objective.estimator=flips (the lexicon's credit is "
                              "the local code-length change of each flipped decision)")
        if not 0 <= self.gamma <= 1:
            raise ConfigError("objective.gamma must be in [0, 1]")
        if not 0 <= self.alpha <= 1:
            raise ConfigError("objective.alpha must be in [0, 1]")


@dataclass
class DataConfig:
    # "stdlib" (this Python's standard library source), a file, a folder, a glob, "hf:name[:config]",
    # a folder written by `rltok prepare` (read from its shards), or "mix:DIR=W,DIR=W" (prepared
    # folders drawn with weights W)
    train: str = "stdlib"
    # explicit validation data; empty: a folder with train*/val* files uses them, otherwise
    # the last `val_fraction` of every document is held out
    val: str = ""
    val_fraction: float = 0.02
    max_bytes: int = 0  # cap on bytes read (0 = no cap); useful for hub datasets
    hf_text_field: str = "text"
    # an unprepared source of more bytes than this on disk (a hub dataset: unless max_bytes caps
    # it below) is prepared into byte shards under cache_dir on first use, not read into memory
    # (0 = never)
    prepare_above: int = 1_000_000_000
    cache_dir: str = ""  # empty: $RLTOK_CACHE, else ~/.cache/rltok

    def validate(self) -> None:
        _check_numbers(self, 'data', _DATA_RANGES)
        if not 0 < self.val_fraction < 0.5:
            raise ConfigError("data.val_fraction must be in (0, 0.5)")
        if self.prepare_above < 0:
            raise ConfigError("data.prepare_above must be >= 0 (0 = never prepare into the cache)")


@dataclass
class TrainConfig:
    seq_len: int = 512
    batch_size: int = 8
    grad_accum: int = 1
    max_steps: int = 400
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 10
    checkpoint_every: int = 200
    keep_checkpoints: int = 3  # newest checkpoints kept in <out_dir>/checkpoints (0 = all)
    seed: int = 0
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N" | "mps"
    dtype: str = "auto"  # "auto" (bf16 on CUDA, fp32 otherwise) | "fp32" | "bf16"
    compile: bool = False
    out_dir: str = "runs/default"
    threads: int = 0  # torch CPU threads (0 = torch's default)
    # Data parallelism (launch with torchrun): batch_size is per rank, so the global batch is
    # batch_size x ranks x grad_accum. fsdp: shard parameters, gradients and optimiser state
    # with FSDP2 instead of replicating them (DDP), for models that do not fit one device.
    fsdp: bool = False
    ddp_find_unused: bool = False  # DDP find_unused_parameters, for configs with idle parameters
    # peak FLOP/s of one device for the MFU log (0: measure a matmul at start-up)
    peak_flops: float = 0.0
    # Stop after this many training FLOPs, each step counted at the chunks (tokens) per byte it
    # drew, and decay the learning rate by FLOPs spent instead of steps (0 = off; max_steps still
    # caps the run). Equal training compute for rules whose rate is not known in advance.
    flops_budget: float = 0.0
    # Metric sinks besides metrics.jsonl, optional extras (pip install 'rltok[track]'): TensorBoard
    # event files in <out_dir>/tensorboard, and a Weights & Biases run in the project named here
    # ("" = off; WANDB_MODE=offline keeps it on this machine).
    tensorboard: bool = False
    wandb: str = ""
    # When a resume changes max_steps after warm-up: "keep" (the learning rate goes on from the
    # value it had and decays to the minimum by the new max_steps: no jump) or "restart" (the
    # cosine decay starts again from train.lr).
    schedule_on_resume: str = "keep"

    def validate(self) -> None:
        _check_numbers(self, 'train', _TRAIN_RANGES)
        for name in ("seq_len", "batch_size", "grad_accum", "max_steps", "eval_batches", "log_every",
                     "eval_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1")
        for name in ("warmup_steps", "keep_checkpoints", "threads", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("train.min_lr_ratio must be in [0, 1]")
        if self.grad_clip <= 0:
            raise ConfigError("train.grad_clip must be > 0")
        if self.batch_size * self.seq_len > MAX_BATCH_BYTES:
            raise ConfigError(f"train.batch_size x train.seq_len = {self.batch_size * self.seq_len:,} bytes per "
                              f"micro-batch, more than {MAX_BATCH_BYTES:,} would fit in memory; lower one of them")
        if not self.out_dir.strip():
            raise ConfigError("train.out_dir must not be empty")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"train.dtype must be auto, fp32 or bf16, got {self.dtype!r}")
        if not 0 < self.lr < float("inf"):  # also rejects nan
            raise ConfigError(f"train.lr must be a positive number, got {self.lr}")
        if not 0 <= self.peak_flops < float("inf"):
            raise ConfigError("train.peak_flops must be >= 0 (0 = measure)")
        if not 0 <= self.flops_budget < float("inf"):
            raise ConfigError("train.flops_budget must be >= 0 (0 = off)")
        if self.schedule_on_resume not in ("keep", "restart"):
            raise ConfigError(f"train.schedule_on_resume must be keep or restart, got {self.schedule_on_resume!r}")


def _check_numbers(section: Any, name: str, ranges: dict[str, tuple[float, float]]) -> None:
    """Every number of a section is a number (not true/false), finite, and in its range where
    `ranges` gives one ([low, high], both included): checked before any other rule reads it, so
    no value can divide by zero, overflow or ask for more memory than exists."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        key = f"{name}.{f.name}"
        if f.type in ("int", "float") and isinstance(value, bool):
            raise ConfigError(f"{key} expects a number ({f.type}), got {str(value).lower()}")
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
                 "flat_layers": (0, 1024), "stage2_layers": (0, 1024), "window": (1, 1 << 24),
                 "mlp_ratio": (1e-6, 1024), "max_seq_len": (1, 1 << 24), "rope_base": (1, 1e12),
                 "fixed_stride": (1, 1 << 24), "bpe_vocab": (0, 1 << 22), "chunk_vocab": (0, 1 << 26),
                 "chunk_vocab_max_len": (1, 1024), "ngram_vocab": (0, 1 << 26), "ngram_sizes": (1, 16),
                 "policy_window": (1, 12), "hnet_ratio_weight": (0, 1e6), "gumbel_temperature": (1e-6, 1e6),
                 "gumbel_prior_weight": (0, 1e6)}
_OBJECTIVE_RANGES = {"group_size": (1, 1024), "flip_stride": (1, 1 << 24), "policy_start_step": (0, _BIG),
                     "lexicon_size": (2, 1 << 30), "policy_lr_mult": (0, 1e6), "lagrange_lr": (0, 1e6),
                     "lagrange_gain": (0, 1e6), "compute_price": (0, 1e12), "lexicon_weight": (0, 1e6)}
_DATA_RANGES = {"max_bytes": (0, 1 << 50), "prepare_above": (0, 1 << 62)}
_TRAIN_RANGES = {"seq_len": (1, 1 << 24), "batch_size": (1, 1 << 20), "grad_accum": (1, 1 << 20),
                 "max_steps": (1, _BIG), "warmup_steps": (0, _BIG), "weight_decay": (0, 1e3), "betas": (0, 0.999999),
                 "grad_clip": (1e-12, 1e12), "eval_every": (1, _BIG), "eval_batches": (1, 1 << 20),
                 "log_every": (1, _BIG), "checkpoint_every": (1, _BIG), "keep_checkpoints": (0, 1 << 20),
                 "seed": (0, (1 << 32) - 1), "threads": (0, 1024)}
MAX_BATCH_BYTES = 1 << 32  # train.batch_size x train.seq_len: bytes of one micro-batch


def _unknown(key: str, choices: list[str], where: str, what: str = "config key") -> ConfigError:
    close = difflib.get_close_matches(key, choices, n=1)
    hint = f"; did you mean {where + close[0]!r}?" if close else f"; valid: {', '.join(sorted(choices))}"
    return ConfigError(f"unknown {what} {where + key!r}{hint}")


# Boundary-learning recipes (objective.recipe): the objective keys each one sets.
RECIPES: dict[str, dict[str, Any]] = {
    "reference": {"estimator": "score_function", "lexicon_weight": 0.0, "flip_rate_control": False,
                  "flip_model_pass": True},
    "lexicon": {"estimator": "flips", "lexicon_weight": 1.0, "flip_rate_control": True, "flip_model_pass": False},
}
