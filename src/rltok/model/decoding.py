"""What cached decoding keeps between bytes, per row: a KV cache per layer stack, the position and
last bytes, the open chunk's start, each level's latest chunk output and the rules' running state.
The models do the computing (docs/GENERATION.md)."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from rltok.model.layers import KVCache, Stack


class StepOutput(NamedTuple):
    """What prefill (one row: logits (V,), per-byte tensors (T,)) and step (all rows: logits
    (B, V), per-row tensors (B,)) return."""

    logits: torch.Tensor  # next-byte logits
    boundaries: torch.Tensor | None = None  # bool: the byte closed a chunk (chunked models)
    boundary_logits: torch.Tensor | None = None  # the RL policy's logits for those decisions
    below: tuple = ()  # bool per level below the bytes, top down: the byte closed an item there

    @property
    def boundaries2(self) -> torch.Tensor | None:
        """bool: the byte closed a supertoken (two stages)."""
        return self.below[0] if self.below else None


class PrefillCache:
    """The `cache=` of a forward pass over one row's context: each Stack fills that row of its
    KVCache, and the model keeps what decoding continues from (keep, read back from `kept`)."""

    def __init__(self, caches: dict[Stack, KVCache], row: int):
        self.caches, self.row, self.kept = caches, row, {}

    def fill(self, stack: Stack, kvs) -> None:
        self.caches[stack].fill(self.row, kvs)

    def keep(self, name: str, value: torch.Tensor) -> None:
        self.kept[name] = value


def put_row(states: dict[str, torch.Tensor], row: int, values: dict[str, torch.Tensor], batch: int) -> None:
    """Write one row's (1, ...) values into batch tensors (B, ...), made on first use: what a
    boundary rule keeps is up to the rule."""
    for name, v in values.items():
        if name not in states:
            states[name] = torch.zeros((batch, *v.shape[1:]), dtype=v.dtype, device=v.device)
        states[name][row] = v[0]


class DecodingState:
    """Caches, positions and the last bytes of every row (what every byte model needs; the flat
    model's whole state)."""

    def __init__(self, model, stacks: dict[Stack, int], batch: int, keep_bytes: int = 1, mode: str = "sample",
                 generator: torch.Generator | None = None):
        # stacks: each layer stack and how many positions its cache must hold (windowed stacks
        # keep only their window, whatever is asked)
        p = next(model.parameters())
        self.batch, self.device, self.dtype, self.mode, self.generator = batch, p.device, p.dtype, mode, generator
        self.caches = {s: KVCache.for_stack(s, batch, size, p.device, p.dtype) for s, size in stacks.items()}
        self.pos = torch.zeros(batch, dtype=torch.long, device=p.device)  # position of each row's next byte
        self.lengths = [0] * batch  # the same on the host
        # how many bytes one byte's input embedding reads
        self.embed_reads = model.ngram_embed.max_n if model.ngram_embed is not None else 1
        keep_bytes = max(keep_bytes, self.embed_reads)
        self.recent = torch.zeros(batch, keep_bytes, dtype=torch.long, device=p.device)  # last bytes, newest last

    def prefill_cache(self, row: int) -> PrefillCache:
        return PrefillCache(self.caches, row)

    def start_row(self, row: int, ids: torch.Tensor) -> None:
        """Row `row` now holds the context ids (1, T)."""
        t = ids.shape[1]
        keep = min(t, self.recent.shape[1])
        self.recent[row].zero_()
        self.recent[row, self.recent.shape[1] - keep:] = ids[0, t - keep:]
        self.pos[row] = t
        self.lengths[row] = t

    def push(self, ids: torch.Tensor) -> None:
        """Each row's newest byte (B,), read at self.pos until advance()."""
        self.recent = torch.cat([self.recent[:, 1:], ids.view(-1, 1)], dim=1)

    def advance(self) -> None:
        self.pos += 1
        self.lengths = [n + 1 for n in self.lengths]

    def embed_newest(self, embed_bytes: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The input embedding of each row's newest byte, (B, d): embed_bytes over the bytes it reads
        (its n-grams), never before the row's context, which the parallel pass sees as 'no byte'."""
        k = self.embed_reads
        have = [min(n + 1, k) for n in self.lengths]
        if min(have) == k:
            return embed_bytes(self.recent[:, -k:])[:, -1]
        out = None
        for n in sorted(set(have)):
            rows = torch.tensor([i for i, h in enumerate(have) if h == n], device=self.device)
            e = embed_bytes(self.recent[rows, -n:])[:, -1]
            out = e.new_zeros(self.batch, e.shape[-1]) if out is None else out
            out[rows] = e
        return out


class LevelState:
    """One stage's running state per row: its main network's latest output, its rule's state and
    (below the bytes) how many items it has read."""

    def __init__(self, batch: int, dim: int, device, dtype):
        self.latest = torch.zeros(batch, dim, device=device, dtype=dtype)
        self.rule: dict[str, torch.Tensor] = {}
        self.n = torch.zeros(batch, dtype=torch.long, device=device)


class HourglassState(DecodingState):
    """Also: a LevelState per stage (levels[0] the bytes, levels[1] the chunks, levels[2] the
    chunks of chunks of a deeper model, ...) and where each row's open chunk starts."""

    def __init__(self, model, batch: int, capacity: int, mode: str = "sample", generator=None):
        # the chunk vocabulary hashes a chunk's last max_len bytes and its length (capped at max_len + 1)
        window = model.chunk_vocab.max_len + 1 if model.chunk_vocab is not None else 1
        super().__init__(model, {s: capacity for s in model.stacks()}, batch, window, mode, generator)
        self.levels = [LevelState(batch, stage.dim, self.device, self.dtype) for stage in model.stages()]
        self.chunk_start = torch.zeros(batch, dtype=torch.long, device=self.device)  # first byte of the open chunk

    def chunk_window(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """For rows whose newest byte closes a chunk: their last bytes (n, L) and the positions
        (n, 2) in them of the previous chunk's end and this one's, all ChunkVocab reads."""
        window = self.recent[rows]
        first = self.pos[rows] - (window.shape[1] - 1)  # context position of window[:, 0]
        end = torch.full_like(first, window.shape[1] - 1)
        return window, torch.stack([self.chunk_start[rows] - 1 - first, end], dim=1)

