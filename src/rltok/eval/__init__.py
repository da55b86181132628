"""Measuring a model: `evaluate` (bits per byte, boundary rate, bytes per chunk, whitespace and
Python-token alignment) on held-out windows. It needs only the model and the bytes, so it sits
below training, which validates with it; `from rltok import evaluate` is the public name."""
