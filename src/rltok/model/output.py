"""What every model's forward returns (HourglassLM, FlatByteLM, BPETokenLM)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rltok.model.chunkers import Boundaries


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T) negative log-likelihood in nats, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V) next-byte logits of the full model
    early_logits: torch.Tensor | None  # (B, T, V) encoder-only early-exit logits
    boundaries: Boundaries | None
    n_chunks: torch.Tensor | None = None  # (B,) chunks per sequence
    # Models that do not predict every byte (a BPE-token LM) report their NLL attributed to
    # bytes instead: the nats of each predicted unit at its last byte, and which bytes it covered.
    byte_nll: torch.Tensor | None = None  # (B, T) nats
    byte_mask: torch.Tensor | None = None  # (B, T) bool: bytes whose prediction is counted
    values: torch.Tensor | None = None  # (B, T) critic estimate of the discounted return from t
    # two-stage models: the supertoken decisions over chunks (B, M) and each chunk's last byte
    boundaries2: Boundaries | None = None
    chunk_pos: torch.Tensor | None = None  # (B, M) byte position of chunk j (padding slots: 0)
    n_chunks2: torch.Tensor | None = None  # (B,) supertokens per sequence
    encoder_state: torch.Tensor | None = None  # (B, T, d_byte) encoder output, for re-running the rest

    def rows_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """`targets` (B, T) repeated for the rows this output holds: a model that drew K
        segmentations per sequence (group baselines) returns K * B rows."""
        rows = self.logits.shape[0] if self.logits is not None else targets.shape[0]
        return targets if rows == targets.shape[0] else targets.repeat_interleave(rows // targets.shape[0], 0)

    def per_byte_nll(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's loss attributed to bytes: (B, T) nats and a (B, T) bool mask of the bytes
        counted. A byte model (hierarchical or flat) predicts every target byte, so all count; a
        token model has reported its own (byte_nll, byte_mask). `targets` as `rows_targets` gives them."""
        if self.byte_nll is not None:
            return self.byte_nll, self.byte_mask
        nll = token_nll(self.logits, targets)
        return nll, torch.ones_like(nll, dtype=torch.bool)
