"""What every model's forward returns (HourglassLM, FlatByteLM, BPETokenLM)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chunkers import Boundaries


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
