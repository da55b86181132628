"""Boundary rules: decide, byte by byte, where a chunk ends.

Convention: b[:, t] = 1 means byte t is the *last* byte of a chunk. Position 0 is always a
boundary (so every byte has a chunk ending at or before it); in training the last position is
one too. Forced positions carry no gradient (`free` marks the ones that do).

Every chunker returns a `Boundaries` record so the model and the objective never need to know
which rule produced it. For cached decoding each causal rule also decides one new byte at a time
(`Chunker.step`), from its running state (`Chunker.start_state`); its decisions are the ones its
forward makes on the same inputs.

The rules live by kind: `base` (the interface, `Boundaries`, `build_chunker`), `policy` (the
learned RL policy), `fixed` (rules without gradient), `straight_through` (H-Net, Gumbel) and
`bpe`; every name is importable from here, as the registry's targets are.
"""

from rltok.model.chunkers.base import (Boundaries, Chunker, NonCausalRule, bernoulli_logp, build_chunker,
                                       forced_mask, fp32_linear)
from rltok.model.chunkers.bpe import BPEChunker
from rltok.model.chunkers.fixed import EntropyChunker, FixedChunker, UniformChunker, WhitespaceChunker, spacelike
from rltok.model.chunkers.policy import RLPolicy, learned_rules
from rltok.model.chunkers.straight_through import GumbelChunker, HNetRouter

__all__ = ["BPEChunker", "Boundaries", "Chunker", "EntropyChunker", "FixedChunker", "GumbelChunker", "HNetRouter",
           "NonCausalRule", "RLPolicy", "UniformChunker", "WhitespaceChunker", "bernoulli_logp", "build_chunker",
           "forced_mask", "fp32_linear", "learned_rules", "spacelike"]
