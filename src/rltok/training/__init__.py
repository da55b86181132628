"""The training loop and everything a run keeps: its saved state, the run folder, checkpoints,
the Hub format, metrics sinks, devices and data parallelism."""

from rltok.training.trainer import Trainer, TrainResult, train

__all__ = ["Trainer", "TrainResult", "train"]
