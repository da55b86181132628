"""A policy that settles (objective.policy_until): it learns for a share of the training compute,
then its decisions are thresholded and nothing trains it, so the language model sees fixed cuts
for the rest of the run; the flag lives in the checkpoint, and a resume settles at the same step."""

import dataclasses
import math

import pytest
import torch

from rltok.config import ConfigError, load_config
from rltok.model.chunkers import RLPolicy
from rltok.training.trainer import Trainer
from conftest import straight_and_resumed
from test_boundary_learning import corpus

OVER = ["train.threads=1", "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=1000"]


def cfg(out, *extra):
    return load_config("test", overrides=[f"train.out_dir={out}", *OVER, *extra])


def test_a_settled_rule_decides_greedily_whatever_mode_it_is_asked():
    torch.manual_seed(0)
    rule = RLPolicy(8, window=3)
    with torch.no_grad():
        rule.head.weight.normal_()
    h, forced = torch.randn(4, 32, 8), torch.zeros(4, 32, dtype=torch.bool)
    greedy = rule(h, forced, mode="greedy").b
    draws = [rule(h, forced, mode="sample", generator=torch.Generator().manual_seed(s)).b for s in range(3)]
    assert not all(torch.equal(d, greedy) for d in draws)  # sampling differs from the threshold
    rule.settle()
    for s in range(3):
        assert torch.equal(rule(h, forced, mode="sample", generator=torch.Generator().manual_seed(s)).b, greedy)
    # one byte at a time (cached decoding) as well
    state = rule.start_state(h[:, :1], greedy[:, :1])
    step = rule.step(state, h[:, 1], forced[:, 1], mode="sample", generator=torch.Generator().manual_seed(0))
    assert torch.equal(step.b, greedy[:, 1])


def test_the_settled_flag_travels_in_the_state_dict_and_only_once_settled():
    rule = RLPolicy(8)
    unsettled = set(rule.state_dict())
    assert "settled" not in unsettled  # a policy that never settles keeps the state it always had
    rule.settle(cut=1.5, hold=0.25)
    assert set(rule.state_dict()) == unsettled | {"settled", "cut_logit", "cut_hold"}
    fresh = RLPolicy(8)
    fresh.load_state_dict(rule.state_dict())
    assert fresh.is_settled and bool(fresh.settled) and fresh.cut_at == 1.5 and fresh.hold_at == 0.25
    # a rule settled before the cut was kept (only the flag) cut where p > 0.5 and held nothing
    fresh.load_state_dict({k: v for k, v in rule.state_dict().items() if k not in ("cut_logit", "cut_hold")})
    assert fresh.is_settled and fresh.cut_at == 0.0 and fresh.hold_at == 0.0
    fresh.load_state_dict(RLPolicy(8).state_dict())  # a state from before it settled: strict, and unsettled
    assert not fresh.is_settled and "settled" not in fresh.state_dict()


def test_the_policy_learns_until_its_share_then_stays_put_and_is_not_charged(tmp_path):
    trainer = Trainer(cfg(tmp_path, "train.max_steps=12", "objective.policy_until=0.4"), corpus=corpus(), quiet=True)
    planned = trainer.objective.planned_flops(trainer.step_bytes, trainer.sampler.seq_len)
    history = []
    while trainer.step < 12:
        before = {k: v.detach().clone() for k, v in trainer.model.chunker.named_parameters()}
        metrics = trainer.train_step()
        assert metrics is not None
        moved = any(not torch.equal(before[k], v) for k, v in trainer.model.chunker.named_parameters())
        history.append((trainer.objective.settled, moved, "entropy" in metrics))
        if trainer.objective.settled:  # the rate its thresholded cuts make, not its sigmoid's
            assert float(metrics["expected_rate"]) == pytest.approx(float(metrics["rate"]))
            assert float(metrics["p_mean"]) == pytest.approx(float(metrics["rate"]))
        trainer.step += 1
    learning = [h for h in history if not h[0]]
    settled = [h for h in history if h[0]]
    assert learning and settled, history
    assert all(moved and entropy for _, moved, entropy in learning)  # the policy learned until then
    # afterwards its weights stay exactly where they were
    assert not any(moved for _, moved, _ in settled) and not any(entropy for *_, entropy in settled)
    assert trainer.model.chunker.is_settled
    # it settled at the first step that started past 0.4 of the planned compute
    assert len(learning) == min(i for i in range(1, 13) if i * planned / 12 >= 0.4 * planned - 1e-6 * planned)
    # its decisions are thresholded: two forwards in training mode draw the same cuts
    x, _ = trainer.sampler.next()
    trainer.model.train()
    a = trainer.model(x, generator=torch.Generator().manual_seed(1)).boundaries.b
    b = trainer.model(x, generator=torch.Generator().manual_seed(2)).boundaries.b
    assert torch.equal(a, b)


