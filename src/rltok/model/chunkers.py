"""Boundary rules: decide, byte by byte, where a chunk ends.

Convention: b[:, t] = 1 means byte t is the *last* byte of a chunk. Position 0 is always a
boundary (so every byte has a chunk ending at or before it); in training the last position is
one too. Forced positions carry no gradient (`free` marks the ones that do).

Every chunker returns a `Boundaries` record so the model and the objective never need to know
which rule produced it. For cached decoding each causal rule also decides one new byte at a time
(`Chunker.step`), from its running state (`Chunker.start_state`); its decisions are the ones its
forward makes on the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.config import CHUNKERS, ModelConfig, Section
from rltok.model.cost import Level, linear_layers_flops
from rltok.model.noise import uniform  # noise that data-parallel ranks can slice from the global batch


@dataclass
class Boundaries:
    b: torch.Tensor  # (B, T) bool: byte t closes a chunk
    free: torch.Tensor  # (B, T) bool: decision was made by the rule (not forced)
    logits: torch.Tensor | None = None  # (B, T) policy logits (with grad), RL only
    logp: torch.Tensor | None = None  # (B, T) log pi(b_t | history), with grad, RL only
    sample_logp: torch.Tensor | None = None  # (B, T) log-prob computed inside the sampler
    # straight-through rules (hnet, gumbel): tensors whose value is 1 but whose gradient reaches
    # the boundary scorer, multiplied into the downsampled (gate) or upsampled (confidence) path
    gate: torch.Tensor | None = None  # (B, T)
    confidence: torch.Tensor | None = None  # (B, T)
    smooth: torch.Tensor | None = None  # (B, T) boundary probability for EMA smoothing over chunks
    scores: torch.Tensor | None = None  # (B, T) the rule's boundary probability/score, for display
    aux_loss: torch.Tensor | None = None  # the rule's own regulariser, already weighted

    @property
    def probs(self) -> torch.Tensor | None:
        if self.logits is not None:
            return torch.sigmoid(self.logits)
        return self.scores


class NonCausalRule(ValueError):
    """A boundary rule whose decision at byte t depends on later bytes: it cannot decode."""


class Chunker(nn.Module):
    """A boundary rule. forward(h, forced, b, mode, generator, idx=, early_logits=) decides a
    whole window; step() decides the newest byte of each row with the same inputs at that byte,
    keeping what it needs of the past in a state dict of (B, ...) tensors that start_state()
    builds from a context read by forward (one row: h (1, T, d), b (1, T), idx (1, T),
    early_logits (1, T, V); `offset` is the row's byte index of the context's first byte)."""

    uses_early_logits = False  # step reads the early-exit logits (decoding computes them only then)
    noncausal: str | None = None  # why the rule cannot decide byte t from bytes <= t, if it cannot
    learned = False  # a policy whose decisions the objective's estimator trains
    tracks_target = False  # its rate is set in training, towards model.target_rate
    stochastic = False  # samples its boundaries in training and has a thresholded (greedy) mode
    needs_fit = False  # fitted to training bytes before training (fit(data)), e.g. a BPE tokenizer

    @classmethod
    def from_settings(cls, settings: Section, m: ModelConfig, dim: int | None = None,
                      rate: float | None = None) -> "Chunker":
        """The rule from its config section, at width `dim` and target `rate` (default: the byte
        level's, model.d_byte and model.target_rate). Rules with settings or sizes override this."""
        return cls()

    def start_state(self, h, b, idx, early_logits, offset: int = 0) -> dict[str, torch.Tensor]:
        return {}

    def flops(self, level: Level) -> float:
        """Forward FLOPs per byte of the rule's own layers at `level` (the items it decides on).
        Here: its linear layers, wherever they sit (RLPolicy's head, Gumbel's MLP, H-Net's q and
        k); a rule with none (fixed, uniform, whitespace, BPE; entropy reads the early-exit
        logits the model computes anyway) costs nothing. A rule computing other products says so."""
        return linear_layers_flops(self, level)

    def chunk_flops(self, level: Level, dim: int) -> float:
        """Forward FLOPs per byte the rule adds where its chunks, of width `dim`, are at `level`
        (H-Net's smoothing); none here."""
        return 0.0

    def step(self, state: dict[str, torch.Tensor], h: torch.Tensor, forced: torch.Tensor,
             b: torch.Tensor | None = None, mode: str = "sample", generator=None, idx=None,
             early_logits=None, noise: torch.Tensor | None = None) -> Boundaries:
        """Decisions (B,) for one new byte per row: h (B, d) its encoder state, idx (B,) the byte,
        early_logits (B, V), forced (B,) positions that must close a chunk, b (B,) given decisions,
        noise (B,) uniform draws to use instead of drawing from `generator`. Updates `state`."""
        raise NonCausalRule(self.noncausal or f"{type(self).__name__} has no one-byte decision")


def forced_mask(batch: int, length: int, device, force_last: bool) -> torch.Tensor:
    forced = torch.zeros(batch, length, dtype=torch.bool, device=device)
    forced[:, 0] = True
    if force_last:
        forced[:, -1] = True
    return forced


def fp32_linear(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """layer(h) in fp32 even under autocast: boundary logits feed log-probabilities, rate and
    price terms whose small differences bf16 would round away."""
    with torch.autocast(h.device.type, enabled=False):
        return layer(h.float())


def bernoulli_logp(b: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """log pi(b) for a Bernoulli with the given logits, elementwise and numerically stable."""
    return -F.binary_cross_entropy_with_logits(logits, b.to(logits.dtype), reduction="none")


class RLPolicy(Chunker):
    """Autoregressive Bernoulli boundary policy.

    logit_t = w . h_t + c + table[pattern_t], where pattern_t encodes the policy's previous
    `window - 1` decisions (window=1: decisions independent given the encoder, fully parallel).
    A table over all 2^(window-1) histories is the most general additive function of them.

    Given the decisions, all log-probabilities are computed in parallel (teacher forcing); only
    sampling with window > 1 needs a loop over positions, which runs on the device with no
    host synchronisation.
    """

    learned = True

    tracks_target = True
    stochastic = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(dim or m.d_byte, settings.window, rate or m.target_rate, settings.detach)

    def __init__(self, dim: int, window: int = 1, target_rate: float = 0.2, detach_input: bool = False):
        super().__init__()
        self.window = window
        self.detach_input = detach_input
        self.head = nn.Linear(dim, 1)
        nn.init.zeros_(self.head.weight)
        # start at the target rate, so neither the LM nor the rate loss sees a collapsed start
        nn.init.constant_(self.head.bias, math.log(target_rate / (1 - target_rate)) if target_rate < 1 else 6.0)
        self.history = nn.Embedding(2 ** (window - 1), 1) if window > 1 else None
        if self.history is not None:
            nn.init.zeros_(self.history.weight)
        # settled (objective.policy_until): its decisions are thresholded from then on, in training
        # and after. A buffer registered when it settles, so checkpoints keep it and a policy that
        # never settled has the state it always had; mirrored on the host so deciding never syncs.
        self.is_settled, self.cut_at, self.hold_at = False, 0.0, 0.0
        # whether the objective trains it this step (not in the warm start, not once settled):
        # otherwise it decides without a graph, so data parallel sees its weights unused
        self.learns = True

    def settle(self, cut: float = 0.0, hold: float = 0.0) -> None:
        """Stop sampling: every later decision is the thresholded one, a boundary where the logit
        exceeds `cut` (0: where p > 0.5). `hold` > 0: the chunks per byte to hold, which
        `follow_rate` keeps by moving the cut as the encoder the rule reads trains on
        (objective.settle_threshold=rate)."""
        device = self.head.weight.device
        for name, value in (("settled", torch.ones((), dtype=torch.bool, device=device)),
                            ("cut_logit", torch.tensor(float(cut), device=device)),
                            ("cut_hold", torch.tensor(float(hold), device=device))):
            if name in self._buffers:
                self._buffers[name].copy_(value)
            else:
                self.register_buffer(name, value)
        self.is_settled, self.cut_at, self.hold_at = True, float(cut), float(hold)

    def follow_rate(self, chunks_per_byte: float, gain: float = 0.1) -> None:
        """One step of holding the rate: move the cut by gain * ln(drawn / held) (more cuts than
        held: a higher cut). Called with the step's global rate, so every rank moves alike."""
        if self.is_settled and self.hold_at > 0 and chunks_per_byte > 0:
            self.cut_at += gain * math.log(chunks_per_byte / self.hold_at)
            self.cut_logit.fill_(self.cut_at)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the flag is in a state only once its policy settled: without it, the policy never did
        if prefix + "settled" in state_dict:
            # register the buffers, never reset them: their values are read below, and the state's
            # tensors may be these very buffers (a sharded load fills them in place first)
            if "settled" not in self._buffers:
                self.settle()
            for name in ("cut_logit", "cut_hold"):  # settled before cuts were kept: p > 0.5, nothing held
                state_dict.setdefault(prefix + name, torch.zeros(()))
        else:
            for name in ("settled", "cut_logit", "cut_hold"):
                self._buffers.pop(name, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.is_settled = "settled" in self._buffers and bool(self.settled)
        self.cut_at = float(self.cut_logit) if self.is_settled else 0.0
        self.hold_at = float(self.cut_hold) if self.is_settled else 0.0

    def history_pattern(self, b: torch.Tensor) -> torch.Tensor:
        """pattern_t = sum_j b_{t-j} 2^(j-1) for j = 1..window-1 (positions before 0 count as 0)."""
        pattern = torch.zeros_like(b, dtype=torch.long)
        bl = b.long()
        for j in range(1, self.window):
            pattern[:, j:] += bl[:, :-j] << (j - 1)
        return pattern

    def teacher_forced_logits(self, base: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.history is None:
            return base
        return base + self.history(self.history_pattern(b)).squeeze(-1)

    def push(self, pattern: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The next position's pattern: the newest decision enters at bit 0."""
        return ((pattern << 1) | b.long()) & (2 ** (self.window - 1) - 1)

    def draw(self, logits: torch.Tensor, u: torch.Tensor | None, greedy: bool) -> torch.Tensor:
        """Sampled (u < p) or thresholded decisions: at logit 0, or at a settled rule's cut."""
        return (logits > self.cut_at) if greedy else (u < torch.sigmoid(logits))

    @torch.no_grad()
    def sample(self, base: torch.Tensor, forced: torch.Tensor, greedy: bool,
               generator: torch.Generator | None, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw decisions (B, T) and their log-probs as computed during sampling. `noise`: the
        uniform draws to use instead of drawing them from `generator`."""
        u = None if greedy else (noise if noise is not None else uniform(base.shape, base.device, generator))
        if self.history is None:
            logits = base.float()
            b = self.draw(logits, u, greedy) | forced
            return b, bernoulli_logp(b, logits)
        bsz, length = base.shape
        table = self.history.weight.squeeze(-1).float()
        b = torch.zeros(bsz, length, dtype=torch.bool, device=base.device)
        logp = torch.zeros(bsz, length, dtype=torch.float32, device=base.device)
        pattern = torch.zeros(bsz, dtype=torch.long, device=base.device)
        base = base.float()
        for t in range(length):
            lt = base[:, t] + table[pattern]
            bt = self.draw(lt, None if u is None else u[:, t], greedy) | forced[:, t]
            b[:, t] = bt
            logp[:, t] = bernoulli_logp(bt, lt)
            pattern = self.push(pattern, bt)
        return b, logp

    def forward(self, h: torch.Tensor, forced: torch.Tensor, b: torch.Tensor | None = None,
                mode: str = "sample", generator: torch.Generator | None = None,
                noise: torch.Tensor | None = None, **_) -> Boundaries:
        if self.is_settled or not self.learns:
            with torch.no_grad():
                return self.decide(h, forced, b, mode, generator, noise)
        return self.decide(h, forced, b, mode, generator, noise)

    def decide(self, h, forced, b, mode, generator, noise) -> Boundaries:
        base = fp32_linear(self.head, h.detach() if self.detach_input else h).squeeze(-1)
        sample_logp = None
        if b is None:
            b, sample_logp = self.sample(base.detach(), forced, mode == "greedy" or self.is_settled, generator, noise)
        else:
            b = b.bool() | forced
        logits = self.teacher_forced_logits(base, b)
        return Boundaries(b=b, free=~forced, logits=logits, logp=bernoulli_logp(b, logits), sample_logp=sample_logp)

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        if self.history is None:
            return {}
        # the pattern the position after the context sees: its last window - 1 decisions
        return {"pattern": self.history_pattern(F.pad(b.long(), (0, 1)))[:, -1]}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        logits = fp32_linear(self.head, h).squeeze(-1)
        if self.history is not None:
            logits = logits + self.history(state["pattern"]).squeeze(-1)
        if b is None:
            greedy = mode == "greedy" or self.is_settled
            u = None if greedy else (noise if noise is not None else uniform(logits.shape, logits.device, generator))
            b = self.draw(logits, u, greedy)
        b = b.bool() | forced
        if self.history is not None:
            state["pattern"] = self.push(state["pattern"], b)
        return Boundaries(b=b, free=~forced, logits=logits)  # (no log-probabilities: nothing learns here)


class FixedChunker(Chunker):
    """A boundary every `stride` bytes (byte stride-1, 2*stride-1, ...), plus the forced ones."""

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(settings.stride)

    def __init__(self, stride: int):
        super().__init__()
        self.stride = stride

    def forward(self, h: torch.Tensor, forced: torch.Tensor, b: torch.Tensor | None = None,
                mode: str = "sample", generator: torch.Generator | None = None, **_) -> Boundaries:
        if b is None:
            t = torch.arange(h.shape[1], device=h.device)
            b = ((t + 1) % self.stride == 0).unsqueeze(0).expand_as(forced)
        return Boundaries(b=b.bool() | forced, free=~forced)

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        # the stride counts from the row's first byte, also after a context slid past it
        return {"next": torch.full((1,), offset + b.shape[1], dtype=torch.long, device=b.device)}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        if b is None:
            b = (state["next"] + 1) % self.stride == 0
        state["next"] = state["next"] + 1
        return Boundaries(b=b.bool() | forced, free=~forced)


class UniformChunker(Chunker):
    """Exactly round(rate * free) boundaries per sequence at uniformly random free positions.
    Decoding cannot know the window's length or its later draws, so it decides each byte by an
    independent draw at the same rate (the same positions are equally likely; only the count
    varies). Boundaries are independent of the bytes either way."""

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(rate or m.target_rate)

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def forward(self, h, forced, b=None, mode="sample", generator=None, **_) -> Boundaries:
        if b is None:
            free = ~forced
            k = int(round(self.rate * int(free[0].sum())))
            noise = uniform(forced.shape, forced.device, generator)
            noise = noise.masked_fill(forced, -1.0)  # forced slots never count towards k
            b = torch.zeros_like(forced)
            if k > 0:
                b.scatter_(1, noise.topk(k, dim=1).indices, True)
        return Boundaries(b=b.bool() | forced, free=~forced)

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        if b is None:
            b = (noise if noise is not None else uniform(forced.shape, forced.device, generator)) < self.rate
        return Boundaries(b=b.bool() | forced, free=~forced)


def spacelike(idx: torch.Tensor) -> torch.Tensor:
    """SpaceByte's rule: a byte is space-like unless it is an ASCII letter or digit or a UTF-8
    continuation byte (0x80-0xBF)."""
    letter = ((idx >= 65) & (idx <= 90)) | ((idx >= 97) & (idx <= 122))
    digit = (idx >= 48) & (idx <= 57)
    cont = (idx >= 0x80) & (idx <= 0xBF)
    return ~(letter | digit | cont)


class WhitespaceChunker(Chunker):
    """SpaceByte-style: a chunk ends at a space-like byte that follows a non-space-like one, so the
    chunk-level network runs right before each new word."""

    def forward(self, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        if b is None:
            sp = spacelike(idx)
            prev = torch.ones_like(sp)
            prev[:, 1:] = sp[:, :-1]
            b = sp & ~prev
        return Boundaries(b=b.bool() | forced, free=~forced)

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        return {"space": spacelike(idx[:, -1])}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        sp = spacelike(idx)
        if b is None:
            b = sp & ~state["space"]
        state["space"] = sp
        return Boundaries(b=b.bool() | forced, free=~forced)


class EntropyChunker(Chunker):
    """BLT-style: a chunk ends at byte t when the early-exit head's entropy over byte t+1 spikes
    (rises by more than a threshold over the entropy at t-1), i.e. the next byte is surprising.

    The threshold is a running estimate of the score quantile that gives the target rate, fed by
    training batches *after* they are segmented, so a batch is cut with a threshold learned from
    earlier batches only (a batch's own quantile would let every boundary depend on the bytes
    after it). The estimate is a running mean of batch quantiles for the first `1/(1-momentum)`
    batches, then an EMA; under data parallelism the ranks average their quantiles, so every
    rank holds the same threshold. Before the first training batch there is no threshold and
    the rule draws no free boundary. Stored as buffers, so evaluation and resumes reuse it. No
    gradient reaches the rule."""

    tracks_target = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(rate or m.target_rate)

    def __init__(self, rate: float, mode: str = "spike", momentum: float = 0.99):
        super().__init__()
        self.rate = rate
        self.mode = mode
        self.momentum = momentum
        self.register_buffer("threshold", torch.tensor(float("nan")))
        self.register_buffer("updates", torch.tensor(0, dtype=torch.long))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints from before the update counter: treat their threshold as settled
        if prefix + "threshold" in state_dict and prefix + "updates" not in state_dict:
            state_dict[prefix + "updates"] = torch.tensor(int(1 / (1 - self.momentum)), dtype=torch.long)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    uses_early_logits = True

    @staticmethod
    def entropy(early_logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(early_logits.detach().float()[..., :256], dim=-1)
        return -(logp.exp() * logp).sum(-1)

    def score(self, early_logits: torch.Tensor) -> torch.Tensor:
        ent = self.entropy(early_logits)
        if self.mode == "global":
            return ent
        prev = torch.zeros_like(ent)
        prev[:, 1:] = ent[:, :-1]
        return ent - prev

    @torch.no_grad()
    def _update_threshold(self, s: torch.Tensor, forced: torch.Tensor) -> None:
        q = torch.quantile(s[~forced].float()[:1_000_000], 1 - self.rate)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(q)
            q = q / torch.distributed.get_world_size()
        n = int(self.updates)
        keep = min(self.momentum, n / (n + 1))  # running mean at first, then the EMA
        self.threshold.copy_(q if n == 0 else keep * self.threshold + (1 - keep) * q)
        self.updates.add_(1)

    def forward(self, h, forced, b=None, mode="sample", generator=None, early_logits=None, **_) -> Boundaries:
        s = self.score(early_logits)
        if b is None:
            b = s > self.threshold if not torch.isnan(self.threshold) else torch.zeros_like(forced)
            if self.training:  # after cutting: this batch informs later batches only
                self._update_threshold(s, forced)
        return Boundaries(b=b.bool() | forced, free=~forced, scores=torch.sigmoid(s - self.threshold))

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        return {"entropy": self.entropy(early_logits[:, -1])}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        # decoding reads the threshold and never moves it: that is training's business
        ent = self.entropy(early_logits)
        s = ent if self.mode == "global" else ent - state["entropy"]
        state["entropy"] = ent
        if b is None:
            b = s > self.threshold if not torch.isnan(self.threshold) else torch.zeros_like(forced)
        return Boundaries(b=b.bool() | forced, free=~forced, scores=torch.sigmoid(s - self.threshold))


class HNetRouter(Chunker):
    """H-Net's dynamic chunking: p_t = (1 - cos(q_t, k_{t-1})) / 2 on projected encoder states,
    boundary where p_t >= 0.5. Trained straight-through: the upsampled vector is scaled by the
    confidence (p_t or 1 - p_t) with its value replaced by 1, chunk outputs are smoothed by an
    EMA weighted by p, and a ratio loss pulls the rate towards the target."""

    tracks_target = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(dim or m.d_byte, rate or m.target_rate, settings.ratio_weight)

    def __init__(self, dim: int, rate: float, ratio_weight: float = 0.03):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        nn.init.eye_(self.q.weight)  # start as plain cosine similarity of adjacent states
        nn.init.eye_(self.k.weight)
        self.rate = rate
        self.ratio_weight = ratio_weight

    def forward(self, h, forced, b=None, mode="sample", generator=None, **_) -> Boundaries:
        q, k = fp32_linear(self.q, h), fp32_linear(self.k, h)
        cos = F.cosine_similarity(q[:, 1:], k[:, :-1], dim=-1)
        p = torch.cat([cos.new_ones(cos.shape[0], 1), ((1 - cos) / 2).clamp(0, 1)], dim=1)  # (a 1-byte window too)
        p = torch.where(forced, torch.ones_like(p), p)
        if b is None:
            b = p >= 0.5
        b = b.bool() | forced
        c = torch.where(b, p, 1 - p)
        confidence = c + (1 - c).detach()  # straight-through: forward 1, gradient of c
        # ratio loss (H-Net): N/(N-1) * ((N-1) F G + (1-F)(1-G)), minimal at F = G = 1/N
        n = 1.0 / self.rate
        f_sel = b[~forced].float().mean()
        g_prob = p[~forced].mean()
        ratio = n / (n - 1) * ((n - 1) * f_sel * g_prob + (1 - f_sel) * (1 - g_prob))
        return Boundaries(b=b, free=~forced, confidence=confidence, smooth=p, scores=p.detach(),
                          aux_loss=self.ratio_weight * ratio)

    def chunk_flops(self, level: Level, dim: int) -> float:
        """The EMA over chunks (stage.ema_over_chunks): a dense (chunks x chunks) @ (chunks x dim)
        product per sequence."""
        return level.per_byte * 2.0 * level.items * dim

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        return {"key": fp32_linear(self.k, h[:, -1])}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        q, k = fp32_linear(self.q, h), fp32_linear(self.k, h)
        cos = F.cosine_similarity(q, state["key"], dim=-1)
        state["key"] = k
        p = torch.where(forced, torch.ones_like(cos), ((1 - cos) / 2).clamp(0, 1))
        if b is None:
            b = p >= 0.5
        b = b.bool() | forced
        c = torch.where(b, p, 1 - p)
        return Boundaries(b=b, free=~forced, confidence=c + (1 - c), smooth=p, scores=p)


class GumbelChunker(Chunker):
    """Dynamic-pooling style: an MLP scores each byte, a hard Gumbel-sigmoid sample decides, and
    a straight-through gate (value 1, gradient of the soft sample) multiplies the selected
    vectors. A binomial prior on the boundary count holds the rate near the target."""

    tracks_target = True
    stochastic = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(dim or m.d_byte, rate or m.target_rate, settings.temperature, settings.prior_weight)

    def __init__(self, dim: int, rate: float, temperature: float = 1.0, prior_weight: float = 1.0):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.constant_(self.mlp[2].bias, math.log(rate / (1 - rate)))
        self.rate = rate
        self.temperature = temperature
        self.prior_weight = prior_weight

    def soft(self, logits: torch.Tensor, mode: str, generator, noise: torch.Tensor | None = None) -> torch.Tensor:
        # "sample" draws the hard Gumbel-sigmoid sample in training and evaluation alike (the rule
        # the model trained with); "greedy" thresholds the noiseless probability at 0.5, an
        # inference rule the model never trained with (with the bias at logit(0.2) it draws no
        # free boundary at all until the scorer has learned confident boundaries)
        if mode == "greedy":
            return torch.sigmoid(logits)
        u = (noise if noise is not None else uniform(logits.shape, logits.device, generator)).clamp(1e-6, 1 - 1e-6)
        return torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / self.temperature)

    def forward(self, h, forced, b=None, mode="sample", generator=None, **_) -> Boundaries:
        logits = fp32_linear(self.mlp, h).squeeze(-1)
        soft = self.soft(logits, mode, generator)
        if b is None:
            b = soft > 0.5
        b = b.bool() | forced
        gate = soft + (b.float() - soft).detach()
        free = ~forced
        count = gate.masked_fill(forced, 0).sum(1)
        n_free = free.sum(1).float()
        prior = torch.distributions.Binomial(total_count=n_free, probs=torch.full_like(n_free, self.rate))
        nll = -prior.log_prob(count.clamp(max=n_free)).mean() / n_free.mean()
        return Boundaries(b=b, free=free, gate=gate, scores=torch.sigmoid(logits.detach()),
                          aux_loss=self.prior_weight * nll)

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, early_logits=None,
             noise=None) -> Boundaries:
        logits = fp32_linear(self.mlp, h).squeeze(-1)
        soft = self.soft(logits, mode, generator, noise)  # drawn as forward does, given b or not
        if b is None:
            b = soft > 0.5
        b = b.bool() | forced
        return Boundaries(b=b, free=~forced, gate=soft + (b.float() - soft), scores=torch.sigmoid(logits))


class BPEChunker(Chunker):
    """Boundaries at the ends of BPE tokens (each row tokenised on its own). The tokenizer is
    fitted to the target rate on the training split and stored as a buffer, so checkpoints
    carry it. Note: a BPE boundary at t depends on whether byte t+1 merges with it, so this
    rule sees one byte of the future through its boundaries, as in the published comparisons."""

    noncausal = ("chunker=bpe cannot generate: a BPE boundary at byte t depends on whether byte t+1 merges "
                 "with it, so it cannot be decided before byte t+1 exists")

    needs_fit = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(rate or m.target_rate, m.bpe_pretokenize, m.bpe_vocab, m.bpe_sample_bytes)

    def __init__(self, rate: float, pretokenize: str = "gpt2", vocab_size: int = 0, sample_bytes: int = 4_000_000):
        super().__init__()
        self.rate = rate
        self.pretokenize = pretokenize
        self.vocab_size = vocab_size  # > 0: exactly this vocabulary instead of the one fitted to `rate`
        self.sample_bytes = sample_bytes  # of the training split, to fit on (model.bpe_sample_bytes)
        self.register_buffer("tokenizer_json", torch.zeros(0, dtype=torch.uint8))
        self._tok = None

    def fit(self, data: bytes, seed: int = 0):
        """Fit the tokenizer on a sample of `data`; returns the rltok.data.bpe.BPEFit."""
        from rltok.data.bpe import fit_bpe_to_rate, heldout_for, tokenizer_to_tensor

        fit = fit_bpe_to_rate(data, self.rate, self.sample_bytes, seed=seed, pretokenize=self.pretokenize,
                              heldout_bytes=heldout_for(self.sample_bytes), vocab_size=self.vocab_size)
        self.tokenizer_json = tokenizer_to_tensor(fit.tokenizer).to(self.tokenizer_json.device)
        self._tok = fit.tokenizer
        return fit

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "tokenizer_json"
        if key in state_dict:
            self.tokenizer_json = torch.empty_like(state_dict[key])
            self._tok = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def tokenizer(self):
        if self._tok is None:
            if self.tokenizer_json.numel() == 0:
                raise RuntimeError("BPE chunker has no tokenizer: call fit() on training bytes first")
            from rltok.data.bpe import tokenizer_from_tensor

            self._tok = tokenizer_from_tensor(self.tokenizer_json.cpu())
        return self._tok

    def forward(self, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        if b is None:
            from rltok.data.bpe import bpe_boundary_mask

            b = bpe_boundary_mask(self.tokenizer, idx.cpu()).to(forced.device)
        return Boundaries(b=b.bool() | forced, free=~forced)


def learned_rules(model: nn.Module) -> list[tuple[str, RLPolicy]]:
    """The model's learned boundary policies (every stage's), by module name: the rules that settle."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, RLPolicy)]


def build_chunker(cfg: ModelConfig) -> nn.Module:
    """The byte level's boundary rule: the entry of model.chunker's kind, made from its settings."""
    return CHUNKERS.build(cfg.chunker, cfg)
