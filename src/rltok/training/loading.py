"""The one place that loads a trained model, from a model folder, a checkpoint, a run folder or a
Hub repo id: `load` returns everything, `load_checkpoint` and `from_pretrained` are its shapes for
training and for people who use models."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from rltok.config import Config, ConfigError
from rltok.model.factory import build_model
from rltok.model.pretrained import (CONFIG, WEIGHTS, CheckpointError, PretrainedError, fetch_from_hub, load_weights,
                                    read_config)
from rltok.training.checkpoint import (checkpoint_step, is_model_dir, list_checkpoints, newest_valid,
                                      read_trainer_state, resolve_checkpoint)
from rltok.training.device import resolve_device

__all__ = ["Loaded", "from_pretrained", "load", "load_checkpoint", "refuse_non_finite"]


class Loaded(NamedTuple):
    model: torch.nn.Module
    config: Config
    meta: dict  # save_pretrained's metadata from config.json (empty for older checkpoints)
    trainer_state: dict | None
    folder: Path


def load(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
         with_trainer_state: bool = False, hub: bool = False, revision: str | None = None,
         cache_dir: str | None = None, token: str | None = None, local_files_only: bool = False) -> Loaded:
    """The one loader. `path`: a run folder (its newest valid checkpoint), a checkpoint folder, a
    model folder, or with `hub=True` a Hub repo id (when no such local path exists). The model is
    built from config.json, its weights loaded strictly, and left in training mode."""
    device = resolve_device(device)  # checked before anything is read: an unknown name is one clear error
    if isinstance(dtype, str):  # "bfloat16", as a config or a command line would name it
        named = getattr(torch, dtype, None)
        if not isinstance(named, torch.dtype):
            raise ConfigError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or 'float16'")
        dtype = named
    local = Path(path).expanduser()
    if hub and not local.exists():
        folder = fetch_from_hub(str(path), revision, cache_dir, token, local_files_only)
        if not is_model_dir(folder):
            raise CheckpointError(f"the Hub repo {str(path)!r} holds no {WEIGHTS} + {CONFIG}")
    else:
        folder = resolve_checkpoint(local)
    cfg, meta = read_config(folder)
    unreadable = []
    while True:
        try:
            model = load_weights(folder, cfg, build_model, meta.get("fit_facts"))
            trainer_state = read_trainer_state(folder) if with_trainer_state else None
            break
        except CheckpointError as e:
            # a run folder's checkpoint that passed its checksums but cannot be decoded: the next
            # older valid one, as for one that fails them (a resume sets the newer ones aside)
            older = None
            if folder != local and not hub:
                older = newest_valid([c for c in list_checkpoints(local)
                                      if checkpoint_step(c) < checkpoint_step(folder)])[0]
            if older is None:
                raise
            unreadable.append(str(e))
            folder = older
    if unreadable:
        warnings.warn(f"skipping {len(unreadable)} unreadable checkpoint(s) ({'; '.join(unreadable)}); "
                      f"falling back to {folder}", stacklevel=2)
    model.to(device=device, dtype=dtype)
    return Loaded(model, cfg, meta, trainer_state, folder)


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", with_trainer_state: bool = False):
    """-> (model, cfg, trainer_state or None, folder): `load` for training and evaluation (local
    paths only; a model folder loads too, without trainer state)."""
    got = load(path, device=device, with_trainer_state=with_trainer_state)
    return got.model.train(), got.config, got.trainer_state, got.folder


def refuse_non_finite(model: torch.nn.Module, folder) -> None:
    """A model whose weights hold NaN or inf gives NaN for everything: an error, not a result."""
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise CheckpointError(f"the model in {folder} has non-finite weights (NaN or inf) in {len(bad)} tensor(s), "
                              f"first {bad[0]}; it cannot be evaluated or used")


def from_pretrained(name_or_path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    revision: str | None = None, cache_dir: str | None = None, token: str | None = None,
                    local_files_only: bool = False, return_config: bool = False):
    """The model saved in a model folder, a checkpoint, a run folder or a Hub repo, whichever family
    it is, in eval mode on `device`; with return_config, (model, Config, metadata)."""
    try:
        got = load(name_or_path, device=device, dtype=dtype, hub=True, revision=revision, cache_dir=cache_dir,
                   token=token, local_files_only=local_files_only)
    except PretrainedError:
        raise
    except CheckpointError as e:
        raise PretrainedError(str(e)) from None
    got.model.eval()
    return (got.model, got.config, got.meta) if return_config else got.model