def test_a_rule_that_would_settle_before_its_warm_start_ends_is_an_error(tmp_path):
    over = ("train.max_steps=12", "objective.policy_until=0.1", "objective.policy_start_step=8")
    trainer = Trainer(cfg(tmp_path, *over), corpus=corpus(), quiet=True)
    with pytest.raises(ValueError, match="policy_start_step=8.*settle untrained"):
        while trainer.step < 12:
            trainer.train_step()
            trainer.step += 1
    assert not trainer.objective.settled and not trainer.model.chunker.is_settled
    # a rule that settled already (a resume, here with the warm start raised since) is no error
    trainer = Trainer(cfg(tmp_path / "b", "train.max_steps=12", "objective.policy_until=0.4"), corpus=corpus(),
                      quiet=True)
    while not trainer.objective.settled:
        trainer.train_step()
        trainer.step += 1
    trainer.objective.settled = False  # as a resumed objective starts: the rule's buffer says it settled
    trainer.objective.schedule = dataclasses.replace(trainer.objective.schedule, policy_start_step=99)
    trainer.train_step()
    assert trainer.objective.settled


def test_the_flips_model_pass_is_not_charged_once_settled(tmp_path):
    over = ("train.max_steps=6", "objective.policy_until=0.5", "objective.estimator=flips")
    trainer = Trainer(cfg(tmp_path, *over), corpus=corpus(), quiet=True)
    cost = trainer.objective.cost.at(trainer.sampler.seq_len)
    while trainer.step < 6:
        spent = trainer.flops_spent
        metrics = trainer.train_step()
        trainer.step += 1
        rates = (float(metrics["chunks_per_byte"]), None)
        charged = cost.step_train_per_byte(*rates, counterfactual=not trainer.objective.settled) * trainer.step_bytes
        assert trainer.flops_spent - spent == pytest.approx(charged)
    assert trainer.objective.settled


def test_a_run_log_says_when_the_policy_settled_and_resume_is_exact_across_it(tmp_path, capsys):
    extra = ("train.max_steps=10", "objective.policy_until=0.5", "train.checkpoint_every=3")
    full, resumed = straight_and_resumed(lambda out: cfg(out, *extra), tmp_path, 3, corpus)
    assert resumed.flops_spent == full.flops_spent and resumed.model.chunker.is_settled
    flags = [rec.get("policy_settled", 0.0) for rec in full.history]
    assert flags[0] == 0.0 and flags[-1] == 1.0  # the metrics say from which step on
    # the log says when: once, on the step it happened (a resume past it says nothing again)
    Trainer(cfg(tmp_path / "c", "train.max_steps=4", "objective.policy_until=0.5"), corpus=corpus()).fit()
    assert capsys.readouterr().err.count("the boundary policy settled") == 1


def test_settle_settings_are_checked():
    for bad in ("0", "1.5", "nan"):
        with pytest.raises(ConfigError, match="objective.policy_until"):
            load_config("test", overrides=[f"objective.policy_until={bad}"])
    with pytest.raises(ConfigError, match="objective.policy_until"):
        load_config("test", overrides=["objective.recipe=lexicon", "objective.tokenizer_phase=0.3",
                                       "objective.policy_until=0.2"])


