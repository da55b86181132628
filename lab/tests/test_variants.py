"""The studies' own variants (rltok_lab.variants, a plugin): the teacher rule, the probes (the
plumbing check: a synthetic reward the policy must learn through the real estimator path), the
loss-slope price (a rate the run picks itself: the slope of the training loss against ln FLOPs
spent times what a boundary adds to the FLOPs per byte, set against the flips' credits uncentred)."""

import math

import pytest
import torch
from conftest import randomize_, straight_and_resumed, tiny_model_config
from test_boundary_learning import corpus
from test_chunkers import text_batch

from rltok.config import ConfigError, ObjectiveConfig, load_config, load_plugin
from rltok.model import HourglassLM
from rltok.objective.loss import BoundaryObjective, compute_loss
from rltok.training.trainer import Trainer

load_plugin("rltok_lab.variants")

from rltok_lab.variants import LossSlopePrice, TeacherChunkerSettings  # noqa: E402


def test_the_teacher_rule_gives_a_frozen_models_greedy_cuts_and_holds_none_of_it(tmp_path):
    teacher = randomize_(HourglassLM(tiny_model_config(chunker="rl")), scale=0.5).eval()
    teacher.save_pretrained(tmp_path / "teacher")
    settings = TeacherChunkerSettings(checkpoint=str(tmp_path / "teacher"))
    student = HourglassLM(tiny_model_config(chunker=settings))
    x = text_batch()
    out = student(x, generator=torch.Generator().manual_seed(0), force_last=False)
    want = teacher(x, mode="greedy", force_last=False).boundaries.b
    assert torch.equal(out.boundaries.b, want) and 0 < want.float().mean() < 1
    # nothing of the teacher is the student's: parameters, state, FLOPs; and it stays frozen
    assert not any("chunker" in k for k in student.state_dict())
    assert sum(p.numel() for p in student.chunker.parameters()) == 0
    loss, _ = compute_loss(out, x.roll(-1, 1), ObjectiveConfig(), 0.2)
    loss.backward()
    assert all(p.grad is None for p in student.chunker.teacher("cpu").parameters())
    for bad, match in (("", "needs model.chunker.checkpoint"), (str(tmp_path / "nowhere"), "no model folder")):
        with pytest.raises(ConfigError, match=match):
            HourglassLM(tiny_model_config(chunker=TeacherChunkerSettings(checkpoint=bad)))


@pytest.mark.parametrize("estimator", ["score_function", "flips"])
def test_policy_learns_the_synthetic_whitespace_reward(tmp_path, estimator):
    """Plumbing check: +1 for a boundary on whitespace, -1 elsewhere, through the real estimator
    path (sampling, baseline, discount or flips, optimiser). Chance is ~0.2. 150 steps: the flips
    reach about 0.96; the score function, its policy's learning rate tripled, 0.66-0.77 over seeds
    0-3 (as in 300 steps at the default rate)."""
    faster = ["objective.policy_lr_mult=3"] if estimator == "score_function" else []
    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.max_steps=150", "train.threads=1",
                                         "train.eval_every=150", "train.log_every=50", "train.checkpoint_every=1000",
                                         "objective.reward=whitespace_probe", f"objective.estimator={estimator}",
                                         *faster])
    result = Trainer(cfg, corpus=corpus(), quiet=True).fit()
    assert result.val["space_end"] > (0.9 if estimator == "flips" else 0.5), result.val


def test_token_probe_rewards_cuts_where_a_python_token_starts():
    """objective.reward=token_probe: +1 for a boundary on the first byte of a lexical unit, -1 for
    one elsewhere, 0 at byte 1 (its predecessor, byte 0, is not among the targets)."""
    from rltok.objective.rewards import make_reward

    probe = make_reward("token_probe")
    text = b"self.value  = 10\n"  # units: self . value "  " = " " 10 \n
    targets = torch.tensor([list(text[1:]) + [32]])  # byte t is targets[t - 1]
    r = probe(None, None, torch.ones_like(targets, dtype=torch.bool), targets)
    starts = {4, 5, 10, 12, 13, 14, 16}
    assert r[0, :2].tolist() == [0.0, 0.0]
    assert r[0, 2:].tolist() == [1.0 if t in starts else -1.0 for t in range(2, len(text))]
    b = torch.zeros_like(targets, dtype=torch.bool)
    assert (probe(None, None, b, targets) == 0).all()  # no boundary, no reward


def test_the_token_probe_lexes_each_step_once_and_rewards_as_before(tmp_path, monkeypatch):
    """The counterfactual carries the sampled decisions' probe reward, from the same lexing as the
    flipped ones': each row's bytes are lexed once per step, and the reward is the probe's."""
    import rltok.data.python_tokens as ta
    from rltok.objective.build import estimator_settings
    from rltok.objective.loss import Flips, compute_loss
    from rltok.objective.rewards import make_reward

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.threads=1", "objective.estimator=flips",
                                         "objective.reward=token_probe"])
    trainer = Trainer(cfg, corpus=corpus(), quiet=True)
    src = (b"def f(self, x):\n    return self.value + x  # add\n" * 8)[:129]
    data = torch.tensor([list(src), list(src[::-1])])
    x, y = data[:, :-1], data[:, 1:]
    out = trainer.model(x)
    lexed = []
    ends = ta.token_ends
    monkeypatch.setattr(ta, "token_ends", lambda data, *a: lexed.append(data) or ends(data, *a))
    o = cfg.objective  # the flips' counterfactual of its settings, without a lexicon
    cf = Flips(make_reward(o.reward.kind), estimator_settings(o)).counterfactual(trainer.model, x, y, out)
    assert len(lexed) == x.shape[0]
    want = make_reward("token_probe")(None, None, out.boundaries.b, out.rows_targets(y))
    assert torch.equal(cf.reward, want)
    lexed.clear()
    compute_loss(out, y, cfg.objective, cfg.model.target_rate, counterfactual=cf)
    assert lexed == []  # the loss reuses the counterfactual's reward


