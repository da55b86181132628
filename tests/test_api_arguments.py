"""The Python API checks what it is given as the command line does: a wrong type or value is a
clear error before anything is read, built or written, never a failure deep inside a run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import tiny_model_config

from rltok import load_config, train
from rltok.config import Config, ConfigError
from rltok.data.corpus import load_corpus
from rltok.data.sources import DataError
from rltok.harness.run_eval import evaluate_run
from rltok.model import HourglassLM
from rltok.objective import compute_loss
from rltok.training.trainer import Trainer


@pytest.mark.parametrize("section, key, value, message", [
    ("train", "max_steps", "3", "train.max_steps expects int, got str '3'"),
    ("train", "lr", "1e-3", "train.lr expects float, got str"),
    ("train", "compile", "yes", "train.compile expects bool"),
    ("data", "train", 5, "data.train expects str, got int"),
    ("model", "ngram_sizes", {2, 3}, "model.ngram_sizes expects a tuple[int, ...]"),
])
def test_a_config_built_in_python_has_its_types_checked(section, key, value, message, tmp_path):
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / 'run'}"])
    setattr(getattr(cfg, section), key, value)
    with pytest.raises(ConfigError, match=message.replace("[", "\\[").replace("]", "\\]").replace(".", "\\.")):
        cfg.validate()
    with pytest.raises(ConfigError):
        train(cfg)
    assert not (tmp_path / "run").exists()  # refused before the run folder is made


def test_a_list_where_a_tuple_is_declared_is_taken_and_an_int_is_a_float():
    cfg = load_config("test")
    cfg.model.ngram_sizes, cfg.train.lr = [2, 3], 1
    cfg.validate()
    assert cfg.model.ngram_sizes == (2, 3) and cfg.train.lr == 1


def test_a_section_of_another_class_and_a_config_that_is_no_config():
    with pytest.raises(ConfigError, match="config section 'model' must be a ModelConfig, got str"):
        Config(model="x").validate()
    with pytest.raises(TypeError, match="take a Config .* got str"):
        train("test")
    with pytest.raises(TypeError, match="corpus must be a Corpus"):
        Trainer(load_config("test"), corpus="hello")


@pytest.mark.parametrize("kw, message", [
    (dict(val_fraction=-0.5), r"val_fraction must be in \(0, 0.5\)"), (dict(val_fraction=0.99), "val_fraction"),
    (dict(val_fraction=math.nan), "val_fraction"), (dict(max_bytes=-1), "max_bytes must be >= 0"),
])
def test_load_corpus_checks_its_arguments(kw, message):
    with pytest.raises(DataError, match=message):
        load_corpus("stdlib", **kw)
    with pytest.raises(TypeError, match="data sources are strings"):
        load_corpus(5)


@pytest.mark.parametrize("kw, message", [
    (dict(batch_size=0), "batch_size must be a whole number >= 1"), (dict(max_windows=-1), "max_windows"),
    (dict(seq_len=-5), "seq_len"), (dict(max_bytes=-1), "max_bytes"), (dict(context=0), "context"),
    (dict(mode="bogus"), "mode must be 'sample' or 'greedy'"),
])
def test_evaluate_run_checks_its_arguments_before_loading(kw, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        evaluate_run(tmp_path / "no-such-run", **kw)  # the path is never reached


def test_the_model_refuses_a_decision_mode_it_does_not_know():
    model = HourglassLM(tiny_model_config()).eval()
    x = torch.randint(0, 256, (1, 16))
    with pytest.raises(ValueError, match="mode must be 'sample' or 'greedy', got 'bogus'"):
        model(x, mode="bogus")


def test_compute_loss_of_a_chunked_output_asks_for_the_target_rate():
    cfg = load_config("test")
    model = HourglassLM(cfg.model)
    x = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    out = model.score(x[:, :-1], torch.rand(2, 32, generator=torch.Generator().manual_seed(1)) < 0.2)
    with pytest.raises(ValueError, match="needs target_rate"):
        compute_loss(out, x[:, 1:], cfg.objective)
    loss, metrics = compute_loss(out, x[:, 1:], cfg.objective, target_rate=cfg.model.target_rate)
    assert torch.isfinite(loss) and "bpb" in metrics


def test_the_documented_fields_are_what_a_run_returns(tmp_path):
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / 'run'}", "train.max_steps=2",
                                         "train.device=cpu", "train.threads=1", "train.eval_batches=1"])
    cfg.data.train = str(tmp_path / "data.txt")
    (tmp_path / "data.txt").write_bytes(b"some plain words, over and over. " * 200)
    result = train(cfg, quiet=True)
    assert [f.name for f in dataclasses.fields(result)] == ["step", "val", "run_dir", "history"]
    assert result.step == 2 and "bpb" in result.val and result.run_dir == tmp_path / "run"


def test_loading_generating_and_segmenting_check_their_arguments(tmp_path):
    from rltok.model.generate import GenerationError, generate
    from rltok.model.segment import segment_bytes
    from rltok.training.checkpoint import save_checkpoint
    from rltok.training.loading import load_checkpoint

    with pytest.raises(TypeError, match="preset is a name"):
        load_config(5)
    with pytest.raises(TypeError, match="overrides is a list"):
        load_config("test", overrides="train.max_steps=3")
    with pytest.raises(ConfigError, match="unknown device 'gpu'"):
        load_checkpoint(tmp_path / "no-such-run", device="gpu")  # before the path is read
    cfg = load_config("test")
    model = HourglassLM(cfg.model).eval()
    for kw, message in ((dict(max_new_bytes=5.5), "max_new_bytes must be a whole number"),
                        (dict(temperature=math.nan), "temperature must be a finite number"),
                        (dict(top_k=2.0), "top_k must be a whole number")):
        with pytest.raises(GenerationError, match=message):
            generate(model, b"def", **{"max_new_bytes": 2, **kw})
    with pytest.raises(TypeError, match=r"reads bytes \(text.encode\(\)\)"):
        segment_bytes(model, "some text")
    with pytest.raises(ValueError, match="step is a whole number >= 0, got -1"):
        save_checkpoint(tmp_path / "run", -1, model, cfg)
    assert not (tmp_path / "run").exists()


def test_a_dtype_may_be_named(tmp_path):
    from rltok.model.pretrained import save_pretrained
    from rltok.training.loading import load

    cfg = load_config("test")
    folder = save_pretrained(HourglassLM(cfg.model), tmp_path / "m", cfg)
    assert next(load(folder, dtype="bfloat16").model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="unknown dtype 'bf16'"):
        load(folder, dtype="bf16")


@pytest.mark.parametrize("arch, overrides", [("hourglass", []), ("flat", ["model.arch=flat"]),
                                             ("flat with n-gram tables", ["model.arch=flat", "model.ngram_vocab=64"])])
def test_a_model_called_with_ids_outside_its_vocabulary_says_which_range(arch, overrides):
    from rltok.config import VOCAB_SIZE
    from rltok.model.factory import build_model

    model = build_model(load_config("test", overrides=overrides).model)
    good = torch.randint(0, 256, (1, 16))
    model(good)  # bytes are fine
    for bad, shown in ((VOCAB_SIZE, f"from [0-9]+ to {VOCAB_SIZE}"), (-1, "from -1 to")):
        ids = good.clone()
        ids[0, 3] = bad
        with pytest.raises(ValueError, match=f"token ids must lie in 0..{VOCAB_SIZE - 1} .*got ids {shown}"):
            model(ids)
    with pytest.raises(TypeError, match="integer tensor, got torch.float32"):
        model(good.float())
