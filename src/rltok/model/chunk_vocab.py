"""A learned vocabulary at the chunk level (docs/CONFIG.md, "Vocabularies for a byte model"): a chunk's
last `max_len` bytes and length, hashed into `size` vectors; causal, a lookup with no FLOPs."""

from __future__ import annotations

import torch
import torch.nn as nn

from rltok.model.cost import Level

_HASH_SEED = 0x5EED_C4A9


def odd_multipliers(n: int, seed: int) -> torch.Tensor:
    """n odd int64 multipliers < 2^31 from a seeded generator: with byte values <= 256 a sum of
    a few dozen products stays far below 2^63 (no int64 overflow)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 2 ** 30, (n,), generator=gen, dtype=torch.long) * 2 + 1


def span_hash(idx: torch.Tensor, end: torch.Tensor, start: torch.Tensor, mult: torch.Tensor, size: int) -> torch.Tensor:
    """Table rows (of `size`) for the byte strings idx[b, start..end], one per entry of `end` and
    `start` (same shape, (B, M), end >= start): the string's last len(mult) - 1 bytes, each with
    the multiplier of its offset from the end (mult[1:]), and its length capped one past that
    (mult[0]). Only bytes <= end are read: the hash of a chunk is causal."""
    max_len = mult.numel() - 1
    length = (end - start + 1).clamp(min=1)
    k = torch.arange(max_len, device=idx.device)
    pos = end.unsqueeze(-1) - k  # (B, M, L): the string's bytes, newest first
    inside = pos >= start.unsqueeze(-1)
    byte = torch.gather(idx.long(), 1, pos.clamp(min=0).flatten(1)).view(pos.shape)
    h = ((byte + 1) * inside * mult[1:]).sum(-1) + length.clamp(max=max_len + 1) * mult[0]
    return torch.remainder(h, size)


class ChunkVocab(nn.Module):
    def __init__(self, size: int, dim: int, max_len: int = 16):
        super().__init__()
        self.size = size
        self.max_len = max_len
        self.table = nn.Embedding(size, dim)
        nn.init.zeros_(self.table.weight)  # starts as a no-op; rows grow as chunks recur
        # one multiplier per offset from the chunk's end, one for the length
        self.register_buffer("mult", odd_multipliers(max_len + 1, _HASH_SEED), persistent=False)

    def hashes(self, idx: torch.Tensor, chunk_pos: torch.Tensor) -> torch.Tensor:
        """(B, M) table rows for chunks ending at chunk_pos (B, M) over bytes idx (B, T). A chunk
        starts after the previous chunk's end (chunk 0 at byte 0)."""
        start = torch.cat([torch.zeros_like(chunk_pos[:, :1]), chunk_pos[:, :-1] + 1], dim=1)
        return span_hash(idx, chunk_pos, start, self.mult, self.size)

    def flops(self, level: Level) -> float:
        """A lookup: no matrix product. (Its add into the chunk vector, d_chunk per chunk, is
        left out, as it always was in the FLOPs that runs were matched on.)"""
        return 0.0

    def forward(self, idx: torch.Tensor, chunk_pos: torch.Tensor) -> torch.Tensor:
        return self.table(self.hashes(idx, chunk_pos))
