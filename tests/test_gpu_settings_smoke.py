"""The GPU presets' settings run end to end on a CPU: train.dtype=bf16 (autocast) and
train.compile=true (torch.compile of the model), a couple of steps each at the test preset, so a
change to the model or the trainer cannot break them unseen."""

from __future__ import annotations

import math

import pytest
import torch

from rltok.config import load_config
from rltok.training.trainer import Trainer

from behaviour_cases import corpus


# compiling costs about a minute on a CPU, so one case compiles (with bf16 and the lexicon recipe)
@pytest.mark.parametrize("overrides", [["train.dtype=bf16"],
                                       ["train.compile=true", "train.dtype=bf16", "objective.recipe=lexicon"]],
                         ids=["bf16", "compile_bf16_lexicon"])
def test_gpu_settings_train_on_cpu(overrides, tmp_path):
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=2", "train.threads=1",
                                         "train.log_every=1", "train.eval_every=2", "train.checkpoint_every=2",
                                         *overrides])
    trainer = Trainer(cfg, corpus=corpus(), quiet=True)
    assert trainer.amp_dtype is torch.bfloat16  # the settings took effect, not only ran
    compiled = "train.compile=true" in overrides
    assert (trainer.forward is not trainer.wrapped) == compiled
    assert not compiled or isinstance(trainer.forward, torch._dynamo.eval_frame.OptimizedModule)
    trainer.peak_flops = 1e12
    result = trainer.fit()
    assert [h["step"] for h in result.history] == [1, 2]
    assert all(math.isfinite(h["loss"]) for h in result.history)
    assert math.isfinite(result.history[-1]["val_bpb"])
    assert (tmp_path / "checkpoints").is_dir()
