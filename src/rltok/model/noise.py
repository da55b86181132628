"""Random numbers for boundary rules that stay the same under data parallelism: `uniform(shape,
device, generator)` is `torch.rand` for a plain generator; given a `RowShard` every rank draws the
noise of the whole global batch from its identically seeded generator and keeps its own rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RowShard(NamedTuple):
    """A generator plus this rank's place in the global batch (rows are split in contiguous
    blocks, rank r holding rows r*B/N .. (r+1)*B/N - 1)."""

    generator: torch.Generator
    rank: int
    world_size: int


def uniform(shape, device, generator, dtype=torch.float32) -> torch.Tensor:
    if isinstance(generator, RowShard):
        rows = shape[0]
        full = torch.rand((rows * generator.world_size, *shape[1:]), device=device,
                          generator=generator.generator, dtype=dtype)
        return full[generator.rank * rows:(generator.rank + 1) * rows]
    return torch.rand(shape, device=device, generator=generator, dtype=dtype)
