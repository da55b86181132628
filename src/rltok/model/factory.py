"""Build the model a config names: the hierarchical LM or one of the flat references."""

from __future__ import annotations

import torch

from rltok.config import FAMILIES, ModelConfig


def model_class(arch: str) -> type[torch.nn.Module]:
    """The class that model.arch names (the FAMILIES registry: HourglassLM, FlatByteLM, BPETokenLM)."""
    return FAMILIES.component(arch)


def build_model(cfg: ModelConfig, train_bytes: torch.Tensor | None = None,
                state_dict: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """`train_bytes` fits data-dependent parts (BPE tokenizers) on the training split;
    `state_dict` (from a checkpoint) provides them instead. The model keeps its config as
    `model.model_config` (what save_pretrained writes)."""
    return FAMILIES.component(cfg.arch).from_config(cfg, train_bytes, state_dict)
