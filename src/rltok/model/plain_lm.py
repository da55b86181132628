"""What the two non-hierarchical references share: an embedding, one transformer stack and an
output layer over the same vocabulary, GPT-2 initialised, with no chunks. The flat byte model
(rltok.model.flat) reads bytes, the BPE-token model (rltok.model.token_lm) tokens."""

from __future__ import annotations

import torch
import torch.nn as nn

from rltok.model.cost import Level, linear_flops
from rltok.model.layers import Stack, init_weights
from rltok.model.ngram_embed import NgramEmbedding, byte_input
from rltok.model.pretrained import PretrainedMixin


class PlainLM(nn.Module, PretrainedMixin):
    """embed (+ hashed n-grams, the flat model's model.ngram_vocab) -> body (a Stack) -> head."""

    hierarchical = False

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, mlp_ratio: float = 4.0,
                 rope_base: float = 10000.0, window: int | None = None, dropout: float = 0.0,
                 ngram_sizes: tuple[int, ...] = (), ngram_vocab: int = 0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        # made right after the embedding, so the initial weights draw from the generator in the
        # order they always did
        self.ngram_embed = NgramEmbedding(ngram_sizes, ngram_vocab, d_model) if ngram_vocab else None
        self.body = Stack(n_layers, d_model, n_heads, mlp_ratio, rope_base, window, dropout)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        init_weights(self.body, n_layers)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        nn.init.normal_(self.embed.weight, 0.0, 1.0)

    def input_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, N, d) the stack's input for ids (B, N)."""
        return byte_input(self.embed, self.ngram_embed, ids)

    def token_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, N, V) next-token logits for ids (B, N) (bytes, for the flat model); position = index."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.body(self.input_vectors(ids), pos))

    def stack_flops(self, level: Level) -> dict[str, float]:
        """Forward FLOPs per byte of the stack and the output layer at `level`, by component."""
        return {"body": self.body.linear_flops(level), "body_attn": self.body.attention_flops(level),
                "head": linear_flops(self.head, level)}

    def shape_facts(self) -> dict:
        """Depth and width, for result tables; the vocabulary's rows are the subclass's to add."""
        return {"depth": len(self.body.blocks), "width": self.embed.embedding_dim}
