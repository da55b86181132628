"""The tokenizer phase (objective.tokenizer_phase): the first share of the training compute runs
only the encoder, the early-exit head and the boundary rule; its FLOPs are counted at that cost;
then everything trains together. Resume is exact across the phase's end."""

import pytest
import torch

from rltok.config import ConfigError, load_config
from rltok.model.flops import run_cost
from rltok.training.trainer import Trainer
from conftest import straight_and_resumed
from test_boundary_learning import corpus

OVER = ["train.threads=1", "objective.recipe=lexicon", "objective.estimator.lexicon.size=4096", "train.log_every=1",
        "train.eval_every=1000", "train.checkpoint_every=1000"]


def cfg(out, *extra):
    """The test preset with OVER and `extra` (with the reference recipe, no lexicon to size)."""
    over = OVER if "objective.recipe=reference" not in extra else [o for o in OVER if ".lexicon." not in o]
    return load_config("test", overrides=[f"train.out_dir={out}", *over, *extra])


def test_phase_flops_are_the_encoder_side_forward_and_backward():
    c = load_config("small", overrides=["objective.tokenizer_phase=0.15"])
    f = run_cost(c).forward()
    expected = 3 * (f["encoder"] + f["encoder_attn"] + f["early_head"] + f["policy"])
    assert run_cost(c).tokenizer_phase_per_byte() == pytest.approx(expected)
    # about a quarter of a full step at the small preset: what makes the phase cheap
    assert 0.2 < run_cost(c).tokenizer_phase_per_byte() / run_cost(c).step_train_per_byte() < 0.3


def test_phase_steps_touch_only_the_encoder_side_then_all_trains(tmp_path):
    trainer = Trainer(cfg(tmp_path, "train.max_steps=12", "objective.tokenizer_phase=0.2"), corpus=corpus(),
                      quiet=True)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    phase_steps = 0
    while trainer.objective.tokenizer_phase(trainer.step_bytes, trainer.sampler.seq_len):
        spent = trainer.flops_spent
        assert trainer.train_step() is not None
        trainer.step += 1
        phase_steps += 1
        # counted at the encoder side's cost, not a full step's
        assert trainer.flops_spent - spent == pytest.approx(
            run_cost(trainer.cfg).tokenizer_phase_per_byte() * trainer.step_bytes)
    after = trainer.model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("encoder.") for k in moved) and "early_head.weight" in moved
    assert any(k.startswith("chunker.") for k in moved)  # the policy learns in the phase
    assert not any(k.startswith(("main.", "decoder.", "head.", "down.", "up.")) for k in moved), moved
    # 0.2 of 12 full steps' FLOPs at ~1/4 of their cost: more phase steps than 0.2 * 12
    assert phase_steps > 0.2 * 12
    # the lexicon counted the phase's chunks
    assert trainer.objective.lexicon.counts.sum() > 0
    metrics = trainer.train_step()
    assert "tokenizer_phase" not in metrics
    assert not torch.equal(before["head.weight"], trainer.model.state_dict()["head.weight"])


def test_phase_is_reported_in_the_metrics(tmp_path):
    result = Trainer(cfg(tmp_path, "train.max_steps=10", "objective.tokenizer_phase=0.3"), corpus=corpus(),
                     quiet=True).fit()
    flags = [rec.get("tokenizer_phase", 0.0) for rec in result.history]
    assert flags[0] == 1.0 and flags[-1] == 0.0  # starts in the phase, ends training everything


def test_resume_is_exact_across_the_phase_end(tmp_path):
    extra = ("train.max_steps=10", "objective.tokenizer_phase=0.3", "train.checkpoint_every=4")
    full, resumed = straight_and_resumed(lambda out: cfg(out, *extra), tmp_path, 4, corpus)
    assert resumed.flops_spent == full.flops_spent


def test_phase_settings_are_checked():
    with pytest.raises(ConfigError, match="share"):
        load_config("small", overrides=["objective.tokenizer_phase=1.5"])
    # the reference recipe's credit reads the full model, which the phase does not run
    with pytest.raises(ConfigError, match="lexicon recipe"):
        load_config("small", overrides=["objective.recipe=reference", "objective.tokenizer_phase=0.1"])
    with pytest.raises(ConfigError, match="lexicon recipe"):
        load_config("small", overrides=["objective.estimator.model_pass=true", "objective.tokenizer_phase=0.1"])
    from rltok.objective.loss import BoundaryObjective

    # a fixed rule has no tokenizer to learn: its phase trains the encoder alone (the control)
    fixed = load_config("small", overrides=["model.chunker=uniform", "objective.recipe=reference",
                                            "objective.tokenizer_phase=0.1"])
    assert BoundaryObjective(fixed, run_cost(fixed)).tokenizer_phase(4096, 512)
    small = load_config("small", overrides=["objective.tokenizer_phase=0.1"])
    assert BoundaryObjective(small, run_cost(small)).tokenizer_phase(4096, 512)
    # models without an encoder: no phase
    flat = load_config("small", overrides=["model.arch=flat", "objective.tokenizer_phase=0.1"])
    assert not BoundaryObjective(flat, run_cost(flat)).tokenizer_phase(4096, 512)


def test_a_fixed_rule_phase_trains_the_encoder_alone(tmp_path):
    trainer = Trainer(cfg(tmp_path, "train.max_steps=8", "objective.tokenizer_phase=0.2", "model.chunker=uniform",
                          "objective.recipe=reference"), corpus=corpus(), quiet=True)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert trainer.train_step() is not None
    moved = {k for k in before if not torch.equal(before[k], trainer.model.state_dict()[k])}
    assert "early_head.weight" in moved and not any(k.startswith(("main.", "decoder.", "head.")) for k in moved)


def test_the_phase_is_a_share_of_a_budget_set_after_building(tmp_path):
    """compare's budget runs set train.flops_budget (and max_steps) on the trainer's config after
    building the trainer: the phase must end at its share of that budget, not of the preset's steps."""
    trainer = Trainer(cfg(tmp_path, "train.max_steps=1000", "objective.tokenizer_phase=0.3"), corpus=corpus(),
                      quiet=True)
    budget = 12 * trainer.cost.at(trainer.sampler.seq_len).step_train_per_byte() * trainer.step_bytes
    trainer.cfg.train.flops_budget = budget
    while trainer.objective.tokenizer_phase(trainer.step_bytes, trainer.sampler.seq_len):
        assert trainer.train_step() is not None
        trainer.step += 1
        assert trainer.step < 100, "the phase outlived its share of the budget"
    assert 0.3 * budget <= trainer.flops_spent < 0.3 * budget + trainer.step_bytes * 1e9
