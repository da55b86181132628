"""A lexicon prior for the boundary policy: a segmentation's code length under a unigram model of
the policy's own recent chunks, p(w) = (n_w + a * P0(w)) / (N + a) (docs/CONFIG.md, "The objective").
Only what training uses; the instruments studied beside it are in the lab."""

from __future__ import annotations

import math

import torch

from rltok.model.chunk_vocab import odd_multipliers, span_hash

_HASH_SEED = 0x1E71C0
HASHED_LEN = 16  # a chunk is hashed by its last 16 bytes and its length


class ChunkLexicon:
    def __init__(self, size: int = 1 << 20, concentration: float = 100.0, mean_len: float = 5.0,
                 decay: float = 0.995, device=None):
        if size < 2 or concentration <= 0 or mean_len < 1 or not 0 < decay <= 1:
            raise ValueError("ChunkLexicon needs size >= 2, concentration > 0, mean_len >= 1, 0 < decay <= 1")
        self.size, self.concentration, self.decay = size, concentration, decay
        self.stop = 1.0 / mean_len  # P0's chance that a chunk ends at each byte
        self.counts = torch.zeros(size, device=device)
        self.byte_counts = torch.zeros(256, device=device)
        self.mult = odd_multipliers(HASHED_LEN + 1, _HASH_SEED).to(device)  # per offset from the end, and the length

    @staticmethod
    def chunk_starts(b: torch.Tensor) -> torch.Tensor:
        """(B, T) first byte of the chunk each position belongs to: one past the last boundary
        strictly before it (0 when there is none)."""
        t = torch.arange(b.shape[1], device=b.device).expand_as(b)
        last = torch.where(b.bool(), t, torch.full_like(t, -1)).cummax(dim=1).values  # last boundary <= t
        prev = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=1)  # last boundary < t
        return prev + 1

    def hashes(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """(B, T) table row of the string x[start_t .. t] for every position t."""
        t = torch.arange(x.shape[1], device=x.device).expand_as(x)
        return self.rows(x, t, start)

    def rows(self, x: torch.Tensor, end: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Count-table rows of the chunks x[start..end], (B, M) each: the chunk vocabulary's content hash."""
        return span_hash(x, end, start, self.mult, self.size)

    def ends(self, b: torch.Tensor) -> torch.Tensor:
        """Positions that close a chunk: the boundaries and the window's last byte."""
        e = b.bool().clone()
        e[:, -1] = True
        return e

    @torch.no_grad()
    def costs(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(B, T) float: -log p(chunk) in nats at each chunk's last byte (chunks closed by b and by
        the window's end), 0 elsewhere."""
        t = torch.arange(x.shape[1], device=x.device).expand_as(x)
        cost = self.span_costs(x, self.chunk_starts(b), t)
        return torch.where(self.ends(b), cost, torch.zeros_like(cost))

    def span_costs(self, x: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
        """-log p(x[start..end]) in nats for every pair of (B, M) positions (end >= start); `rows`:
        the chunks' table rows (`rows(x, end, start)`) when the caller already has them."""
        log_p0 = self.base_log_probs(x, start, end)
        n = self.counts[self.rows(x, end, start) if rows is None else rows]
        log_p = torch.logaddexp(n.clamp(min=1e-30).log(), log_p0 + math.log(self.concentration)) \
            - torch.log(self.counts.sum() + self.concentration)
        return -log_p

    def byte_probs(self) -> torch.Tensor:
        """(256,) the counted bytes' probabilities, add-one smoothed: any byte possible."""
        return (self.byte_counts + 1) / (self.byte_counts.sum() + 256)

    def base_log_probs(self, x: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """log P0(x[start..end]), (B, M): a geometric length times each byte's unigram probability."""
        log_pb = self.byte_probs().log()[x.long()]
        cum = torch.nn.functional.pad(torch.cumsum(log_pb, dim=1), (1, 0))  # cum[:, i]: over bytes < i
        byte_sum = torch.gather(cum, 1, end + 1) - torch.gather(cum, 1, start)
        return byte_sum + math.log(self.stop) + (end - start).float() * math.log1p(-self.stop)

    @torch.no_grad()
    def update(self, x: torch.Tensor, b: torch.Tensor) -> None:
        """Count the chunks of a sampled segmentation (complete ones: those a boundary closes)
        and its bytes, after decaying the old counts."""
        ends = b.bool()
        rows = self.hashes(x, self.chunk_starts(ends))[ends]
        self._count(x, rows, torch.ones_like(rows, dtype=self.counts.dtype))

    def _count(self, x: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> None:
        """Decay the old counts, then add `weights` at table `rows` and count the bytes of x."""
        self.counts.mul_(self.decay).index_add_(0, rows, weights)
        self.byte_counts.mul_(self.decay).index_add_(0, x.flatten().long(),
                                                     torch.ones(x.numel(), device=x.device))

    def state_dict(self) -> dict:
        return {"counts": self.counts.clone(), "byte_counts": self.byte_counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        if "pair_counts" in state:
            raise ValueError("the checkpoint's lexicon is a bigram one (the removed objective.lexicon_context=bigram)")
        if "byte_pair_counts" in state:
            raise ValueError("the saved lexicon spells units with a bigram base, an instrument's option "
                             "(rltok_lab.lexicon_instruments.LabLexicon(base='bigram')); this one with the "
                             "unigram base")
        if state["counts"].shape != self.counts.shape:
            raise ValueError(f"lexicon table of {state['counts'].numel()} rows in the checkpoint, "
                             f"{self.size} configured (objective.lexicon_size)")
        self.counts.copy_(state["counts"])
        self.byte_counts.copy_(state["byte_counts"])
