"""Build the model a config names: the hierarchical LM or one of the flat references."""

from __future__ import annotations

import torch

from rltok.config import ModelConfig


def model_class(arch: str) -> type[torch.nn.Module]:
    """The class that model.arch names (HourglassLM, FlatByteLM or BPETokenLM)."""
    if arch == "flat":
        from rltok.model.flat import FlatByteLM

        return FlatByteLM
    if arch == "bpe_token":
        from rltok.model.token_lm import BPETokenLM

        return BPETokenLM
    from rltok.model.hourglass import HourglassLM

    return HourglassLM


def build_model(cfg: ModelConfig, train_bytes: torch.Tensor | None = None,
                state_dict: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """`train_bytes` fits data-dependent parts (BPE tokenizers) on the training split;
    `state_dict` (from a checkpoint) provides them instead. The model keeps its config as
    `model.model_config` (what save_pretrained writes)."""
    return model_class(cfg.arch).from_config(cfg, train_bytes, state_dict)
