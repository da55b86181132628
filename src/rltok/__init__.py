"""rltok: byte-level language models that learn their own tokenization, with the token
boundaries trained by reinforcement learning.

    from rltok import load_config, train, load_checkpoint
    result = train(load_config("tiny", overrides=["train.max_steps=300"]))
    model, cfg, _, _ = load_checkpoint(result.run_dir)

The package's layers: docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rltok.version import __version__  # noqa: F401  (rltok.__version__)

__all__ = ["Config", "DataConfig", "ModelConfig", "ObjectiveConfig", "TrainConfig", "load_config", "load_corpus",
           "HourglassLM", "FlatByteLM", "compute_loss", "Trainer", "train", "evaluate", "evaluate_run", "load_checkpoint",
           "save_checkpoint", "segment_bytes", "from_pretrained", "save_pretrained"]

# Loaded on first use, so that `import rltok` (and `rltok --help`) loads no torch.
_LAZY = {"load_checkpoint": "rltok.training.loading", "save_checkpoint": "rltok.training.checkpoint",
         "load_corpus": "rltok.data.corpus", "evaluate": "rltok.eval.evaluate",
         "evaluate_run": "rltok.harness.run_eval",
         "from_pretrained": "rltok.training.loading", "save_pretrained": "rltok.model.pretrained",
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
    from rltok.eval.evaluate import evaluate
    from rltok.harness.run_eval import evaluate_run
    from rltok.model.segment import segment_bytes
    from rltok.objective.loss import compute_loss
    from rltok.model.pretrained import save_pretrained
    from rltok.training.checkpoint import save_checkpoint
    from rltok.training.loading import from_pretrained, load_checkpoint
    from rltok.training.trainer import Trainer, train

    from rltok.model import FlatByteLM, HourglassLM

from rltok.config import Config, DataConfig, ModelConfig, ObjectiveConfig, TrainConfig, load_config  # noqa: E402

