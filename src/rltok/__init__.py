"""rltok: byte-level language models that learn their own tokenization, with the token
boundaries trained by reinforcement learning.

    from rltok import load_config, train, load_checkpoint
    result = train(load_config("tiny", overrides=["train.max_steps=300"]))
    model, cfg, _, _ = load_checkpoint(result.run_dir)

The package is layered, each layer importing only those before it:
data -> model -> objective -> training -> eval -> analysis -> cli (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Config", "DataConfig", "ModelConfig", "ObjectiveConfig", "TrainConfig", "load_config", "load_corpus",
           "HourglassLM", "FlatByteLM", "compute_loss", "Trainer", "train", "evaluate", "load_checkpoint",
           "save_checkpoint", "segment_bytes", "from_pretrained", "save_pretrained"]

# Loaded on first use, so that importing rltok.model loads none of training, checkpoints,
# generation or the Hub (tests/test_layering.py).
_LAZY = {"load_checkpoint": "rltok.training.checkpoint", "save_checkpoint": "rltok.training.checkpoint",
         "load_corpus": "rltok.data.corpus", "evaluate": "rltok.training.evaluate",
         "from_pretrained": "rltok.training.hub", "save_pretrained": "rltok.training.hub",
         "compute_loss": "rltok.objective.loss", "segment_bytes": "rltok.model.segment",
         "Trainer": "rltok.training.trainer", "train": "rltok.training.trainer",
         "HourglassLM": "rltok.model", "FlatByteLM": "rltok.model"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from rltok.data.corpus import load_corpus
    from rltok.training.evaluate import evaluate
    from rltok.model.segment import segment_bytes
    from rltok.objective.loss import compute_loss
    from rltok.training.checkpoint import load_checkpoint, save_checkpoint
    from rltok.training.hub import from_pretrained, save_pretrained
    from rltok.training.trainer import Trainer, train

    from rltok.model import FlatByteLM, HourglassLM

from rltok.config import Config, DataConfig, ModelConfig, ObjectiveConfig, TrainConfig, load_config  # noqa: E402


class _InstallModelMethods(importlib.abc.MetaPathFinder):
    """`import rltok` loads no torch (so `rltok --help` is quick): the models' convenience methods
    (model.generate / save_pretrained / push_to_hub / from_pretrained, rltok.model_methods) are
    installed right after rltok.model is first imported, so they exist wherever the classes can
    be imported."""

    def find_spec(self, name, path, target=None):
        if name != "rltok.model":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from rltok import model_methods

            model_methods.install()

        spec.loader.exec_module = exec_module
        return spec


if "rltok.model" in sys.modules:  # pragma: no cover - a reload of the package
    from rltok import model_methods

    model_methods.install()
elif not any(isinstance(f, _InstallModelMethods) for f in sys.meta_path):
    sys.meta_path.insert(0, _InstallModelMethods())
