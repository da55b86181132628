"""The held-out prediction's score (`python -m rltok_lab study --holdout`): a run at the predicted
budget against the prediction, on synthetic studies with known answers."""

from __future__ import annotations

import dataclasses

import pytest

from rltok.analysis.scaling_fit import Prediction, fit_study, predict, profiles_from_records, to_plain
from rltok_lab.scaling_holdout import estimate, in_interval, score_prediction
from test_scaling_fit import BUDGETS, X, synth  # the library's fit tests' synthetic study


def test_a_run_at_the_true_optimum_scores_near_the_prediction():
    records = synth("x", X, budgets=BUDGETS + [1e14])
    pred = predict(fit_study(records, budgets=BUDGETS, n_boot=200)["x"].envelope, 1e14)  # 1e14 held out
    held = profiles_from_records(records)["x"][1e14]
    mid = len(held.sizes) // 2  # the run at the true optimum, 3 seeds
    score = score_prediction(pred, held.losses[mid], size=held.sizes[mid])
    assert score.error == pytest.approx(score.measured - pred.l_star)
    assert abs(score.error) < 0.03 and score.size_ratio == pytest.approx(1.0, rel=0.1)
    assert score.measured_interval[0] < score.measured < score.measured_interval[1]
    plain = to_plain(score)
    assert plain["prediction"]["budget"] == 1e14 and isinstance(plain["within"], bool)


def test_a_prediction_with_an_unknown_interval_is_neither_inside_nor_outside_it():
    nan = float("nan")
    pred = Prediction("flat", 1e9, 1e4, (nan, nan), 2.0, (nan, nan), 0.95, 3.0, None)
    score = score_prediction(pred, [2.1, 2.2], size=1e4)
    assert score.within is None and score.size_within is None and score.error == pytest.approx(0.15)
    known = dataclasses.replace(pred, l_star_interval=(1.9, 2.1), n_star_interval=(5e3, 2e4))
    assert score_prediction(known, [2.3, 2.4], size=1e4).within is False
    assert score_prediction(known, [2.0, 2.05], size=3e4).size_within is False
    assert in_interval(1.0, (nan, 2.0)) is None and in_interval(1.0, (0.5, 2.0)) is True
    assert in_interval(3.0, (0.5, 2.0)) is False


def test_an_estimate_prints_with_its_interval_and_a_dash_where_a_number_is_missing():
    assert estimate(2.5, (2.25, 2.75), ".2f") == "2.50 (2.25–2.75)"
    for missing in (None, float("nan"), float("inf")):
        assert estimate(missing, (1.0, missing), ".1f") == "– (1.0––)"
