"""Divergence: a non-finite step is skipped (no update) and logged, repeated ones stop the run
with TrainingDiverged and the last good checkpoint intact; rate collapse is reported with
advice; a checkpoint that cannot be written does not kill the run."""

from __future__ import annotations

import errno

import pytest
import torch

import rltok.model.pretrained as model_files
from rltok.training.checkpoint import CheckpointError, list_checkpoints
from rltok.training.loading import load_checkpoint
from rltok.cli import main
from rltok.config import load_config
from rltok.data.sources import Corpus
from rltok.training.trainer import Trainer, TrainingDiverged


TEXT = b"".join(b"line %d: some words, some \xc3\xa9 accents and spaces\n" % i for i in range(500))


@pytest.fixture(scope="module")
def corpus():
    data = torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)
    return Corpus(train=data[:-2000].clone(), val=data[-2000:].clone(), source="synthetic")


def make_trainer(out, corpus, *extra, quiet=True):
    cfg = load_config("test", overrides=[f"train.out_dir={out}", "train.max_steps=12", "train.device=cpu",
                                         "train.threads=1", "train.log_every=1", "train.checkpoint_every=4", *extra])
    return Trainer(cfg, corpus=corpus, quiet=quiet)


def poison_calls(monkeypatch, calls: set[int]):
    """Make the objective's loss NaN on the given (0-based) calls."""
    from rltok.objective.loss import BoundaryObjective

    real = BoundaryObjective.loss
    count = {"n": 0}

    def wrapped(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        i = count["n"]
        count["n"] += 1
        if i in calls:
            loss = loss * float("nan")
            metrics = {**metrics, "loss": loss.detach()}
        return loss, metrics

    monkeypatch.setattr(BoundaryObjective, "loss", wrapped)


def snapshot(trainer):
    params = [p.detach().clone() for p in trainer.model.parameters()]
    opt = {k: {kk: vv.clone() for kk, vv in v.items()} for k, v in trainer.opt.state_dict()["state"].items()}
    return params, opt


def test_nan_loss_is_skipped_without_touching_the_model(tmp_path, corpus, monkeypatch):
    trainer = make_trainer(tmp_path, corpus)
    assert trainer.train_step() is not None  # one real step, so the optimiser has state
    poison_calls(monkeypatch, {1})  # the next call (counting from the patch) is poisoned
    trainer.train_step()
    params, opt = snapshot(trainer)
    assert trainer.train_step() is None
    after_params, after_opt = snapshot(trainer)
    assert all(torch.equal(p, q) for p, q in zip(params, after_params))
    assert opt.keys() == after_opt.keys() and all(
        torch.equal(opt[k][kk], after_opt[k][kk]) for k in opt for kk in opt[k])
    assert all(p.grad is None for p in trainer.model.parameters())


def test_injected_nan_step_is_logged_and_training_continues(tmp_path, corpus, monkeypatch, capsys):
    poison_calls(monkeypatch, {5})
    trainer = make_trainer(tmp_path, corpus, quiet=False)
    result = trainer.fit()
    assert result.step == 12
    assert "non-finite loss or gradient, update skipped" in capsys.readouterr().err
    assert [r["skipped_steps"] for r in result.history] == [0] * 5 + [1] * 7
    assert all(torch.isfinite(p).all() for p in load_checkpoint(tmp_path)[0].parameters())


def test_nan_gradient_with_finite_loss_is_skipped(tmp_path, corpus):
    trainer = make_trainer(tmp_path, corpus)
    params, _ = snapshot(trainer)
    handle = trainer.model.head.weight.register_hook(lambda g: g * float("nan"))
    assert trainer.train_step() is None
    handle.remove()
    assert all(torch.equal(p, q) for p, q in zip(params, snapshot(trainer)[0]))
    assert trainer.train_step() is not None


def test_repeated_nan_steps_stop_the_run_with_the_last_good_checkpoint_intact(tmp_path, corpus):
    trainer = make_trainer(tmp_path, corpus)
    trainer.fit(stop_at=8)
    good = [p.detach().clone() for p in trainer.model.parameters()]
    with torch.no_grad():  # from here on every step is non-finite
        trainer.model.head.weight[0, 0] = float("nan")
    with pytest.raises(TrainingDiverged, match=r"5 consecutive non-finite steps after step 8.*step_0000008"):
        trainer.fit()
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_0000004", "step_0000008"]
    model, _, state, _ = load_checkpoint(tmp_path, with_trainer_state=True)
    assert state["step"] == 8
    assert all(torch.equal(p, q) for p, q in zip(good, model.parameters()))


def test_non_finite_parameters_are_never_checkpointed(tmp_path, corpus):
    trainer = make_trainer(tmp_path, corpus)
    with torch.no_grad():
        trainer.model.head.weight[0, 0] = float("inf")
    with pytest.raises(TrainingDiverged, match="refusing to overwrite"):
        trainer.save()
    assert list_checkpoints(tmp_path) == []


def test_cli_reports_divergence_in_one_line(tmp_path, monkeypatch, capsys):
    poison_calls(monkeypatch, set(range(100)))
    data = tmp_path / "d.txt"
    data.write_bytes(TEXT)
    code = main(["train", "--preset", "test", "--data", str(data), "--out", str(tmp_path / "run"),
                 "train.device=cpu", "train.threads=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1].startswith("error: 5 consecutive non-finite steps") and "train.lr" in err[-1]


@pytest.mark.parametrize("bias,kind", [(12.0, "high"), (-12.0, "low")])
def test_rate_collapse_is_reported_with_advice(tmp_path, corpus, capsys, bias, kind):
    # no rate or policy pressure, and the policy pinned at an extreme: the rate stays stuck
    trainer = make_trainer(tmp_path, corpus, "objective.rate.weight=0", "objective.pg_weight=0", quiet=False)
    with torch.no_grad():
        trainer.model.chunker.head.bias.fill_(bias)
    result = trainer.fit()
    err = capsys.readouterr().err
    assert f"boundary rate collapsed {kind}" in err and "objective.rate.weight" in err
    assert err.count("boundary rate collapsed") == 1  # once per episode, not every log line
    # warmup is 2 steps: checked from step 5, warned on the third collapsed record
    assert [r["warnings"] for r in result.history] == [0] * 6 + [1] * 6


def test_healthy_run_raises_no_warnings(tmp_path, corpus):
    result = make_trainer(tmp_path, corpus).fit()
    assert result.history[-1]["warnings"] == 0 and result.history[-1]["skipped_steps"] == 0


def test_full_disk_at_a_periodic_checkpoint_does_not_stop_training(tmp_path, corpus, monkeypatch):
    real = model_files.save_file
    fail = {"left": 1}

    def flaky(*args, **kwargs):
        if fail["left"]:
            fail["left"] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(model_files, "save_file", flaky)
    result = make_trainer(tmp_path, corpus).fit()
    assert result.step == 12 and result.history[-1]["warnings"] == 1
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000008", "step_0000012"]


def test_full_disk_at_the_final_checkpoint_is_a_clear_error(tmp_path, corpus, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_files, "save_file", full)
    with pytest.raises(CheckpointError, match="cannot write the checkpoint of step 12 .*No space left"):
        make_trainer(tmp_path, corpus).fit()


def test_the_collapse_advice_names_keys_the_config_accepts():
    import re
    import warnings

    from rltok.training.metrics import COLLAPSE_ADVICE

    keys = {k for text in COLLAPSE_ADVICE.values() for k in re.findall(r"\b(?:model|objective|train)\.[a-z_.]*[a-z]", text)}
    assert "objective.rate.weight" in keys
    for key in keys:  # each one settable as it is named (a legacy key would only warn)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_config("test", overrides=[f"{key}={'0.2' if key == 'model.target_rate' else '0.01'}"])
