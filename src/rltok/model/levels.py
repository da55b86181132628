"""The levels below the bytes, described once, a `LevelSpec` each; `chunk_levels(cfg)` is the one
place that turns the config into that list (`HourglassLM(cfg, levels=[...])` takes any)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch.nn as nn

from rltok.config import ModelConfig
from rltok.model.chunkers import RLPolicy


@dataclass(frozen=True)
class LevelSpec:
    """One stage over the chunks of the level above it."""

    width: int  # its items' width; the chunks above are projected to it when theirs differs
    heads: int
    layers: int  # its encoder's layers, and its decoder's
    chunker: Callable[[int], nn.Module]  # its boundary rule, built for items of `width`
    target_rate: float | None = None  # chunks per item the rule aims at (None: the rule has no target)


def chunk_levels(cfg: ModelConfig) -> list[LevelSpec]:
    """The chunk levels the config describes: with model.stages=2, one stage over the chunks
    whose RL policy (window 1) groups them into supertokens at model.stage2_target_rate."""
    if cfg.stages < 2:
        return []
    rule = partial(RLPolicy, window=1, target_rate=cfg.stage2_target_rate, detach_input=cfg.chunker.detach)
    return [LevelSpec(cfg.d_chunk, cfg.n_heads_chunk, cfg.stage2_layers, rule, cfg.stage2_target_rate)
            for _ in range(cfg.stages - 1)]
