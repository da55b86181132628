"""The teacher rule: another trained hierarchy's byte-level rule, frozen and greedy (a diagnostic:
where a learned rule cuts, apart from what learning to cut costs). Its own module because it
builds a whole model (rltok.model.hourglass), which the rules' module must not import."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from rltok.config import ConfigError
from rltok.model.chunkers import Boundaries, Chunker
from rltok.model.hourglass import HourglassLM


class TeacherChunker(Chunker):
    """Another trained hierarchy's byte-level rule, frozen and greedy: the boundaries a finished
    run's rule settled on, given from the first step to a model trained from scratch. A diagnostic
    that separates where a learned rule cuts from what learning to cut costs its language model.
    The teacher (a model folder or training checkpoint, `model.chunker.checkpoint`) is loaded on
    first use and kept outside this module's parameters and state, so nothing trains it,
    checkpoints of the student do not hold it and the student's cost counts none of its FLOPs
    (like whitespace cuts, the boundaries come free). Windows only: no one-byte decisions."""

    @classmethod
    def from_settings(cls, settings, m, dim=None, rate=None):
        return cls(settings.checkpoint)

    def __init__(self, checkpoint: str):
        super().__init__()
        if not checkpoint:
            raise ConfigError("model.chunker=teacher needs model.chunker.checkpoint: the teacher's model folder or "
                              "training checkpoint")
        if not Path(checkpoint).expanduser().exists():
            raise ConfigError(f"model.chunker.checkpoint: no model folder or checkpoint at {checkpoint}")
        self.checkpoint = checkpoint
        self._teacher = []  # in a list: not a submodule (no parameters, state or FLOPs of this rule)

    def teacher(self, device) -> nn.Module:
        """The teacher model, loaded on first use (models are also built on the meta device, to
        be counted, where no weights can be read)."""
        if not self._teacher:
            self._teacher.append(HourglassLM.from_pretrained(self.checkpoint).eval().requires_grad_(False))
        return self._teacher[0].to(device)

    def forward(self, h, forced, b=None, mode="sample", generator=None, idx=None, **_) -> Boundaries:
        if b is None:
            teacher = self.teacher(idx.device)
            with torch.no_grad():
                b = teacher(idx, encoder_only=True, mode="greedy", force_last=False).boundaries.b
        return Boundaries(b=b.bool() | forced, free=~forced)
