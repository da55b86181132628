"""Models that load where people work: `save_pretrained` / `from_pretrained` in the Hugging Face
Hub layout, and a generated model card.

    <folder>/
        model.safetensors   weights (no pickle); BPE tokenizers travel inside as uint8 buffers
        config.json         {"model_type": "rltok", "architecture": ..., "model": {...},
                             "objective"/"data"/"train": {...} when known, "results": {...}}
        README.md           model card: architecture, training config, results

The format, the writer and the Hub transfers live in the model layer (rltok.model.pretrained,
behind model.save_pretrained / push_to_hub / HourglassLM.from_pretrained); a training checkpoint
is the same folder plus trainer.pt and manifest.json (rltok.training.checkpoint). The functions
here take any model: `from_pretrained` loads a model folder, a checkpoint folder or a run folder
(no network needed), or a Hub repo id, fetched with `huggingface_hub.snapshot_download`, and
returns whatever it holds - the hierarchical HourglassLM with every boundary rule, FlatByteLM or
BPETokenLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rltok.model.pretrained import (CARD, CONFIG, WEIGHTS, CheckpointError, PretrainedError,  # noqa: F401 (names kept for callers)
                                    model_config_of, push_to_hub, save_pretrained)
from rltok.training.checkpoint import is_model_dir, load

__all__ = ["PretrainedError", "from_pretrained", "is_pretrained_dir", "model_config_of", "push_to_hub",
           "save_pretrained"]


def is_pretrained_dir(path: str | Path) -> bool:
    """A model folder written by save_pretrained (not a training checkpoint, which has a manifest)."""
    cfg = Path(path) / CONFIG
    if not is_model_dir(Path(path)):
        return False
    try:
        return json.loads(cfg.read_text()).get("model_type") == "rltok"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def from_pretrained(name_or_path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    revision: str | None = None, cache_dir: str | None = None, token: str | None = None,
                    local_files_only: bool = False, return_config: bool = False):
    """The model saved in a model folder, a checkpoint folder, a run folder (its newest valid
    checkpoint) or a Hub repo, in eval mode on `device` (optionally cast to `dtype`); with
    return_config, (model, Config, metadata). Raises PretrainedError."""
    try:
        got = load(name_or_path, device=device, dtype=dtype, hub=True, revision=revision, cache_dir=cache_dir,
                   token=token, local_files_only=local_files_only)
    except PretrainedError:
        raise
    except CheckpointError as e:
        raise PretrainedError(str(e)) from None
    got.model.eval()
    return (got.model, got.config, got.meta) if return_config else got.model
