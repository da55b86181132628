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
    from rltok.model import FlatByteLM
    from rltok.model.pretrained import PretrainedError

    assert isinstance(HourglassLM.from_pretrained(FOLDER), HourglassLM)
    with pytest.raises(PretrainedError):  # the folder holds an HourglassLM, not a flat model
        FlatByteLM.from_pretrained(FOLDER)


RUN = Path(__file__).parent / "fixtures" / "pre_composition_run"


def test_run_folder_written_before_the_nested_config_resumes_as_it_would_have(tmp_path):
    """A run folder of the flat config layout (lexicon recipe: flips, the lexicon's counts, the
    credit price's controller in trainer.pt) resumes from its step-2 checkpoint, reads its config
    through the old keys, and continues with the losses the code that wrote it produced."""
    import json
    import shutil
    import warnings

    from behaviour_cases import corpus, machine
    from rltok.config import Config
    from rltok.training.trainer import Trainer

    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("resumed.json"))
    saved = json.loads((run / "config.json").read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = Config.from_dict(saved)
    assert any("older flat config layout" in str(w.message) for w in caught)
    est = cfg.objective.estimator
    assert (est.kind, est.model_pass, est.lexicon.weight, est.lexicon.size, est.price.kind) == \
        ("flips", False, 1.0, 1024, "target")
    cfg.train.out_dir, cfg.train.max_steps = str(run), 4
    trainer = Trainer(cfg.validate(), corpus=corpus(), resume=True, quiet=True)
    assert trainer.step == 2 and trainer.objective.named["lexicon"] is not None
    trainer.peak_flops = 1e12
    losses = {str(h["step"]): h["loss"] for h in trainer.fit().history}
    recorded = json.loads((RUN / "resumed.json").read_text())
    assert set(losses) == set(recorded["resumed_loss"])
    for step, loss in recorded["resumed_loss"].items():
        if recorded["machine"] == machine():
            assert losses[step] == loss, step  # bit for bit where it was recorded
        else:
            assert losses[step] == pytest.approx(loss, rel=1e-5), step
