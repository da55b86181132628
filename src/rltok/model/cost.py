"""What a module costs: `module.flops(level)`, its forward FLOPs per byte when it runs at `level`
(that many of its items per sequence, that many items per byte). A module without the method is
costed by `module_flops`, which walks its children and counts every nn.Linear, so an unknown
module is never silently free. One multiply-add counts as 2 FLOPs; only matrix products count
(norms, RoPE, activations, the loss and lookups are free). The products are written in the order
the numbers were always computed in, so the FLOPs meter adds up the same floats, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch.nn as nn


@dataclass(frozen=True)
class Level:
    """Where a module runs, as far as its cost is concerned."""

    items: float  # items per sequence at this level: bytes, chunks, supertokens (what attention reaches)
    per_byte: float = 1.0  # items of this level per byte: 1 for bytes, the rate below them
    # attention charged as the kernel computes it (masked pairs and padding included), instead
    # of by the (query, key) pairs the model uses
    kernel: bool = False

    def per_item(self) -> Level:
        """The same level, counted per item instead of per byte."""
        return replace(self, per_byte=1.0)

    def below(self, rate: float) -> Level:
        """The level whose items group `rate` of these items each (chunks of these bytes)."""
        return Level(rate * self.items, self.per_byte * rate, self.kernel)


def linear_flops(layer: nn.Linear, level: Level) -> float:
    """Forward FLOPs per byte of one linear layer (its bias is an add, not counted)."""
    return level.per_byte * 2.0 * layer.in_features * layer.out_features


def linear_layers_flops(module: nn.Module, level: Level) -> float:
    """Forward FLOPs per byte of every nn.Linear inside `module`, whatever else it computes."""
    return sum((linear_flops(m, level) for m in module.modules() if isinstance(m, nn.Linear)), 0.0)


def module_flops(module: nn.Module | None, level: Level) -> float:
    """A module's forward FLOPs per byte: its own answer when it has one (a `flops(level)`
    method), else the sum over its children, nn.Linear layers counted as such."""
    if module is None:
        return 0.0
    if isinstance(module, nn.Linear):
        return linear_flops(module, level)
    own = getattr(module, "flops", None)
    if callable(own):
        return own(level)
    return sum((module_flops(child, level) for child in module.children()), 0.0)


def causal_keys(items: float, window: int | None) -> float:
    """Average number of keys a query uses: all earlier items and itself, or the last `window`
    of them. Linear in `items` without a window, also where `items` is not a count (the slope
    of the chunk level's cost at rate 0 is taken by differences around it)."""
    if window is None or window >= items:
        return (items + 1) / 2.0
    # query i sees min(i + 1, window) keys
    return (window * (window + 1) / 2.0 + (items - window) * window) / items


def blocked_keys(items: float, window: int) -> float:
    """Keys per query the blocked sliding-window kernel computes (layers.blocked_local_attention):
    queries padded to whole blocks of `window`, each block reading its own and the previous
    block, masked pairs included."""
    blocks = math.ceil(items / window)
    return blocks * window * 2 * window / items
