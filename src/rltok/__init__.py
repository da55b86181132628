"""rltok: byte-level language models that learn their own tokenization, with the token
boundaries trained by reinforcement learning.

    from rltok import load_config, train, load_checkpoint
    result = train(load_config("tiny", overrides=["train.max_steps=300"]))
    model, cfg, _, _ = load_checkpoint(result.run_dir)
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Config", "DataConfig", "ModelConfig", "ObjectiveConfig", "TrainConfig", "load_config", "load_corpus",
           "HourglassLM", "FlatByteLM", "compute_loss", "Trainer", "train", "evaluate", "load_checkpoint",
           "save_checkpoint", "segment_bytes", "from_pretrained", "save_pretrained"]

# Loaded on first use, so that importing rltok.model (which runs this file first) loads none of
# training, checkpoints, generation or the Hub (tests/test_layering.py).
_LAZY = {"load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint", "load_corpus": "data",
         "evaluate": "evaluate", "from_pretrained": "hub", "save_pretrained": "hub",
         "compute_loss": "objective", "segment_bytes": "segment", "Trainer": "train", "train": "train"}
# Also names of submodules: `rltok.train` and `rltok.evaluate` stay the functions (as when this
# file imported them eagerly), also after the submodules of the same name have been imported.
_SHADOWED = ("evaluate", "train")


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # the import system binds each submodule it loads to the package attribute of its name
        if name in _SHADOWED and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from .checkpoint import load_checkpoint, save_checkpoint
    from .data import load_corpus
    from .evaluate import evaluate
    from .hub import from_pretrained, save_pretrained
    from .objective import compute_loss
    from .segment import segment_bytes
    from .train import Trainer, train

from . import model_methods  # noqa: E402
from .config import Config, DataConfig, ModelConfig, ObjectiveConfig, TrainConfig, load_config  # noqa: E402
from .model import FlatByteLM, HourglassLM  # noqa: E402

model_methods.install()  # model.generate / save_pretrained / push_to_hub / from_pretrained
