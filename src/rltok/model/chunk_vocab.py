"""A learned vocabulary at the chunk level: each chunk's bytes select an embedding.

The content of a chunk (its bytes, the last `max_len` of them for longer chunks, and its length)
is hashed into a table of `size` learned vectors, added to the chunk's vector before the main
network. A chunk the boundary rule produces often ("the ", "self.") then has an embedding of its
own, like a token in a vocabulary, and a rule that cuts the same strings the same way gets more
out of the table than one that cuts them at random: where to cut starts to matter.

Causal: the chunk ending at byte e hashes bytes <= e only. The lookup is not a matrix product
and costs no FLOPs in rltok.flops' accounting (only the table's memory).
"""

from __future__ import annotations

import torch
import torch.nn as nn

_HASH_SEED = 0x5EED_C4A9


class ChunkVocab(nn.Module):
    def __init__(self, size: int, dim: int, max_len: int = 16):
        super().__init__()
        self.size = size
        self.max_len = max_len
        self.table = nn.Embedding(size, dim)
        nn.init.zeros_(self.table.weight)  # starts as a no-op; rows grow as chunks recur
        gen = torch.Generator().manual_seed(_HASH_SEED)
        # odd multipliers < 2^31 per (offset from the chunk's end), one for the length: with byte
        # values <= 256 the sum stays far below 2^63 (no int64 overflow)
        mult = torch.randint(1, 2 ** 30, (max_len + 1,), generator=gen, dtype=torch.long) * 2 + 1
        self.register_buffer("mult", mult, persistent=False)

    def hashes(self, idx: torch.Tensor, chunk_pos: torch.Tensor) -> torch.Tensor:
        """(B, M) table rows for chunks ending at chunk_pos (B, M) over bytes idx (B, T). A chunk
        starts after the previous chunk's end (chunk 0 at byte 0)."""
        start = torch.cat([torch.zeros_like(chunk_pos[:, :1]), chunk_pos[:, :-1] + 1], dim=1)
        length = (chunk_pos - start + 1).clamp(min=1)
        k = torch.arange(self.max_len, device=idx.device)
        pos = chunk_pos.unsqueeze(-1) - k  # (B, M, L): the chunk's bytes, newest first
        inside = pos >= start.unsqueeze(-1)
        byte = torch.gather(idx, 1, pos.clamp(min=0).flatten(1)).view(pos.shape)
        h = ((byte + 1) * inside * self.mult[1:]).sum(-1) + length.clamp(max=self.max_len + 1) * self.mult[0]
        return torch.remainder(h, self.size)

    def forward(self, idx: torch.Tensor, chunk_pos: torch.Tensor) -> torch.Tensor:
        return self.table(self.hashes(idx, chunk_pos))
