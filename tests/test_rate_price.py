"""The rate a run picks itself (objective.rate_price=loss_slope): a price per boundary in nats,
the slope of the training loss against ln FLOPs spent times what a boundary adds to the FLOPs
per byte, set against the flips' credits uncentred."""

import math

import pytest
import torch

from rltok.config import ConfigError, load_config
from rltok.objective.controller import LossSlopePrice
from rltok.objective.loss import BoundaryObjective
from rltok.training.trainer import Trainer
from conftest import straight_and_resumed
from test_boundary_learning import corpus


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


def test_rate_price_settings_are_checked():
    with pytest.raises(ConfigError, match="did you mean 'loss_slope'"):
        load_config("small", overrides=["objective.estimator.price=slope"])
    with pytest.raises(ConfigError, match="for kind 'score_function'"):  # the price is in the flips' credit
        load_config("small", overrides=["objective.recipe=reference", "objective.estimator.price=loss_slope"])


def test_the_compare_harness_diagnoses_a_run_that_sets_its_own_price(tmp_path):
    """`rltok compare` measures each rl run's own estimator at its final checkpoint; the diagnostic
    drops the price from the credit, which must not trip the check that the price needs one."""
    from rltok.analysis.estimator_snr import own_estimator

    cfg = load_config("test", overrides=[f"train.out_dir={tmp_path}", "train.threads=1", "objective.recipe=lexicon",
                                         "objective.estimator.price=loss_slope", "objective.estimator.lexicon.size=4096"])
    model = Trainer(cfg, corpus=corpus(), quiet=True).model
    x = torch.randint(0, 256, (4, 32))
    d = own_estimator(model, x, x, cfg.objective, n_estimates=2, n_reference=2)
    assert math.isfinite(d["snr"])
