"""Hashed byte n-gram embeddings, as in the Byte Latent Transformer (docs/CONFIG.md, "Vocabularies for
a byte model"). Positions before the sequence hash as "no byte" (not byte 0), so cached generation
computes the same vectors."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.model.cost import Level

_HASH_SEED = 0xB17E_9A3D


class NgramEmbedding(nn.Module):
    def __init__(self, sizes: tuple[int, ...], rows: int, dim: int):
        super().__init__()
        if not sizes or min(sizes) < 1 or rows < 1:
            raise ValueError("n-gram embeddings need n >= 1 and rows >= 1")
        self.sizes = tuple(sorted(set(int(n) for n in sizes)))
        self.rows = rows
        self.max_n = max(self.sizes)
        # one table, len(sizes) blocks of `rows`: a single embedding_bag call sums the lookups
        self.table = nn.Embedding(len(self.sizes) * rows, dim)
        nn.init.zeros_(self.table.weight)  # a no-op at the start; rows grow as n-grams recur
        gen = torch.Generator().manual_seed(_HASH_SEED)
        # odd multipliers < 2^31 per (n, offset from the newest byte); byte values + 1 <= 256, so a
        # sum of <= 16 terms stays below 2^44: no int64 overflow anywhere
        mult = torch.randint(1, 2 ** 30, (len(self.sizes), self.max_n), generator=gen, dtype=torch.long) * 2 + 1
        self.register_buffer("mult", mult, persistent=False)
        self.register_buffer("offset", torch.arange(len(self.sizes)) * rows, persistent=False)
        keep = torch.tensor([[k < n for k in range(self.max_n)] for n in self.sizes])
        self.register_buffer("keep", keep, persistent=False)  # (sizes, max_n): offsets inside each n-gram

    def hashes(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) byte ids -> (B, T, len(sizes)) rows of the table."""
        length = idx.shape[1]
        # (B, T, max_n): byte t-k at [..., k], 0 for "before the sequence", byte + 1 otherwise
        padded = F.pad(idx.long() + 1, (self.max_n - 1, 0))
        window = padded.unfold(1, self.max_n, 1).flip(-1)[:, :length]
        terms = window.unsqueeze(2) * (self.mult * self.keep)  # (B, T, sizes, max_n)
        h = terms.sum(-1)
        h = h ^ (h >> 17)  # fold the high bits in: the table index is taken modulo `rows`
        return torch.remainder(h, self.rows) + self.offset

    def flops(self, level: Level) -> float:
        """Lookups, not matrix products: count the adds that sum one vector per table into each byte."""
        return level.per_byte * len(self.sizes) * self.table.embedding_dim

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rows = self.hashes(idx)
        out = F.embedding_bag(rows.flatten(0, 1), self.table.weight, mode="sum")
        return out.view(*idx.shape, -1)


def check_ids(idx: torch.Tensor, vocab_size: int) -> None:
    """Refuse ids the embedding has no row for, naming the range: torch would raise an IndexError
    that names neither (a CUDA device assert, worse). Checked on CPU, outside compiled graphs: on
    an accelerator the check would cost a host sync every step, and ids there come from the byte
    loaders."""
    if idx.dtype.is_floating_point or idx.dtype == torch.bool:
        raise TypeError(f"token ids must be an integer tensor, got {idx.dtype}")
    if idx.device.type != "cpu" or idx.numel() == 0 or torch.compiler.is_compiling():
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"token ids must lie in 0..{vocab_size - 1} (the model's vocabulary: bytes and "
                         f"specials, or BPE tokens), got ids from {lo} to {hi}")


def byte_input(embed: nn.Embedding, ngrams: NgramEmbedding | None, idx: torch.Tensor) -> torch.Tensor:
    """A byte model's input: each byte's embedding, plus its n-grams' when the model has them."""
    check_ids(idx, embed.num_embeddings)
    x = embed(idx)
    if ngrams is not None:
        x = x + ngrams(idx).to(x.dtype)
    return x
