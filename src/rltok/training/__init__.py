"""The training loop and everything a run keeps: its saved state, the run folder, checkpoints,
the Hub format, metrics sinks, devices and data parallelism."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["Trainer", "TrainResult", "train"]


# Loaded on first use, so that importing a submodule (run_lock, run_folder) loads no trainer.
def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("rltok.training.trainer"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from rltok.training.trainer import Trainer, TrainResult, train
