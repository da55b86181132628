"""What the models' forward passes return: `LMOutput` (a plain LM) and `HourglassOutput` (also the
hierarchy's parts); `out.hierarchical` says which, and what one kind lacks reads None on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F

from rltok.model.chunkers import Boundaries


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T) negative log-likelihood in nats, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


class Level(NamedTuple):
    """A level below the bytes as one forward pass decided it."""

    boundaries: Boundaries  # (B, M): item j of this level (a chunk of the level above) closes a chunk here
    pos: torch.Tensor  # (B, M) byte position of each of its items (padding slots: 0)


@dataclass
class ModelOutput:
    """What every model's output answers: its logits and its loss attributed to bytes."""

    logits: torch.Tensor | None  # (B, T, V) next-byte logits of the full model
    hierarchical: ClassVar[bool] = False  # an early exit and a boundary rule (HourglassOutput)
    byte_nll = None  # a token model's own per-byte loss (LMOutput)
    byte_mask = None

    def rows_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """`targets` (B, T) repeated for the rows this output holds: a model that drew K
        segmentations per sequence (group baselines) returns K * B rows."""
        rows = self.logits.shape[0] if self.logits is not None else targets.shape[0]
        return targets if rows == targets.shape[0] else targets.repeat_interleave(rows // targets.shape[0], 0)

    def per_byte_nll(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's loss attributed to bytes, (B, T) nats and a bool mask of the bytes counted
        (all, for a byte model); `targets` as `rows_targets` gives them."""
        if self.byte_nll is not None:
            return self.byte_nll, self.byte_mask
        nll = token_nll(self.logits, targets)
        return nll, torch.ones_like(nll, dtype=torch.bool)


@dataclass
class LMOutput(ModelOutput):
    """A plain LM's output (flat byte or BPE-token): no early exit, no boundary rule."""

    n_chunks: torch.Tensor | None = None  # (B,) tokens per sequence (a token model's compute scales with it)
    # Models that do not predict every byte (a BPE-token LM) report their NLL attributed to
    # bytes instead: the nats of each predicted unit at its last byte, and which bytes it covered.
    byte_nll: torch.Tensor | None = None  # (B, T) nats
    byte_mask: torch.Tensor | None = None  # (B, T) bool: bytes whose prediction is counted
    # what only a hierarchical model has
    early_logits = boundaries = values = encoder_state = None
    boundaries2 = chunk_pos = n_chunks2 = None
    levels: ClassVar[list[Level]] = []


@dataclass
class HourglassOutput(ModelOutput):
    """A hierarchical model's output. In the tokenizer phase (forward(encoder_only=True)) the
    early-exit logits stand in for `logits` and no level below the bytes ran (`levels` empty)."""

    hierarchical: ClassVar[bool] = True
    early_logits: torch.Tensor | None = None  # (B, T, V) encoder-only early-exit logits
    boundaries: Boundaries | None = None  # (B, T) the byte level's decisions
    values: torch.Tensor | None = None  # (B, T) critic estimate of the discounted return from t
    encoder_state: torch.Tensor | None = None  # (B, T, d_byte) encoder output, for re-running the rest
    levels: list[Level] = field(default_factory=list)  # each level below the bytes, top down

    @property
    def n_chunks(self) -> torch.Tensor:
        """(B,) chunks per sequence."""
        return self.boundaries.b.sum(1)

    # the first level below the bytes (a two-stage model's supertokens), by the names the objective reads
    @property
    def boundaries2(self) -> Boundaries | None:
        """(B, M) the supertoken decisions over chunks."""
        return self.levels[0].boundaries if self.levels else None

    @property
    def chunk_pos(self) -> torch.Tensor | None:
        """(B, M) byte position of chunk j (padding slots: 0)."""
        return self.levels[0].pos if self.levels else None

    @property
    def n_chunks2(self) -> torch.Tensor | None:
        """(B,) supertokens per sequence."""
        return self.levels[0].boundaries.b.sum(1) if self.levels else None

    def per_byte_levels(self, row: int = 0) -> list[torch.Tensor]:
        """Row `row`'s decisions of each level below the bytes, top down, per byte (T,) bool (the
        form cached decoding reads and returns)."""
        closes, decided = self.boundaries.b[row], []
        for level in self.levels:
            mine = torch.zeros_like(closes)
            mine[closes] = level.boundaries.b[row, : int(closes.sum())]
            decided.append(mine)
            closes = mine
        return decided

