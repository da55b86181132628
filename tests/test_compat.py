"""Models saved before the package was reorganised into layers still load and compute the same.

tests/fixtures/pre_layout_model is a `rltok export` folder (config.json + model.safetensors) written
by the flat-package code; the numbers below were produced by that code on the same folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rltok.model import HourglassLM
from rltok.training.loading import from_pretrained

FOLDER = Path(__file__).parent / "fixtures" / "pre_layout_model"
TEXT = b"the cat sat on the mat and then it sat again"


def test_model_exported_before_the_layout_change_loads_and_computes_the_same():
    model = from_pretrained(FOLDER)
    assert isinstance(model, HourglassLM)
    x = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8).long()[None]
    out = model(x[:, :-1], mode="greedy")
    # recorded on another processor: float32 kernels round differently across CPU models, so a
    # relative 1e-6 (a real change in what the model computes moves the sum far more)
    assert out.logits.double().sum().item() == pytest.approx(-57.56128296508575, rel=1e-6)
    gen = model.generate(b"the ", 12, seed=0)
    assert gen.output == b"\xf9u\xb8b0\xec<3\xa08\xd5\xf4" and sum(gen.boundaries) == 3


def test_model_method_from_pretrained_checks_the_class():
    assert isinstance(HourglassLM.from_pretrained(FOLDER), HourglassLM)
