"""Transformer building blocks: RMSNorm, rotary embeddings, (local) causal attention, MLP.

Attention always goes through `F.scaled_dot_product_attention` so GPUs use fused kernels.
Positions are explicit tensors: byte layers use byte indices, the chunk-level network uses the
byte index of each chunk's boundary, so both levels share one notion of position.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_angles(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape positions.shape + (head_dim // 2,), computed in fp32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin broadcastable to (B, 1, T, D/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


_MASKS: dict[tuple, torch.Tensor] = {}


def local_causal_mask(t_q: int, t_k: int, window: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    """Boolean (t_q, t_k) mask: query i (absolute position offset+i) sees keys j with
    i+offset-window < j <= i+offset. Cached: it only depends on the shapes."""
    key = (t_q, t_k, window, str(device), offset)
    m = _MASKS.get(key)
    if m is None:
        q = torch.arange(t_q, device=device).unsqueeze(1) + offset
        k = torch.arange(t_k, device=device).unsqueeze(0)
        m = (k <= q) & (k > q - window)
        if len(_MASKS) > 64:
            _MASKS.clear()
        _MASKS[key] = m
    return m


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, rope_base: float, window: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.window = window  # None: full causal attention
        self.rope_base = rope_base
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def split_heads(self, x: torch.Tensor, positions: torch.Tensor):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope_angles(positions, self.head_dim, self.rope_base)
        if cos.dim() == 3:  # per-sequence positions (B, T, D/2) -> (B, 1, T, D/2)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.split_heads(x, positions)
        drop = self.dropout if self.training else 0.0
        if self.window is None or self.window >= t:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:
            mask = local_causal_mask(t, t, self.window, x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int, ratio: float):
        super().__init__()
        hidden = int(dim * ratio)
        self.fc = nn.Linear(dim, hidden, bias=False)
        self.proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, mlp_ratio: float, rope_base: float,
                 window: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = Attention(dim, n_heads, rope_base, window, dropout)
        self.norm2 = RMSNorm(dim)
        self.mlp = MLP(dim, mlp_ratio)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), positions)
        return x + self.mlp(self.norm2(x))


class Stack(nn.Module):
    """A run of blocks with a final norm."""

    def __init__(self, n_layers: int, dim: int, n_heads: int, mlp_ratio: float, rope_base: float,
                 window: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(dim, n_heads, mlp_ratio, rope_base, window, dropout) for _ in range(n_layers)
        )
        self.norm = RMSNorm(dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, positions)
        return self.norm(x)


def init_weights(module: nn.Module, n_residual_layers: int) -> None:
    """GPT-2 style init: N(0, 0.02), residual output projections scaled by 1/sqrt(2L)."""
    std = 0.02
    for name, p in module.named_parameters():
        if p.dim() < 2:
            continue
        if name.endswith("proj.weight"):
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * max(1, n_residual_layers)))
        else:
            nn.init.normal_(p, 0.0, std)
