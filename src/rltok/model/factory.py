"""Build the model a config names: the hierarchical LM or one of the flat references."""

from __future__ import annotations

import torch

from rltok.config import ModelConfig


def build_model(cfg: ModelConfig, train_bytes: torch.Tensor | None = None,
                state_dict: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """`train_bytes` fits data-dependent parts (BPE tokenizers) on the training split;
    `state_dict` (from a checkpoint) provides them instead. The model keeps its config as
    `model.model_config` (what save_pretrained writes)."""
    model = _build(cfg, train_bytes, state_dict)
    model.model_config = cfg
    return model


def _build(cfg: ModelConfig, train_bytes: torch.Tensor | None, state_dict: dict[str, torch.Tensor] | None):
    cfg.validate()
    if cfg.arch == "flat":
        from rltok.model.flat import FlatByteLM

        return FlatByteLM(cfg.d_chunk, cfg.flat_layers, cfg.n_heads_chunk, cfg.mlp_ratio,
                          max_seq_len=cfg.max_seq_len, rope_base=cfg.rope_base,
                          ngram_sizes=cfg.ngram_sizes, ngram_vocab=cfg.ngram_vocab)
    if cfg.arch == "bpe_token":
        from rltok.data.bpe import fit_bpe_to_rate, tokenizer_from_tensor
        from rltok.model.token_lm import BPETokenLM

        if state_dict is not None and "tokenizer_json" in state_dict:
            tok = tokenizer_from_tensor(state_dict["tokenizer_json"].cpu())
        elif train_bytes is not None:
            tok = fit_bpe_to_rate(bytes(train_bytes.numpy()), cfg.target_rate, pretokenize=cfg.bpe_pretokenize).tokenizer
        else:
            raise ValueError("model.arch=bpe_token needs training bytes to fit its tokenizer")
        return BPETokenLM(tok, cfg.d_chunk, cfg.flat_layers, cfg.n_heads_chunk, cfg.mlp_ratio,
                          max_tokens=cfg.max_seq_len)
    from rltok.model.hourglass import HourglassLM

    model = HourglassLM(cfg)
    if cfg.chunker == "bpe" and state_dict is None:
        if train_bytes is None:
            raise ValueError("model.chunker=bpe needs training bytes to fit its tokenizer")
        model.chunker.fit(bytes(train_bytes.numpy()))
    return model
