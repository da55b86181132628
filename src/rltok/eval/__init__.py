"""Measuring trained models: bits per byte and boundary metrics, generation, lm-evaluation-harness,
and the compute-matched comparison of boundary rules."""

from rltok.training.evaluate import evaluate

__all__ = ["evaluate"]
