"""Rules trained straight-through, by the LM loss's gradient through a gate of value 1: H-Net's
router, the Gumbel-sigmoid rule on this backbone's last-byte chunks, and dynamic pooling as its
paper has it (segment means)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.model.chunkers.base import Boundaries, Chunker, fp32_linear
from rltok.model.cost import Level
from rltok.model.noise import uniform  # noise that data-parallel ranks can slice from the global batch


class HNetRouter(Chunker):
    """H-Net's dynamic chunking: p_t = (1 - cos(q_t, k_{t-1})) / 2 on projected encoder states,
    boundary where p_t >= 0.5. Trained straight-through: the upsampled vector is scaled by the
    confidence (p_t or 1 - p_t) with its value replaced by 1, chunk outputs are smoothed by an
    EMA weighted by p, and a ratio loss pulls the rate towards the target."""

    tracks_target = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(dim or m.d_byte, rate or m.target_rate, settings.ratio_weight)

    def __init__(self, dim: int, rate: float, ratio_weight: float = 0.03):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        nn.init.eye_(self.q.weight)  # start as plain cosine similarity of adjacent states
        nn.init.eye_(self.k.weight)
        self.rate = rate
        self.ratio_weight = ratio_weight

    def forward(self, h, forced, b=None, mode="sample", generator=None, **_) -> Boundaries:
        q, k = fp32_linear(self.q, h), fp32_linear(self.k, h)
        cos = F.cosine_similarity(q[:, 1:], k[:, :-1], dim=-1)
        p = torch.cat([cos.new_ones(cos.shape[0], 1), ((1 - cos) / 2).clamp(0, 1)], dim=1)  # (a 1-byte window too)
        p = torch.where(forced, torch.ones_like(p), p)
        b, c = self.cut(p, forced, b)
        confidence = c + (1 - c).detach()  # straight-through: forward 1, gradient of c
        # ratio loss (H-Net): N/(N-1) * ((N-1) F G + (1-F)(1-G)), minimal at F = G = 1/N
        n = 1.0 / self.rate
        f_sel = b[~forced].float().mean()
        g_prob = p[~forced].mean()
        ratio = n / (n - 1) * ((n - 1) * f_sel * g_prob + (1 - f_sel) * (1 - g_prob))
        return Boundaries(b=b, free=~forced, confidence=confidence, smooth=p, scores=p.detach(),
                          aux_loss=self.ratio_weight * ratio)

    @staticmethod
    def cut(p: torch.Tensor, forced: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The decisions (where p >= 0.5 unless given) and their confidence, p or 1 - p."""
        b = (p >= 0.5 if b is None else b.bool()) | forced
        return b, torch.where(b, p, 1 - p)

    def chunk_flops(self, level: Level, dim: int) -> float:
        """The EMA over chunks (stage.ema_over_chunks): a dense (chunks x chunks) @ (chunks x dim)
        product per sequence."""
        return level.per_byte * 2.0 * level.items * dim

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        return {"key": fp32_linear(self.k, h[:, -1])}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, **_) -> Boundaries:
        q, k = fp32_linear(self.q, h), fp32_linear(self.k, h)
        cos = F.cosine_similarity(q, state["key"], dim=-1)
        state["key"] = k
        p = torch.where(forced, torch.ones_like(cos), ((1 - cos) / 2).clamp(0, 1))
        b, c = self.cut(p, forced, b)
        return Boundaries(b=b, free=~forced, confidence=c + (1 - c), smooth=p, scores=p)


class GumbelChunker(Chunker):
    """Dynamic-pooling style: an MLP scores each byte, a hard Gumbel-sigmoid sample decides, and
    a straight-through gate (value 1, gradient of the soft sample) multiplies the selected
    vectors. A binomial prior on the boundary count holds the rate near the target."""

    tracks_target = True
    stochastic = True

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(dim or m.d_byte, rate or m.target_rate, settings.temperature, settings.prior_weight)

    def __init__(self, dim: int, rate: float, temperature: float = 1.0, prior_weight: float = 1.0,
                 scorer: nn.Module | None = None):
        super().__init__()
        self.mlp = scorer if scorer is not None else self.scorer(dim, rate)
        self.rate = rate
        self.temperature = temperature
        self.prior_weight = prior_weight

    @staticmethod
    def scorer(dim: int, rate: float) -> nn.Sequential:
        """The default per-byte boundary scorer: one hidden layer of `dim`, starting at the target rate."""
        mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1))
        nn.init.zeros_(mlp[2].weight)
        nn.init.constant_(mlp[2].bias, math.log(rate / (1 - rate)))
        return mlp

    def soft(self, logits: torch.Tensor, mode: str, generator, noise: torch.Tensor | None = None) -> torch.Tensor:
        # "sample" draws the hard Gumbel-sigmoid sample in training and evaluation alike (the rule
        # the model trained with); "greedy" thresholds the noiseless probability at 0.5, an
        # inference rule the model never trained with (with the bias at logit(0.2) it draws no
        # free boundary at all until the scorer has learned confident boundaries)
        if mode == "greedy":
            return torch.sigmoid(logits)
        u = (noise if noise is not None else uniform(logits.shape, logits.device, generator)).clamp(1e-6, 1 - 1e-6)
        return torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / self.temperature)

    def decide(self, h, forced, b, mode, generator, noise=None) -> tuple[torch.Tensor, ...]:
        """The scores' logits, the soft sample (drawn whether b is given or not) and the decisions."""
        logits = fp32_linear(self.mlp, h).squeeze(-1)
        soft = self.soft(logits, mode, generator, noise)
        return logits, soft, (soft > 0.5 if b is None else b.bool()) | forced

    def forward(self, h, forced, b=None, mode="sample", generator=None, noise=None, **_) -> Boundaries:
        # `noise`: one draw per item, from a level above bytes (its rows are padded to the batch's
        # longest: a fresh (B, M) draw would tie a row's decisions to the other rows' later bytes)
        logits, soft, b = self.decide(h, forced, b, mode, generator, noise)
        # a forced boundary is no decision of the scorer's: its gate is 1 and carries no gradient
        gate = torch.where(forced, b.float(), soft + (b.float() - soft).detach())
        free = ~forced
        count = gate.masked_fill(forced, 0).sum(1)
        n_free = free.sum(1).float()
        prior = torch.distributions.Binomial(total_count=n_free, probs=torch.full_like(n_free, self.rate))
        nll = -prior.log_prob(count.clamp(max=n_free)).mean() / n_free.mean()
        return Boundaries(b=b, free=free, gate=gate, scores=torch.sigmoid(logits.detach()),
                          aux_loss=self.prior_weight * nll)

    def step(self, state, h, forced, b=None, mode="sample", generator=None, noise=None, **_) -> Boundaries:
        logits, soft, b = self.decide(h, forced, b, mode, generator, noise)
        return Boundaries(b=b, free=~forced, gate=soft + (b.float() - soft), scores=torch.sigmoid(logits))


