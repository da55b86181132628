"""Rules no gradient reaches: a fixed stride, uniformly random cuts, word starts (SpaceByte) and
entropy spikes of the early-exit head (BLT)."""

from __future__ import annotations

import torch

from rltok.model.chunkers.base import Boundaries, Chunker
from rltok.model.noise import uniform  # noise that data-parallel ranks can slice from the global batch


class FixedChunker(Chunker):
    """A boundary every `stride` bytes (byte stride-1, 2*stride-1, ...), plus the forced ones."""

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(settings.stride)

    def __init__(self, stride: int):
        super().__init__()
        self.stride = stride

    def forward(self, h: torch.Tensor, forced: torch.Tensor, b: torch.Tensor | None = None,
                mode: str = "sample", generator: torch.Generator | None = None, **_) -> Boundaries:
        if b is None:
            t = torch.arange(h.shape[1], device=h.device)
            b = ((t + 1) % self.stride == 0).unsqueeze(0).expand_as(forced)
        return Boundaries(b=b.bool() | forced, free=~forced)

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        # the stride counts from the row's first byte, also after a context slid past it
        return {"next": torch.full((1,), offset + b.shape[1], dtype=torch.long, device=b.device)}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, **_) -> Boundaries:
        if b is None:
            b = (state["next"] + 1) % self.stride == 0
        state["next"] = state["next"] + 1
        return Boundaries(b=b.bool() | forced, free=~forced)


class UniformChunker(Chunker):
    """Exactly round(rate * free) boundaries per sequence at uniformly random free positions.
    Decoding, which cannot know the window's length, and a level above bytes, which hands it one
    draw per item, draw each item independently at the rate (equally likely positions; only the
    count varies)."""

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(rate or m.target_rate)

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def forward(self, h, forced, b=None, mode="sample", generator=None, noise=None, **_) -> Boundaries:
        if b is None and noise is not None:
            # a level above bytes hands one draw per item: its rows are padded to the batch's longest,
            # so an exact count over them would depend on the other rows and on later bytes; each item
            # is drawn at the rate instead, as in decoding
            b = noise < self.rate
        if b is None:
            free = ~forced
            k = int(round(self.rate * int(free[0].sum())))
            noise = uniform(forced.shape, forced.device, generator)
            noise = noise.masked_fill(forced, -1.0)  # forced slots never count towards k
            b = torch.zeros_like(forced)
            if k > 0:
                b.scatter_(1, noise.topk(k, dim=1).indices, True)
        return Boundaries(b=b.bool() | forced, free=~forced)

    def step(self, state, h, forced, b=None, mode="sample", generator=None, noise=None, **_) -> Boundaries:
        if b is None:
            b = (noise if noise is not None else uniform(forced.shape, forced.device, generator)) < self.rate
        return Boundaries(b=b.bool() | forced, free=~forced)


def spacelike(idx: torch.Tensor) -> torch.Tensor:
    """SpaceByte's rule: a byte is space-like unless it is an ASCII letter or digit or a UTF-8
    continuation byte (0x80-0xBF)."""
    letter = ((idx >= 65) & (idx <= 90)) | ((idx >= 97) & (idx <= 122))
    digit = (idx >= 48) & (idx <= 57)
    cont = (idx >= 0x80) & (idx <= 0xBF)
    return ~(letter | digit | cont)


class WhitespaceChunker(Chunker):
    """SpaceByte-style: a chunk ends at a space-like byte that follows a non-space-like one, so the
    chunk-level network runs right before each new word."""

    def forward(self, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        if b is None:
            sp = spacelike(idx)
            prev = torch.ones_like(sp)
            prev[:, 1:] = sp[:, :-1]
            b = sp & ~prev
        return Boundaries(b=b.bool() | forced, free=~forced)

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        return {"space": spacelike(idx[:, -1])}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        sp = spacelike(idx)
        if b is None:
            b = sp & ~state["space"]
        state["space"] = sp
        return Boundaries(b=b.bool() | forced, free=~forced)


class EntropyChunker(Chunker):
    """BLT-style: a chunk ends at byte t when the early-exit head's entropy over byte t+1 rises by
    more than a threshold over the entropy at t-1 (the next byte is surprising). The threshold
    is a running estimate (a mean, then an EMA; averaged over data-parallel ranks) of the score
    quantile that gives the target rate, fed by training batches *after* they are cut, so a batch's
    boundaries never depend on its later bytes. Before the first training batch no free boundary
    is drawn. Kept in buffers, so evaluation and resumes reuse it."""

    tracks_target = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(rate or m.target_rate)

    def __init__(self, rate: float, momentum: float = 0.99):
        super().__init__()
        self.rate = rate
        self.momentum = momentum
        self.register_buffer("threshold", torch.tensor(float("nan")))
        self.register_buffer("updates", torch.tensor(0, dtype=torch.long))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints from before the update counter: treat their threshold as settled
        if prefix + "threshold" in state_dict and prefix + "updates" not in state_dict:
            state_dict[prefix + "updates"] = torch.tensor(int(1 / (1 - self.momentum)), dtype=torch.long)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    uses_early_logits = True

    @staticmethod
    def entropy(early_logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(early_logits.detach().float()[..., :256], dim=-1)
        return -(logp.exp() * logp).sum(-1)

    def score(self, early_logits: torch.Tensor) -> torch.Tensor:
        ent = self.entropy(early_logits)
        prev = torch.zeros_like(ent)
        prev[:, 1:] = ent[:, :-1]
        return ent - prev

    @torch.no_grad()
    def _update_threshold(self, s: torch.Tensor, forced: torch.Tensor) -> None:
        q = torch.quantile(s[~forced].float()[:1_000_000], 1 - self.rate)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(q)
            q = q / torch.distributed.get_world_size()
        n = int(self.updates)
        keep = min(self.momentum, n / (n + 1))  # running mean at first, then the EMA
        self.threshold.copy_(q if n == 0 else keep * self.threshold + (1 - keep) * q)
        self.updates.add_(1)

    def forward(self, h, forced, b=None, mode="sample", generator=None, early_logits=None, **_) -> Boundaries:
        s = self.score(early_logits)
        if b is None:
            b = s > self.threshold if not torch.isnan(self.threshold) else torch.zeros_like(forced)
            if self.training:  # after cutting: this batch informs later batches only
                self._update_threshold(s, forced)
        return Boundaries(b=b.bool() | forced, free=~forced, scores=torch.sigmoid(s - self.threshold))

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        return {"entropy": self.entropy(early_logits[:, -1])}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, early_logits=None,
             **_) -> Boundaries:
        # decoding reads the threshold and never moves it: that is training's business
        ent = self.entropy(early_logits)
        s = ent - state["entropy"]
        state["entropy"] = ent
        if b is None:
            b = s > self.threshold if not torch.isnan(self.threshold) else torch.zeros_like(forced)
        return Boundaries(b=b.bool() | forced, free=~forced, scores=torch.sigmoid(s - self.threshold))
