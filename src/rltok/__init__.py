"""rltok: byte-level language models that learn their own tokenization, with the token
boundaries trained by reinforcement learning.

    from rltok import load_config, train, load_checkpoint
    result = train(load_config("tiny", overrides=["train.max_steps=300"]))
    model, cfg, _, _ = load_checkpoint(result.run_dir)
"""

from .checkpoint import load_checkpoint, save_checkpoint
from .config import Config, DataConfig, ModelConfig, ObjectiveConfig, TrainConfig, load_config
from .data import load_corpus
from .evaluate import evaluate
from .hub import from_pretrained, save_pretrained
from .model import FlatByteLM, HourglassLM
from .objective import compute_loss
from .segment import segment_bytes
from .train import Trainer, train

__version__ = "0.1.0"
__all__ = ["Config", "DataConfig", "ModelConfig", "ObjectiveConfig", "TrainConfig", "load_config", "load_corpus",
           "HourglassLM", "FlatByteLM", "compute_loss", "Trainer", "train", "evaluate", "load_checkpoint",
           "save_checkpoint", "segment_bytes", "from_pretrained", "save_pretrained"]
