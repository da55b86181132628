"""Boundary rules, by kind (`base` the interface; `policy`, `fixed`, `straight_through`, `bpe`); every
name is importable from here."""

from rltok.model.chunkers.base import (Boundaries, Chunker, NonCausalRule, bernoulli_logp, build_chunker,
                                       forced_mask, fp32_linear)
from rltok.model.chunkers.bpe import BPEChunker
from rltok.model.chunkers.fixed import EntropyChunker, FixedChunker, UniformChunker, WhitespaceChunker, spacelike
from rltok.model.chunkers.policy import RLPolicy, learned_rules
from rltok.model.chunkers.straight_through import DynamicPooling, GumbelChunker, HNetRouter

__all__ = ["BPEChunker", "Boundaries", "Chunker", "DynamicPooling", "EntropyChunker", "FixedChunker",
           "GumbelChunker", "HNetRouter", "NonCausalRule", "RLPolicy", "UniformChunker", "WhitespaceChunker",
           "bernoulli_logp", "build_chunker", "forced_mask", "fp32_linear", "learned_rules", "spacelike"]