class DynamicPooling(GumbelChunker):
    """Dynamic pooling (Nawrot et al., 2023) as its code has it: the Gumbel-sigmoid rule above, but
    a chunk is the mean of its bytes' states, layer-normalised, and each byte's membership in its
    chunk counts the straight-through boundaries before it. So the language model's gradient
    reaches the scorer at every byte inside a chunk, where `gumbel` (a chunk is its last byte's
    state) passes it only at the cuts. The original's scorer too: a hidden layer `hidden_mult`
    times as wide, PyTorch's default initialisation (about half the bytes cut at the start, the
    prior pulling the count to the target), temperature 0.5."""

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(dim or m.d_byte, rate or m.target_rate, settings.temperature, settings.prior_weight,
                   settings.hidden_mult)

    def __init__(self, dim: int, rate: float, temperature: float = 0.5, prior_weight: float = 1.0,
                 hidden_mult: int = 4):
        hidden = hidden_mult * dim
        scorer = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))  # PyTorch's init
        super().__init__(dim, rate, temperature, prior_weight, scorer)
        self.norm = nn.LayerNorm(dim)

    def policy_parameters(self):
        """The scorer's: the chunks' norm belongs to the model and trains at its rate (as in the original)."""
        return self.mlp.parameters()

    def pool(self, h: torch.Tensor, bd: Boundaries, last: torch.Tensor) -> torch.Tensor:
        """Each chunk's mean state: bytes are summed into their chunk's slot (in fp32, so the
        one-byte step's running sum matches; a sum, not a matrix product, so no FLOPs are charged
        for it, as for norms), each weighted by a membership of value 1 whose
        gradient is that of the straight-through boundaries closed before the byte."""
        n_max = last.shape[1]
        gate = torch.where(bd.free, bd.gate, bd.b.float())  # forced cuts are not the rule's: no gradient
        closed = torch.cumsum(gate, 1) - gate  # chunks closed before each byte: its chunk's index
        # bytes after a row's last cut land in a slot past its chunks (padding, or n_max, dropped)
        slot = closed.detach().round().long().clamp(max=n_max)
        weight = 1.0 + closed - closed.detach()
        sums = h.new_zeros(h.shape[0], n_max + 1, h.shape[-1], dtype=torch.float32)
        sums = sums.scatter_add(1, slot.unsqueeze(-1).expand(-1, -1, h.shape[-1]), weight.unsqueeze(-1) * h.float())
        size = weight.new_zeros(h.shape[0], n_max + 1).scatter_add(1, slot, weight)
        mean = sums[:, :n_max] / size[:, :n_max].clamp(min=1.0).unsqueeze(-1)  # (padding slots hold no byte)
        return self.norm(mean).to(h.dtype)

    def start_state(self, h, b, idx=None, early_logits=None, offset: int = 0) -> dict[str, torch.Tensor]:
        """The open chunk after the context: the sum and count of the states since its last cut."""
        ends = torch.nonzero(b[0]).flatten()
        start = int(ends[-1]) + 1 if len(ends) else 0
        rest = h[:, start:].float()
        return {"sum": rest.sum(1), "count": rest.new_full((1,), rest.shape[1])}

    def step(self, state, h, forced, b=None, mode="sample", generator=None, noise=None, **_) -> Boundaries:
        bd = super().step(state, h, forced, b, mode, generator, noise)
        total = h.float() + state["sum"] if "sum" in state else h.float()  # (no state before a first prefill)
        count = state["count"] + 1 if "count" in state else h.new_ones(h.shape[0], dtype=torch.float32)
        bd.pooled = self.norm(total / count.unsqueeze(-1))
        state["sum"] = torch.where(bd.b.unsqueeze(-1), 0.0, total)
        state["count"] = torch.where(bd.b, 0.0, count)
        return bd
