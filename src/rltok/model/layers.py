"""Transformer building blocks: RMSNorm, rotary embeddings, (local) causal attention through
`F.scaled_dot_product_attention`, MLP, and the KV caches of decoding. Positions are explicit byte
indices; packed rows (`Packing`) are padded for attention alone."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from rltok.model.cost import Level, blocked_keys, causal_keys, linear_layers_flops

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


class Packing:
    """Where N items packed end to end, (1, N, ...), sit in a padded (batch, width, ...) layout:
    row r's lengths[r] items first, then padding. No host sync."""

    def __init__(self, lengths: torch.Tensor, width: int, total: int):
        self.batch, self.width = lengths.shape[0], width
        dev = lengths.device
        starts = torch.cumsum(lengths, 0) - lengths  # of each row in the packed order
        row = torch.repeat_interleave(torch.arange(self.batch, device=dev), lengths, output_size=total)
        slot = torch.arange(total, device=dev) - starts[row]
        self.index = row * width + slot  # (N,) flat padded slot of each item

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(1, N, ...) -> (batch, width, ...), zeros in the padding."""
        out = x.new_zeros(self.batch * self.width, *x.shape[2:])  # (in place: index_copy would clone it)
        return out.index_copy_(0, self.index, x[0]).view(self.batch, self.width, *x.shape[2:])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, width, ...) -> (1, N, ...)."""
        return x.reshape(self.batch * self.width, *x.shape[2:]).index_select(0, self.index).unsqueeze(0)


# Masks depend only on their shapes: kept per shape (a plain dict: torch.compile traces through it,
# where it would ignore a functools cache and warn), cleared past 64 entries.
_MASKS: dict[tuple, torch.Tensor] = {}


def _cached(key: tuple, make) -> torch.Tensor:
    mask = _MASKS.get(key)
    if mask is None:
        if len(_MASKS) > 64:
            _MASKS.clear()
        mask = _MASKS[key] = make()
    return mask