def test_a_settled_rule_stays_settled_when_a_resume_moves_the_budget(tmp_path):
    Trainer(cfg(tmp_path, "train.max_steps=8", "objective.policy_until=0.5"), corpus=corpus(), quiet=True).fit()
    longer = Trainer(cfg(tmp_path, "train.max_steps=40", "objective.policy_until=0.5"), corpus=corpus(), resume=True,
                     quiet=True)
    assert longer.model.chunker.is_settled
    metrics = longer.train_step()
    assert longer.objective.settled and "entropy" not in metrics  # no policy term beside a settled rule


def test_settling_needs_a_learned_rule_and_one_segmentation_per_sequence():
    for over in (["model.chunker=uniform"], ["model.arch=flat"], ["objective.group_size=2", "train.batch_size=4"]):
        with pytest.raises(ConfigError, match="objective.policy_until"):
            load_config("test", overrides=["objective.policy_until=0.5", *over])


@pytest.mark.parametrize("threshold", ["rate", "half"])
def test_a_settling_rule_keeps_the_rate_it_drew_unless_asked_to_cut_at_half(tmp_path, threshold):
    """The policy starts near its target rate (0.2) with every probability below 0.5: cut at
    p > 0.5 it would cut almost nowhere; at the rate-keeping cut it goes on cutting about as often."""
    over = ("train.max_steps=12", "objective.policy_until=0.4", f"objective.settle_threshold={threshold}")
    result = Trainer(cfg(tmp_path, *over), corpus=corpus(), quiet=True).fit()
    rates = [(rec.get("policy_settled", 0.0), rec["rate"]) for rec in result.history]
    drawn = [r for settled, r in rates if not settled]
    kept = [r for settled, r in rates if settled]
    assert drawn and kept
    mean_drawn, mean_kept = sum(drawn) / len(drawn), sum(kept) / len(kept)
    if threshold == "rate":  # where it settles (afterwards follow_rate holds it; a real run: the notebook's S18)
        first = kept[:3]
        assert abs(sum(first) / len(first) - mean_drawn) < 0.05, rates
    else:
        assert mean_kept < 0.5 * mean_drawn, rates


def test_a_settled_cut_follows_the_rate_it_holds():
    rule = RLPolicy(8)
    rule.follow_rate(0.4)  # not settled: nothing to hold
    assert rule.cut_at == 0.0
    rule.settle(cut=0.0, hold=0.2)
    rule.follow_rate(0.4)  # twice the cuts held: a higher cut
    assert rule.cut_at == pytest.approx(0.1 * math.log(2)) and float(rule.cut_logit) == pytest.approx(rule.cut_at)
    rule.follow_rate(0.1)
    assert rule.cut_at == pytest.approx(0.1 * math.log(2) + 0.1 * math.log(0.5))
    half = RLPolicy(8)
    half.settle()  # objective.settle_threshold=half: p > 0.5, nothing held
    half.follow_rate(0.4)
    assert half.cut_at == 0.0


@pytest.mark.slow
def test_a_compiled_model_settles_and_keeps_its_cuts_fixed(tmp_path):
    """train.compile=true: the settle flag flips inside a compiled model's forward (a guard, so a
    recompile), and from then on the compiled model cuts greedily and nothing trains the rule."""
    trainer = Trainer(cfg(tmp_path, "train.max_steps=8", "objective.policy_until=0.4", "train.compile=true"),
                      corpus=corpus(), quiet=True)
    assert trainer.forward is not trainer.wrapped  # the steps run the compiled forward
    settled_at, frozen = None, None
    while trainer.step < 8:
        metrics = trainer.train_step()
        assert metrics is not None and math.isfinite(float(metrics["loss"]))
        if trainer.objective.settled and settled_at is None:
            settled_at = trainer.step
            frozen = {k: v.detach().clone() for k, v in trainer.model.chunker.named_parameters()}
        trainer.step += 1
    assert settled_at is not None and 0 < settled_at < 7
    assert all(torch.equal(frozen[k], v) for k, v in trainer.model.chunker.named_parameters())
    x, _ = trainer.sampler.next()
    trainer.model.train()
    a = trainer.model(x, generator=torch.Generator().manual_seed(1)).boundaries.b
    b = trainer.model(x, generator=torch.Generator().manual_seed(2)).boundaries.b
    assert torch.equal(a, b)