def test_a_probe_runs_no_model_pass_and_counts_no_extra_flops(tmp_path):
    """The probes' credit is a function of the decisions alone: no counterfactual model pass is run
    or charged, so a probe run spends the FLOPs of a fixed rule's step."""
    def run(name, *extra):
        cfg = load_config("test", overrides=[f"train.out_dir={tmp_path / name}", "train.max_steps=3", "train.threads=1",
                                             "train.eval_every=1000", "train.checkpoint_every=1000", *extra])
        trainer = Trainer(cfg, corpus=corpus(), quiet=True)
        calls = []  # per model pass: whether it re-ran a counterfactual segmentation
        forward, rerun = trainer.model.forward, trainer.model.rerun
        trainer.model.forward = lambda *a, **k: calls.append(False) or forward(*a, **k)
        trainer.model.rerun = lambda *a, **k: calls.append(True) or rerun(*a, **k)
        trainer.fit()
        return trainer, calls

    probe, calls = run("probe", "objective.estimator=flips", "objective.reward=token_probe")
    assert calls and not any(calls)
    lm, lm_calls = run("lm", "objective.estimator=flips")
    assert any(lm_calls)
    assert probe.flops_spent < 0.9 * lm.flops_spent


def test_the_slope_is_the_loss_fall_per_e_fold_of_compute():
    price = LossSlopePrice(decay=1.0)
    for i in range(1, 40):
        flops = 1e9 * 1.1 ** i
        price.update(5.0 - 0.3 * math.log(flops), flops, cost_slope=2.5)
    assert price.slope.item() == pytest.approx(0.3, rel=1e-4)
    assert price.price.item() == pytest.approx(0.75, rel=1e-4)
    # a loss that rises buys nothing: no negative price (it would pay for boundaries)
    rising = LossSlopePrice(decay=1.0)
    for i in range(1, 10):
        rising.update(1.0 + 0.1 * i, 1e9 * 2 ** i, 2.5)
    assert rising.price.item() == 0.0
    # state round trip, and a restart forgets the history
    copy = LossSlopePrice()
    copy.load_state_dict(price.state_dict())
    assert torch.equal(copy.sums, price.sums) and copy.price.item() == price.price.item()
    price.restart()
    assert price.slope.item() == 0.0


def test_cost_slope_is_the_relative_growth_of_flops_per_byte():
    from rltok.model.flops import run_cost

    cfg = load_config("small", overrides=["objective.estimator.price=loss_slope"])
    obj = BoundaryObjective(cfg, run_cost(cfg))
    h = 1e-4
    numeric = (math.log(run_cost(cfg).forward_per_byte(0.2 + h)) -
               math.log(run_cost(cfg).forward_per_byte(0.2 - h))) / (2 * h)
    assert obj.cost_slope(0.2) == pytest.approx(numeric, rel=1e-4)
    assert isinstance(obj.flip_price, LossSlopePrice)


def test_a_run_sets_its_own_price_and_resumes_exactly(tmp_path):
    over = ["train.threads=1", "objective.recipe=lexicon", "objective.estimator.price=loss_slope",
            "objective.estimator.lexicon.size=4096", "train.log_every=1", "train.eval_every=1000",
            "train.checkpoint_every=5", "train.max_steps=12", "objective.tokenizer_phase=0.2"]
    full, resumed = straight_and_resumed(
        lambda out: load_config("test", overrides=[f"train.out_dir={out}", *over]), tmp_path, 5, corpus)
    prices = [rec["flip_price"] for rec in full.history]
    assert prices[-1] > 0 and len(set(prices)) > 2  # read from the run, moving with it
    assert torch.equal(full.objective.flip_price.sums, resumed.objective.flip_price.sums)


def test_loss_slope_settings_are_checked():
    with pytest.raises(ConfigError, match="did you mean 'loss_slope'"):
        load_config("small", overrides=["objective.estimator.price=slope"])
    with pytest.raises(ConfigError, match="for kind 'score_function'"):  # the price is in the flips' credit
        load_config("small", overrides=["objective.recipe=reference", "objective.estimator.price=loss_slope"])


def test_the_compare_harness_diagnoses_a_run_that_sets_its_own_price(tmp_path):
    """`rltok compare` measures each rl run's own estimator at its final checkpoint; the diagnostic
    drops the price from the credit, which must not trip the check that the price needs one."""
    from rltok_lab.estimator_snr import own_estimator

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.threads=1", "objective.recipe=lexicon",
                                         "objective.estimator.price=loss_slope", "objective.estimator.lexicon.size=4096"])
    model = Trainer(cfg, corpus=corpus(), quiet=True).model
    x = torch.randint(0, 256, (4, 32))
    d = own_estimator(model, x, x, cfg.objective, n_estimates=2, n_reference=2)
    assert math.isfinite(d["snr"])
