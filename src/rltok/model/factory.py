"""Build the model a config names: the hierarchical LM or one of the flat references."""

from __future__ import annotations

import torch

from rltok.config import FAMILIES, VOCAB_SIZE, ModelConfig


def build_model(cfg: ModelConfig, train_bytes: torch.Tensor | None = None,
                state_dict: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """`train_bytes` fits data-dependent parts (BPE tokenizers) on the training split;
    `state_dict` (from a checkpoint) provides them instead. The model keeps its config as
    `model.model_config` (what save_pretrained writes)."""
    return FAMILIES.component(cfg.arch).from_config(cfg, train_bytes, state_dict)


_PLANNED: dict[tuple, torch.nn.Module] = {}


def planned_model(cfg: ModelConfig, vocab_size: int | None = None) -> torch.nn.Module:
    """The model `cfg` builds, before any data is seen: on the meta device (its shape, no memory),
    unfitted; a BPE-token model over `vocab_size` tokens (default model.bpe_vocab, else the byte
    vocabulary). What sizing and budget planning ask; built once per config."""
    vocab_size = vocab_size or cfg.bpe_vocab or VOCAB_SIZE
    key = (repr(cfg), vocab_size)
    if key not in _PLANNED:
        if len(_PLANNED) > 64:
            _PLANNED.clear()
        cfg.validate()
        with torch.device("meta"):
            model = FAMILIES.component(cfg.arch).unfitted(cfg, vocab_size)
        model.model_config = cfg
        _PLANNED[key] = model
    return _PLANNED[key]
