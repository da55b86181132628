"""The boundary-rule interface, what every rule returns and answers, and helpers they share.
b[:, t] = 1: byte t is the *last* byte of a chunk; position 0 always is (and, in training, the
last); forced positions carry no gradient (`free` marks the ones that do)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.config import CHUNKERS, ModelConfig, Section
from rltok.model.cost import Level, linear_layers_flops

# how a rule that samples decides: drawn from its probabilities, or thresholded at p = 0.5
DECISION_MODES = ("sample", "greedy")


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
    # one-byte step of a rule that pools its chunks (dynamic pooling): the vector the open chunk
    # would have if the newest byte closed it, (B, d); None: a chunk is its last byte's state
    pooled: torch.Tensor | None = None

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

    def policy_parameters(self):
        """The parameters that decide where to cut: those objective.policy_lr_mult scales (all of
        the rule's, unless it owns others, such as a norm of the chunks it pools)."""
        return self.parameters()

    def pool(self, h: torch.Tensor, bd: Boundaries, last: torch.Tensor) -> torch.Tensor:
        """The chunk vectors (B, M, d) from the items' states h (B, T, d), given each chunk's last
        item `last` (B, M); a rule that pools otherwise overrides this."""
        return last_item_chunks(h, bd, last)

    def flops(self, level: Level) -> float:
        """Forward FLOPs per byte of the rule's own layers at `level` (the items it decides on): its
        linear layers, wherever they sit; a rule with none costs nothing."""
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


def last_item_chunks(h: torch.Tensor, bd: Boundaries, last: torch.Tensor) -> torch.Tensor:
    """Each chunk's last item's state, times the straight-through gate where the rule has one
    (value 1, so only the gradient changes): the backbone's downsample, for any rule (a plugin's
    bare module too) that does not pool its own way."""
    z = torch.gather(h, 1, last.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    if bd.gate is not None:
        z = z * torch.gather(bd.gate, 1, last).unsqueeze(-1).to(z.dtype)
    return z


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


def build_chunker(cfg: ModelConfig) -> nn.Module:
    """The byte level's boundary rule: the entry of model.chunker's kind, made from its settings."""
    return CHUNKERS.build(cfg.chunker, cfg)
