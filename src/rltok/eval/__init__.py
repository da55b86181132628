"""Using trained models: cached generation and the lm-evaluation-harness adapter. `evaluate`
(bits per byte and boundary metrics) lives in rltok.training, which validates with it, and is
re-exported here."""

from rltok.training.evaluate import evaluate

__all__ = ["evaluate"]
