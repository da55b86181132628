"""A flat byte-level transformer: the non-hierarchical reference at matched parameters."""

from __future__ import annotations

import torch

from rltok.config import VOCAB_SIZE, ModelConfig
from rltok.model.cost import Level, module_flops
from rltok.model.decoding import DecodingState, StepOutput
from rltok.model.generate import Decodes
from rltok.model.layers import param_count
from rltok.model.output import LMOutput
from rltok.model.plain_lm import PlainLM


class FlatByteLM(PlainLM, Decodes):
    arch = "flat"

    def __init__(self, d_model: int, n_layers: int, n_heads: int, mlp_ratio: float = 4.0,
                 window: int | None = None, max_seq_len: int = 8192, rope_base: float = 10000.0,
                 ngram_sizes: tuple[int, ...] = (), ngram_vocab: int = 0, dropout: float = 0.0):
        super().__init__(VOCAB_SIZE, d_model, n_layers, n_heads, mlp_ratio, rope_base, window, dropout,
                         ngram_sizes=ngram_sizes, ngram_vocab=ngram_vocab)
        self.max_seq_len = max_seq_len

    def chunks_per_byte(self, x: torch.Tensor, generator=None) -> None:
        """A byte model with no chunks: nothing to plan with."""
        return None

    def shape_facts(self) -> dict:
        """Depth, width and vocabulary rows, for result tables (see HourglassLM.shape_facts)."""
        ngram = self.ngram_embed
        return {**super().shape_facts(), "bpe_vocab": None,
                "ngram_rows": ngram.table.num_embeddings if ngram is not None else 0, "chunk_vocab_rows": 0}

    @staticmethod
    def card_facts(m: dict) -> tuple[str, list[tuple[str, str]], bool]:
        """What the model card says of it (see HourglassLM.card_facts)."""
        shape = [("layers", f"{m['flat_layers']} x d={m['d_chunk']}")]
        if m.get("flat_window"):  # older configs have no window: full attention
            shape.append(("attention", f"sliding window {m['flat_window']}"))
        return "a flat byte-level transformer (rltok's non-hierarchical reference)", shape, True

    @classmethod
    def _from_config(cls, cfg: ModelConfig, train_bytes=None, state_dict=None) -> FlatByteLM:
        return cls(cfg.d_chunk, cfg.flat_layers, cfg.n_heads_chunk, cfg.mlp_ratio, window=cfg.flat_window or None,
                   max_seq_len=cfg.max_seq_len, rope_base=cfg.rope_base, ngram_sizes=cfg.ngram_sizes,
                   ngram_vocab=cfg.ngram_vocab, dropout=cfg.dropout)

    def forward_flops(self, seq_len: int, rate: float | None = None, rate2: float | None = None,
                      kernel: bool = False) -> dict[str, float]:
        """Forward FLOPs per byte by component, as HourglassLM's (no chunks: the rates change nothing)."""
        byte = Level(seq_len, 1.0, kernel)
        out = {"ngram": module_flops(self.ngram_embed, byte), **self.stack_flops(byte)}
        out["total"] = sum(out.values())
        return out

    def non_embedding_params(self) -> int:
        """Parameters outside the lookup tables; the output head counts (every byte pays its product)."""
        return param_count(self) - param_count(self.embed, self.ngram_embed)

    def forward(self, idx: torch.Tensor, **_: object) -> LMOutput:
        if idx.shape[1] > self.max_seq_len:
            raise ValueError(f"sequence of {idx.shape[1]} bytes exceeds max_seq_len={self.max_seq_len}")
        return LMOutput(self.token_logits(idx))

    def embed_bytes(self, idx: torch.Tensor) -> torch.Tensor:
        return self.input_vectors(idx)

    # ---- cached decoding (see rltok.model.decoding) ------------------------------------------

    def decoding_state(self, batch: int, capacity: int, mode: str = "sample",
                       generator: torch.Generator | None = None) -> DecodingState:
        return DecodingState(self, {self.body: capacity}, batch, 1, mode, generator)

    @torch.inference_mode()
    def prefill(self, state: DecodingState, row: int, ids: torch.Tensor, boundaries=None, start: int = 0,
                boundaries2=None) -> StepOutput:
        """Read one row's context ids (T,) in parallel (filling its cache); no boundaries here."""
        x = ids.view(1, -1).to(state.device)
        out = self.body(self.embed_bytes(x), torch.arange(x.shape[1], device=x.device), cache=state.prefill_cache(row))
        state.start_row(row, x)
        return StepOutput(self.head(out[0, -1]))

    @torch.inference_mode()
    def step(self, state: DecodingState, ids: torch.Tensor, boundaries=None, boundaries2=None,
             noise=None) -> StepOutput:
        state.push(ids.to(state.device))
        out = self.body.step(state.embed_newest(self.embed_bytes).unsqueeze(1), state.pos, state.caches[self.body])
        state.advance()
        return StepOutput(self.head(out[:, 0]))
