"""Models that load where people work: `save_pretrained` / `from_pretrained` in the Hugging Face
Hub layout, and a generated model card.

    <folder>/
        model.safetensors   weights (no pickle); BPE tokenizers travel inside as uint8 buffers
        config.json         {"model_type": "rltok", "architecture": ..., "model": {...},
                             "objective"/"data"/"train": {...} when known, "results": {...}}
        README.md           model card: architecture, training config, results

This is the one on-disk format of rltok (rltok.training.checkpoint): a training checkpoint is the same
folder plus trainer.pt and manifest.json, and both functions here are thin wrappers over
rltok.training.checkpoint's writer and loader. `from_pretrained` takes a model folder, a checkpoint
folder or a run folder (no network needed), or a Hub repo id, fetched with
`huggingface_hub.snapshot_download`. Any model `rltok.model.factory.build_model` makes works:
the hierarchical HourglassLM with every boundary rule, FlatByteLM and BPETokenLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rltok.training.checkpoint import CARD, CONFIG, WEIGHTS, CheckpointError, PretrainedError  # noqa: F401 (names kept for callers)
from rltok.config import Config, ModelConfig



def model_config_of(model: torch.nn.Module) -> ModelConfig:
    from rltok.training.checkpoint import model_config_of as model_config_of_

    return model_config_of_(model)


def save_pretrained(model: torch.nn.Module, save_directory: str | Path, config: Config | ModelConfig | None = None,
                    results: dict | None = None, name: str | None = None) -> Path:
    """Write weights, config.json and a model card to `save_directory` (created if needed).
    `config` is the full training Config (its sections go into config.json and the card) or
    just a ModelConfig (default: the model's own); `results` e.g. {"val_bpb": 1.28, "val_rate": 0.2}."""
    from rltok.training.checkpoint import write_model_files

    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    write_model_files(out, model, config, results, name=name or out.name)
    return out


def is_pretrained_dir(path: str | Path) -> bool:
    """A model folder written by save_pretrained (not a training checkpoint, which has a manifest)."""
    from rltok.training.checkpoint import is_model_dir

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
    from rltok.training.checkpoint import load

    try:
        got = load(name_or_path, device=device, dtype=dtype, hub=True, revision=revision, cache_dir=cache_dir,
                   token=token, local_files_only=local_files_only)
    except PretrainedError:
        raise
    except CheckpointError as e:
        raise PretrainedError(str(e)) from None
    got.model.eval()
    return (got.model, got.config, got.meta) if return_config else got.model


def push_to_hub(model: torch.nn.Module, repo_id: str, config: Config | ModelConfig | None = None,
                results: dict | None = None, private: bool = False, token: str | None = None,
                commit_message: str = "Upload rltok model") -> str:
    """save_pretrained into a temporary folder and upload it to `repo_id` (needs network and a
    Hub token). Returns the URL of the commit."""
    import tempfile

    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(model, tmp, config, results, name=repo_id.split("/")[-1])
        info = api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message=commit_message)
    return str(getattr(info, "commit_url", info))


# ---- model card ------------------------------------------------------------------------------
