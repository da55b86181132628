"""Measuring a model: `evaluate` (bits per byte, boundary rate, bytes per chunk, whitespace and
Python-token alignment) on held-out windows; below training, which validates with it."""