def local_causal_mask(t_q: int, t_k: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean (t_q, t_k) mask: query i sees keys j with i - window < j <= i."""
    def make():
        q = torch.arange(t_q, device=device).unsqueeze(1)
        k = torch.arange(t_k, device=device).unsqueeze(0)
        return (k <= q) & (k > q - window)
    return _cached(("local", t_q, t_k, window, str(device)), make)


def _block_mask(n: int, w: int, heads: int, device: torch.device) -> torch.Tensor:
    """(heads * n, w, 2 * w): block b's queries against its previous block's keys and its own."""
    def make():
        i = torch.arange(w, device=device).unsqueeze(1)
        j = torch.arange(2 * w, device=device).unsqueeze(0)
        m = ((j <= i + w) & (j > i)).expand(n, w, 2 * w).clone()  # key at j - w relative to the block
        m[0, :, :w] = False  # the first block has no previous block
        return m.repeat(heads, 1, 1)  # row h * n + block
    return _cached(("block", n, w, heads, str(device)), make)


def blocked_local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                            dropout: float = 0.0) -> torch.Tensor:
    """Sliding-window causal attention in O(T * window): each block of `window` queries attends to
    its own block and the previous one under a mask; same result as the dense masked form."""
    bsz, heads, t, dim = q.shape
    w = window
    n = -(-t // w)
    pad = n * w - t  # padded keys sit after every real query, so causality hides them
    if pad:
        q, k, v = (F.pad(z, (0, 0, 0, pad)) for z in (q, k, v))
    qb = q.reshape(bsz, heads * n, w, dim)
    kb, vb = k.view(bsz, heads, n, w, dim), v.view(bsz, heads, n, w, dim)
    kk = torch.cat([F.pad(kb, (0, 0, 0, 0, 1, 0))[:, :, :-1], kb], dim=3).reshape(bsz, heads * n, 2 * w, dim)
    vv = torch.cat([F.pad(vb, (0, 0, 0, 0, 1, 0))[:, :, :-1], vb], dim=3).reshape(bsz, heads * n, 2 * w, dim)
    mask = _block_mask(n, w, heads, q.device)
    # a 4-D mask lets SDPA pick its fused CPU kernel instead of the math fallback
    y = F.scaled_dot_product_attention(qb, kk, vv, attn_mask=mask.unsqueeze(0), dropout_p=dropout)
    return y.view(bsz, heads, n * w, dim)[:, :, :t]


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

    def split_heads(self, x: torch.Tensor, positions: torch.Tensor, packing: Packing | None = None):
        qkv = self.qkv(x)
        if packing is not None:  # attention runs per row: the packed rows, padded
            qkv = packing.pad(qkv)
        b, t, _ = qkv.shape
        q, k, v = qkv.view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope_angles(positions, self.head_dim, self.rope_base)
        if cos.dim() == 3:  # per-sequence positions (B, T, D/2) -> (B, 1, T, D/2)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        t = q.shape[2]
        if self.window is None or self.window >= t:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        if 4 * self.window <= t:  # blocked: each query reads 2 * window keys instead of t
            return blocked_local_attention(q, k, v, self.window, dropout)
        mask = local_causal_mask(t, t, self.window, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)

    def keys(self, items: float, kernel: bool = False) -> float:
        """Keys per query over `items` queries: the pairs the causal window uses, or (kernel) those
        the kernel `attend` picks computes, masked ones included, as a profiler counts them."""
        if not kernel:
            return causal_keys(items, self.window)
        if self.window is None or self.window >= items or 4 * self.window > items:
            return items  # the causal or the dense masked kernel: every key for every query
        return blocked_keys(items, self.window)

    def flops(self, level: Level) -> float:
        return linear_layers_flops(self, level) + level.per_byte * self.query_flops(level)

    def query_flops(self, level: Level) -> float:
        """Forward FLOPs per query of QK^T and AV: head_dim multiply-adds per key, each, per head."""
        return 4.0 * self.n_heads * self.head_dim * self.keys(level.items, level.kernel)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, packing: Packing | None = None,
                kvs: list | None = None) -> torch.Tensor:
        """x (B, T, dim) at positions (T,) or (B, T); packed: x (1, N, dim) and the padded
        positions (batch, width) of `packing`'s layout. `kvs`: a list the rotated keys and values
        are appended to (what seeds a KVCache)."""
        q, k, v = self.split_heads(x, positions, packing)
        if kvs is not None:
            kvs.append((k, v))
        y = self.attend(q, k, v, self.dropout if self.training else 0.0)
        b, _, t, _ = y.shape
        y = y.transpose(1, 2).reshape(b, t, x.shape[-1])
        return self.proj(y if packing is None else packing.unpad(y))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: "KVCache", layer: int):
        """One new position per row: x (n, 1, dim), cos/sin (n, 1, 1, head_dim/2)."""
        n, _, d = x.shape
        q, k, v = self.qkv(x).view(n, 1, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        keys, values, mask = cache.update(layer, apply_rope(k, cos, sin), v)
        q = apply_rope(q, cos, sin)
        # the cache keeps the parameters' dtype; under autocast q is in the lower precision
        y = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(n, 1, d))


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

    def forward(self, x: torch.Tensor, positions: torch.Tensor, packing: Packing | None = None,
                kvs: list | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), positions, packing, kvs)
        return x + self.mlp(self.norm2(x))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: "KVCache", layer: int):
        x = x + self.attn.step(self.norm1(x), cos, sin, cache, layer)
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

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None,
                packing: Packing | None = None) -> torch.Tensor:
        """`cache` (decoding, eval mode): every layer's rotated keys and values go to
        `cache.fill(self, [(k, v), ...])`, from which `step` continues. `packing`: as in
        Attention.forward; not with a cache."""
        if cache is not None and packing is not None:
            raise ValueError("a cache is filled from one row: it takes no packing")
        kvs = None if cache is None else []
        for block in self.blocks:
            x = block(x, positions, packing, kvs)
        if cache is not None:
            cache.fill(self, kvs)
        return self.norm(x)

    # what it costs: its blocks are alike, so one block's count times their number
    def linear_flops(self, level: Level) -> float:
        """Forward FLOPs per byte of the blocks' linear layers (q, k, v, out, MLP in and out)."""
        if not self.blocks:
            return 0.0
        return level.per_byte * len(self.blocks) * linear_layers_flops(self.blocks[0], level.per_item())

    def attention_flops(self, level: Level) -> float:
        """Forward FLOPs per byte of the blocks' attention (QK^T and AV) over `level.items`."""
        if not self.blocks:
            return 0.0
        return level.per_byte * len(self.blocks) * self.blocks[0].attn.query_flops(level)

    def flops(self, level: Level) -> float:
        return self.linear_flops(level) + self.attention_flops(level)

    def step(self, x: torch.Tensor, positions: torch.Tensor, cache: "KVCache",
             rows: list[int] | None = None) -> torch.Tensor:
        """Advance one position per row: x (n, 1, dim) at `positions` (n,), reading and extending
        the cache rows `rows` (None: all rows, in order)."""
        if not self.blocks:  # a stack of no layers is its norm (stage2_layers=0)
            return self.norm(x)
        attn = self.blocks[0].attn
        # RoPE angles once per step, shared by every layer
        cos, sin = rope_angles(positions.view(-1, 1, 1), attn.head_dim, attn.rope_base)
        cache.begin(rows)
        for i, block in enumerate(self.blocks):
            x = block.step(x, cos, sin, cache, i)
        cache.end()
        return self.norm(x)


class KVCache:
    """Keys and values of every layer of a Stack, for decoding one position per row at a time: up
    to `size` entries, or a ring of the last `window` (entry p in slot p % window; attention
    ignores key order). Row lengths are kept on the host."""

    def __init__(self, n_layers: int, batch: int, n_heads: int, head_dim: int, size: int,
                 window: int | None, device, dtype=torch.float32):
        self.window = window
        self.size = size if window is None else window
        shape = (batch, n_heads, self.size, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.lengths = [0] * batch  # entries ever written per row
        self.device = device

    @classmethod
    def for_stack(cls, stack: Stack, batch: int, size: int, device, dtype=torch.float32) -> "KVCache":
        if not stack.blocks:
            return cls(0, batch, 1, 1, size, None, device, dtype)
        attn = stack.blocks[0].attn
        return cls(len(stack.blocks), batch, attn.n_heads, attn.head_dim, size, attn.window, device, dtype)

    def fill(self, row: int, kvs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Reset `row` to the (1, H, T, D) keys/values of positions 0..T-1."""
        if not kvs:
            return
        t = kvs[0][0].shape[2]
        if self.window is None and t > self.size:
            raise ValueError(f"{t} entries do not fit a cache of {self.size}")
        keep = min(t, self.size)
        slots = torch.arange(t - keep, t, device=self.device) % self.size
        for layer, (k, v) in enumerate(kvs):
            # cast: under autocast the keys come in a lower precision than the cache's
            self.k[layer][row][:, slots] = k[0, :, t - keep:].to(self.k[layer].dtype)
            self.v[layer][row][:, slots] = v[0, :, t - keep:].to(self.v[layer].dtype)
        self.lengths[row] = t

    def begin(self, rows: list[int] | None) -> None:
        """Work out the write slots and the attention mask, shared by every layer of this step."""
        self._rows = rows
        lens = self.lengths if rows is None else [self.lengths[r] for r in rows]
        if self.window is None and max(lens) >= self.size:
            raise RuntimeError(f"KV cache full ({self.size} entries)")
        slots = [n % self.size for n in lens]
        after = [n + 1 for n in lens]
        self._span = min(max(after), self.size)
        self._mask = None  # rows whose ring is not full yet must not see the empty slots
        if min(after) < self._span:
            valid = torch.arange(self._span, device=self.device) < torch.tensor(after, device=self.device).unsqueeze(1)
            self._mask = valid.view(len(lens), 1, 1, self._span)
        if rows is None and len(set(slots)) == 1:
            self._index = (slice(None), slice(None), slots[0])  # plain slicing: cheapest
        else:
            r = torch.arange(len(lens)) if rows is None else torch.tensor(rows)
            self._index = (r.to(self.device), slice(None), torch.tensor(slots, device=self.device))
        self._read = None if rows is None else torch.tensor(rows, device=self.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write this step's (n, H, 1, D) keys/values; return (keys, values, mask) to attend to."""
        keys, values = self.k[layer], self.v[layer]
        keys[self._index] = k[:, :, 0].to(keys.dtype)
        values[self._index] = v[:, :, 0].to(values.dtype)
        if self._read is None:
            return keys[:, :, : self._span], values[:, :, : self._span], self._mask
        return keys[self._read, :, : self._span], values[self._read, :, : self._span], self._mask

    def end(self) -> None:
        for r in range(len(self.lengths)) if self._rows is None else self._rows:
            self.lengths[r] += 1


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


def param_count(*modules: nn.Module | None) -> int:
    """Parameters of the given modules together (None: an optional part that is off)."""
    params = {id(p): p for m in modules if m is not None for p in m.parameters()}
    return sum(p.numel() for p in params.values())
