"""The study's steps on a scaling grid (`python -m rltok_lab study`): status, the held-out
prediction written once and its test, forecasts of the grid's own budgets."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest

from conftest import corpus_folder
from rltok.analysis.scaling import budget_tag, load_grid, parse_grid
from lab_cli import lab_main, main
from rltok.config import ConfigError
from test_scaling_cli import _curve, known_loss_runner, synthetic_study  # the library's scaling tests' helpers


# ---------------------------------------------------------------- the study's rules


def test_a_prediction_is_written_once_then_tested_at_the_held_out_budget(tmp_path, capsys):
    data = corpus_folder(tmp_path, "salad")
    out = tmp_path / "study"
    synthetic_study(out / "salad", [1e7, 3e7, 1e8], [2500, 5000, 10000, 20000, 50000, 80000], [0, 1],
                    lambda c: 2e4 * (c / 1e8) ** 0.5)  # N* = 4.5e4 at 5e8
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"corpora": {"salad": str(data)}, "budgets": [1e7, 3e7, 1e8], "holdout_budgets": [5e8],
                                "holdout_seeds": [0, 1], "preset": "test", "max_eval_windows": 2, "n_boot": 50,
                                "families": [{"method": "flat", "sizes": [5e3, 2e4, 5e4]}]}))
    args = ["scaling", "--grid", str(grid), "--out", str(out)]
    assert main([*args, "--predict"]) == 0
    pred = json.loads((out / "prediction.json").read_text())
    assert pred["fitted_budgets"] == [1e7, 3e7, 1e8] and pred["holdout_budgets"] == [5e8] and pred["commit"]
    p = pred["corpora"]["salad"]["flat"][repr(5e8)]
    assert p["n_star"] == pytest.approx(2e4 * 5 ** 0.5, rel=0.05) and p["extrapolation"] == pytest.approx(5)
    assert p["l_star_interval"][0] <= p["l_star"] <= p["l_star_interval"][1] and p["fitted_budgets"] == [1e7, 3e7, 1e8]
    before = (out / "prediction.json").read_text()
    assert main([*args, "--predict"]) != 0 and "never rewritten" in capsys.readouterr().err
    assert (out / "prediction.json").read_text() == before

    assert main([*args, "--holdout"]) == 0
    captured = capsys.readouterr()
    held = sorted((out / "salad").glob("C5e08__*.json"))
    # at the predicted N* itself (the shape the rule builds for it), not at a rung of the family's own sizes
    target = round(p["n_star"])
    assert [f.name for f in held] == [f"C5e08__flat__N{target}__s0.json", f"C5e08__flat__N{target}__s1.json"]
    recs = [json.loads(f.read_text()) for f in held]
    assert {r["point_kind"] for r in recs} == {"holdout"} and {r["target_size"] for r in recs} == {target}
    score = json.loads((out / "prediction_score.json").read_text())["scores"]
    assert len(score) == 1 and score[0]["seeds"] == [0, 1] and score[0]["size"] == recs[0]["non_embedding_params"]
    assert score[0]["baseline_error"] == pytest.approx(score[0]["measured"] - score[0]["baseline_l_star"])
    assert 0.85 <= score[0]["size_ratio"] <= 1.15  # the shape rule builds within 15% of the target
    assert score[0]["error"] == pytest.approx(score[0]["measured"] - p["l_star"])
    assert "| salad | flat | 5e+08 |" in captured.out
    from rltok_lab.scaling_holdout import predictions_block

    assert "`prediction.json`: the held-out budgets C5e08" in predictions_block(out)
    assert "Scored against C5e08's runs at the predicted sizes" in predictions_block(out)
    # a family whose every held-out seed diverged keeps its row, unscored, and says why
    from rltok_lab.scaling_holdout import holdout_points, score_holdout, score_table

    for f in held:
        f.write_text(json.dumps({**json.loads(f.read_text()), "bpb": None, "diverged": "non-finite loss"}))
    (row,) = score_holdout(load_grid(grid), out, holdout_points(load_grid(grid), pred, log=lambda m: None), pred)
    assert row["measured"] is None and row["within"] is None and row["diverged_seeds"] == 2 and row["seeds"] == []
    assert "| – (0; 2 diverged) | – | – | – |" in score_table([row])
    # a predicted N* that cannot be built within 2x (below the smallest shape, absurdly large) or is
    # not a number is logged and not run
    said = []
    for bad in (1.0, 1e15, float("nan")):
        odd = {**pred, "corpora": {"salad": {"flat": {repr(5e8): {**p, "n_star": bad}}}}}
        assert holdout_points(load_grid(grid), odd, log=said.append) == []
    assert sum("cannot be built within 2x" in m for m in said) == 2 and "no prediction" in said[-1]
    assert main([*args, "--fit-only"]) == 0  # the held-out runs stay out of the fits
    fits = json.loads((out / "salad" / "fits.json").read_text())
    assert set(fits["families"]["flat"]["isofits"]) == {repr(1e7), repr(3e7), repr(1e8)}
    assert main(args) == 0 and "[1/" not in capsys.readouterr().err  # a plain run never runs a held-out budget


def test_a_forecast_of_a_ladder_budget_is_fitted_below_it_and_scored_against_its_ladder(tmp_path, capsys):
    data = corpus_folder(tmp_path, "salad")
    out = tmp_path / "study"
    law = lambda c: 2e4 * (c / 1e8) ** 0.5  # noqa: E731  (N* = 3.5e4 at 3e8)
    sizes = [2500, 5000, 10000, 20000, 50000, 80000]
    synthetic_study(out / "salad", [1e7, 3e7, 1e8], sizes, [0, 1], law)
    grid = tmp_path / "grid.json"
    table = {"corpora": {"salad": str(data)}, "budgets": [1e7, 3e7, 1e8, 3e8], "holdout_budgets": [1e9],
             "preset": "test", "n_boot": 50, "families": [{"method": "flat", "sizes": [5e3, 2e4, 5e4]}]}
    grid.write_text(json.dumps({**table, "seeds": [0, 1, 2]}))  # seed 2 never ran: the budgets are not complete
    args = ["scaling", "--grid", str(grid), "--out", str(out)]
    assert main([*args, "--predict", "--at", "3e8"]) == 2
    assert "not complete" in capsys.readouterr().err and not (out / "prediction_C3e08.json").exists()
    grid.write_text(json.dumps(table))
    assert main([*args, "--predict", "--at", "1e9"]) == 2 and "grid's own budgets" in capsys.readouterr().err
    assert main([*args, "--holdout", "--at", "3e8"]) == 2 and "no prediction yet" in capsys.readouterr().err
    assert main([*args, "--at", "3e8"]) == 2 and "--at goes with" in capsys.readouterr().err
    (out / "salad" / "runs" / "C3e08__flat__N5000__s0").mkdir(parents=True)  # a run under way at 3e8
    assert main([*args, "--predict", "--at", "3e8"]) == 2 and "exist already" in capsys.readouterr().err
    shutil.rmtree(out / "salad" / "runs")
    assert main([*args, "--predict", "--at", "3e8", "3e8"]) == 0
    pred = json.loads((out / "prediction_C3e08.json").read_text())
    assert pred["fitted_budgets"] == pred["budgets"] == [1e7, 3e7, 1e8] and pred["holdout_budgets"] == [3e8]
    p = pred["corpora"]["salad"]["flat"][repr(3e8)]
    assert p["n_star"] == pytest.approx(law(3e8), rel=0.05) and p["extrapolation"] == pytest.approx(3)
    assert not (out / "prediction.json").exists()  # the held-out budget's prediction is another file
    from rltok_lab.scaling_holdout import predictions_block

    block = predictions_block(out)
    assert "`prediction_C3e08.json`: a forecast of the study's own budget C3e08" in block
    assert "| salad | flat | C3e08 |" in block and "--holdout --at 3e+08`" in block
    # a forecast is scored once its budget is complete, not from a partial ladder
    assert main([*args, "--holdout", "--at", "3e8"]) == 2 and "not complete" in capsys.readouterr().err
    (out / "salad" / "C3e08__flat__N5000__s0.json").write_text(json.dumps(
        {"family": "flat", "budget_flops": 3e8, "target_size": 5000, "non_embedding_params": 5000, "seed": 0,
         "bpb": 3.0, "split": "test", "point_kind": "ladder"}))  # one run of 3e8: its fits are provisional
    assert main([*args, "--fit-only"]) == 0  # the fits; which budgets are provisional is the lab's to say
    assert lab_main(["study", *args[1:], "--fit-only"]) == 0 and "salad 3e+08 is not complete" in capsys.readouterr().err
    (out / "salad" / "C3e08__flat__N5000__s0.json").unlink()
    # the forecast's budget is then run as a ladder of the study (here: records of the same law)
    more = tmp_path / "more"
    synthetic_study(more, [3e8], sizes, [0, 1], law)
    for f in more.iterdir():
        shutil.copy(f, out / "salad" / f.name)
    grid.write_text(json.dumps({**table, "budgets": [1e7, 3e7, 1e8, 3e8, 6e8]}))  # 6e8 not run: no matter for 3e8
    assert main([*args, "--holdout", "--at", "3e8"]) == 0
    captured = capsys.readouterr()
    grid.write_text(json.dumps(table))
    (score,) = json.loads((out / "prediction_C3e08_score.json").read_text())["scores"]
    assert score["family"] == "flat" and score["interior"] and score["within"] and score["size_within"]
    assert score["error"] == pytest.approx(score["l_star"] - p["l_star"]) and abs(score["error"]) < 0.01
    assert score["n_star"] == pytest.approx(law(3e8), rel=0.05) and "| salad | flat | C3e08 |" in captured.out
    assert (out / "prediction_C3e08_score.png").stat().st_size > 0  # the forecast against the fit, plotted
    # the naive rival: a power law through the parabola L* at 3e7 and 1e8, which misses the law's floor
    true_l = lambda c: 1.5 + 40 * c ** -0.2  # noqa: E731
    b = math.log(true_l(3e7) / true_l(1e8)) / math.log(1e8 / 3e7)
    assert score["baseline_l_star"] == pytest.approx(true_l(1e8) * 3 ** -b, abs=0.003)
    assert score["baseline_error"] == pytest.approx(score["l_star"] - score["baseline_l_star"])
    assert abs(score["baseline_error"]) > abs(score["error"])  # the fitted law beats it here
    assert "Scored against C3e08's isoFLOP fits" in predictions_block(out) and "Not scored" not in predictions_block(out)
    # a profile with no minimum at the forecast budget is listed, not scored
    from rltok_lab.scaling_holdout import forecast_table, score_forecast

    for f in (out / "salad").glob("C3e08__*.json"):
        rec = json.loads(f.read_text())
        rec["bpb"] = 5.0 - 0.02 * math.log(rec["target_size"]) ** 2  # opens downwards
        f.write_text(json.dumps(rec))
    (flat,) = score_forecast(load_grid(grid), out, [3e8], pred)
    assert not flat["minimum"] and flat["error"] is None and flat["within"] is None
    json.dumps(flat, allow_nan=False)  # plain JSON: no NaN
    assert "(no minimum) | – |" in forecast_table([flat])
    assert sorted(f.name for f in (out / "salad").glob("C3e08__*.json")) == sorted(f.name for f in more.iterdir())
    # once the budget has runs, no forecast of it (nor a prediction of a held-out budget with runs) is written
    (out / "prediction_C3e08.json").unlink()
    assert main([*args, "--predict", "--at", "3e8"]) == 2 and "exist already" in capsys.readouterr().err
    held = parse_grid({"corpora": {"salad": str(data)}, "budgets": [1e7, 3e7, 1e8], "holdout_budgets": [3e8],
                       "families": [{"method": "flat", "sizes": [5e3]}]})
    from rltok_lab.scaling_holdout import write_prediction
    with pytest.raises(ConfigError, match="exist already"):
        write_prediction(held, out)


def test_one_corpus_predicts_nothing_and_held_out_scores_of_other_corpora_are_kept(tmp_path, capsys):
    """--predict writes one prediction for every corpus, so --corpus with it is refused; a bad
    eval_context or a missing selection split is one error before any run."""
    grid = tmp_path / "grid.json"
    base = {"corpora": {"a": str(corpus_folder(tmp_path, "a"))}, "budgets": [1e8], "preset": "test",
            "families": [{"method": "flat", "sizes": [5e3]}]}
    grid.write_text(json.dumps(base))
    assert main(["scaling", "--grid", str(grid), "--out", str(tmp_path / "o"), "--corpus", "a", "--predict"]) == 2
    assert "drop --corpus" in capsys.readouterr().err
    for bad, match in (({**base, "eval_context": 0}, "eval_context"), ({**base, "select_split": "nope"}, "nope")):
        grid.write_text(json.dumps(bad))
        assert main(["scaling", "--grid", str(grid), "--out", str(tmp_path / "o")]) == 2
        assert match in capsys.readouterr().err
        assert not list((tmp_path / "o").glob("a/C*.json"))


def test_interior_only_fits_the_envelope_on_interior_optima_alone(tmp_path):
    """With the grid's interior_only a budget whose optimum lies beyond its smallest size bounds L*
    and fits nothing: the envelope and the prediction leave it out."""
    from rltok.analysis.scaling import fit_corpus
    from rltok_lab.scaling_holdout import predict_corpus

    folder = tmp_path / "study" / "salad"
    synthetic_study(folder, [1e7, 3e7, 1e8, 3e8], [10000, 20000, 50000, 80000], [0, 1],
                    lambda c: 3e4 * (c / 1e8) ** 0.5)  # N* 9.5e3 at 1e7: below the smallest size
    loose = fit_corpus(folder, n_boot=20)["flat"].envelope
    assert 1e7 in loose.budgets and loose.non_interior == (1e7,)
    strict = fit_corpus(folder, n_boot=20, interior_only=True)["flat"].envelope
    assert list(strict.budgets) == [3e7, 1e8, 3e8] and 1e7 in strict.excluded
    assert json.loads((folder / "fits.json").read_text())["families"]["flat"]["envelope"]["excluded"] == [1e7]
    assert "left out: 1e+07" in (folder / "report.md").read_text()
    grid = parse_grid({"corpora": {"salad": "unused"}, "budgets": [1e7, 3e7, 1e8, 3e8], "holdout_budgets": [1e9],
                       "interior_only": True, "n_boot": 20, "families": [{"method": "flat", "sizes": [1e4]}]})
    assert grid.interior_only and predict_corpus(grid, folder)["flat"][repr(1e9)]["fitted_budgets"] == [3e7, 1e8, 3e8]
    with pytest.raises(ConfigError, match="interior_only"):
        parse_grid({"corpora": {"salad": "x"}, "budgets": [1e7], "interior_only": "yes",
                    "families": [{"method": "flat", "sizes": [1e4]}]})
    # fit_from: the envelopes and the prediction fit budgets from it up, interior or not below it
    grid = dataclasses.replace(grid, interior_only=False, fit_from=3e7)
    assert predict_corpus(grid, folder)["flat"][repr(1e9)]["fitted_budgets"] == [3e7, 1e8, 3e8]
    cut = fit_corpus(folder, n_boot=20, fit_from=3e7)["flat"]
    assert list(cut.envelope.budgets) == [3e7, 1e8, 3e8] and cut.envelope.excluded == (1e7,)
    assert set(cut.isofits) == {1e7, 3e7, 1e8, 3e8}  # the per-budget fits and tables keep every budget
    assert fit_corpus(folder, n_boot=20, fit_from=1e8)["flat"].envelope is None  # 2 budgets left
    assert parse_grid({"corpora": {"salad": "x"}, "budgets": [1e7], "fit_from": 3e11,
                       "families": [{"method": "flat", "sizes": [1e4]}]}).fit_from == 3e11
    with pytest.raises(ConfigError, match="fit_from"):
        parse_grid({"corpora": {"salad": "x"}, "budgets": [1e7], "fit_from": -1,
                    "families": [{"method": "flat", "sizes": [1e4]}]})


def test_with_a_selection_split_the_predicted_size_is_chosen_on_it_and_the_loss_stays_the_scored_splits(tmp_path):
    from rltok_lab.scaling_holdout import predict_corpus

    folder = tmp_path / "study" / "salad"
    budgets, sizes = [1e7, 3e7, 1e8, 3e8], [10000, 20000, 50000, 80000]
    synthetic_study(folder, budgets, sizes, [0, 1], lambda c: 3e4 * (c / 1e8) ** 0.5)
    for path in folder.glob("*.json"):  # the selection split's optimum sits at twice the scored split's
        r = json.loads(path.read_text())
        c, n = r["budget_flops"], r["non_embedding_params"]
        r["bpb_select"] = 1.6 + 40 * c ** -0.2 + 0.05 * math.log(n / (6e4 * (c / 1e8) ** 0.5)) ** 2
        path.write_text(json.dumps(r))
    spec = {"corpora": {"salad": "unused"}, "budgets": budgets, "holdout_budgets": [1e9], "n_boot": 20,
            "families": [{"method": "flat", "sizes": [1e4]}]}
    scored = predict_corpus(parse_grid(spec), folder)["flat"][repr(1e9)]
    chosen = predict_corpus(parse_grid({**spec, "select_split": "val"}), folder)["flat"][repr(1e9)]
    assert scored["n_star"] == pytest.approx(3e4 * 10 ** 0.5, rel=0.05) and "size_split" not in scored
    assert chosen["n_star"] == pytest.approx(6e4 * 10 ** 0.5, rel=0.05) and chosen["size_split"] == "val"
    assert chosen["n_star_scored_split"] == scored["n_star"] and chosen["l_star"] == scored["l_star"]


def test_the_centres_script_extrapolates_each_familys_optimum_to_a_new_budget(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "study"
    # N* = 1e4 (C / 1e8)^0.8: 1e4 at 1e8, 2.41e4 at 3e8; the line gives 5.81e4 at 9e8
    synthetic_study(out / "salad", [1e8, 3e8], [2500, 5000, 10000, 20000, 40000, 80000], [0, 1],
                    lambda c: 1e4 * (c / 1e8) ** 0.8)
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"corpora": {"salad": "unused"}, "budgets": [1e8, 3e8, 9e8],
                                "size_rule": {"coef": 1.0, "exponent": 0.5, "span": 2, "points": 3},
                                "families": [{"method": "flat"}]}))
    proc = subprocess.run([sys.executable, str(repo / "scripts" / "scaling_centres.py"), "--grid", str(grid), "--out",
                           str(out), "--from", "1e8", "3e8", "--at", "9e8"], capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| flat | salad"))
    line_at = float(row.rsplit("|", 2)[1].replace(",", ""))
    assert line_at == pytest.approx(1e4 * 9 ** 0.8, rel=0.05)
    snippet = next(line for line in proc.stdout.splitlines() if line.startswith("flat: centres"))
    centre = float(snippet.split("=")[-1].strip(" }"))
    assert centre == pytest.approx(line_at, rel=0.01)
    # the suggestion parses as the grid key, and moves only that budget's window
    spec = json.loads(grid.read_text())
    spec["families"][0]["centres"] = {"9e8": centre}
    assert parse_grid(spec).families[0].centre_at(9e8) == centre


def test_status_counts_runs_per_budget_and_estimates_the_time_left(tmp_path, capsys):
    from rltok.analysis.scaling_adapt import run_grid
    from rltok_lab.scaling_status import status_table, study_status

    data = corpus_folder(tmp_path, "salad")
    spec = {"corpora": [str(data)], "budgets": [1e8, 3e8], "seeds": [0, 1], "preset": "test", "optimum_seeds": [2],
            "size_rule": {"coef": 1.0, "exponent": 0.5, "span": 2, "points": 3}, "extend": 3,
            "families": [{"method": "flat"}]}
    grid = parse_grid(spec)
    known, _ = known_loss_runner(lambda c: 5e4 if c < 2e8 else 1.2e4)

    def timed(grid_, p, folder, split):  # each run "took" 10 s at 1e8 and 30 s at 3e8
        return {**known(grid_, p, folder, split), "point_wall_s": 10.0 if p.budget < 2e8 else 30.0}

    out = tmp_path / "study"
    run_grid(grid, out, log=lambda m: None, runner=timed)
    rows = {r["budget"]: r for r in study_status(grid, out)}
    low, high = rows[1e8], rows[3e8]
    # 1e8: its 6 ladder points, two extensions of 2 seeds, one optimum seed (as the extension test finds)
    assert (low["ladder_done"], low["ladder_total"], low["done"]["extension"], low["done"]["optimum"]) == (6, 6, 4, 1)
    assert low["complete"] and low["left_hours"] == 0.0 and low["mean_s"] == 10.0
    assert high["complete"] and high["done"]["extension"] == 0
    # two ladder runs and the optimum seed of 3e8 lost: not complete, 3 runs left at 30 s, ladder x (11 / 6)
    for stem in sorted(p.stem for p in (out / "salad").glob("C3e08__*.json"))[:2]:
        (out / "salad" / f"{stem}.json").unlink()
    for p in (out / "salad").glob("C3e08__*__s2.json"):
        p.unlink()
    rows = {r["budget"]: r for r in study_status(grid, out)}
    high = rows[3e8]
    assert not high["complete"] and high["ladder_done"] == 4 and high["runs"] == 4
    assert high["adaptive_ratio"] == pytest.approx(11 / 6)
    assert high["left_hours"] == pytest.approx((6 * 11 / 6 - 4) * 30 / 3600)
    table = status_table(list(rows.values()))
    assert "| salad | C3e08 | 4/6 | 0 | 0 | 0 | no | 30 |" in table and "x1.83" in table
    # a budget not started: its runs cost the budget below's, times the budget ratio
    later = parse_grid({**spec, "budgets": [1e8, 3e8, 9e8]})
    rows = {r["budget"]: r for r in study_status(later, out)}
    assert rows[9e8]["runs"] == 0 and not rows[9e8]["complete"]
    assert rows[9e8]["left_hours"] == pytest.approx(6 * 11 / 6 * (30 * 3) / 3600)
    # a family added to the grid under way: no budget is complete any more (its ladder alone is
    # counted), and its runs cost the other families' mean at each budget
    with_late = spec["families"] + [{"method": "flat", "name": "late", "lr_mult": 2}]
    rows = {r["budget"]: r for r in study_status(parse_grid({**spec, "families": with_late}), out)}
    assert not rows[1e8]["complete"] and rows[1e8]["adaptive_ratio"] is None
    assert rows[1e8]["left_hours"] == pytest.approx(6 * 10.0 / 3600)
    assert rows[3e8]["left_hours"] == pytest.approx((6 - 4 + 6) * 30.0 / 3600)
    three = parse_grid({**spec, "budgets": [1e8, 3e8, 9e8], "families": with_late})
    rows = {r["budget"]: r for r in study_status(three, out)}
    assert rows[9e8]["left_hours"] == pytest.approx(2 * 6 * (30 * 3) / 3600)  # neither family has a run there
    # the data gone: the runs are still counted, completeness cannot be told
    gone = parse_grid({**spec, "corpora": {"salad": str(tmp_path / "moved")}})
    rows = {r["budget"]: r for r in study_status(gone, out)}
    assert rows[1e8]["complete"] is None and rows[1e8]["runs"] == 11
    assert "? (no data)" in status_table(list(rows.values()))
    # the CLI prints the same table and trains nothing
    gfile = tmp_path / "grid.json"
    gfile.write_text(json.dumps(spec))
    n = len(list((out / "salad").glob("*.json")))
    assert main(["scaling", "--grid", str(gfile), "--out", str(out), "--status"]) == 0
    assert "| salad | C1e08 | 6/6 | 4 | 1 | 0 | yes | 10 |" in capsys.readouterr().out
    assert len(list((out / "salad").glob("*.json"))) == n


def test_status_creates_no_folder(tmp_path, capsys):
    """`study --status` only reads: no results folder, no corpus folder, whether --out exists or not."""
    data = corpus_folder(tmp_path, "salad")
    gfile = tmp_path / "grid.json"
    gfile.write_text(json.dumps({"corpora": [str(data)], "budgets": [1e8, 3e8], "seeds": [0], "preset": "test",
                                 "families": [{"method": "flat", "sizes": [5e3, 2e4]}], "holdout_budgets": [1e9]}))
    out = tmp_path / "study"
    for exists in (False, True):
        if exists:
            out.mkdir()
        before = sorted(tmp_path.rglob("*"))
        assert lab_main(["study", "--grid", str(gfile), "--out", str(out), "--status"]) == 0
        assert "| salad | C1e08 | 0/2 | 0 | 0 | 0 | no |" in capsys.readouterr().out
        assert sorted(tmp_path.rglob("*")) == before


def test_status_counts_the_held_out_runs_once_the_prediction_exists(tmp_path, capsys):
    from rltok_lab.scaling_holdout import holdout_points
    from rltok_lab.scaling_status import holdout_status, holdout_table

    data = corpus_folder(tmp_path, "salad")
    spec = {"corpora": {"salad": str(data)}, "budgets": [1e8, 3e8], "holdout_budgets": [9e8],
            "holdout_seeds": [0, 1, 2], "preset": "test", "families": [{"method": "flat", "sizes": [1e4, 2e4]}]}
    grid = parse_grid(spec)
    out = tmp_path / "study"
    folder = out / "salad"
    folder.mkdir(parents=True)
    assert holdout_status(grid, out) == []  # no prediction yet: nothing to count
    for n in (1e4, 2e4):  # the largest budget's runs took 30 s each
        (folder / f"{budget_tag(3e8)}__flat__N{n:.0f}__s0.json").write_text(json.dumps(
            {"family": "flat", "budget_flops": 3e8, "seed": 0, "non_embedding_params": n, "bpb": 3.0,
             "point_wall_s": 30.0, "point_kind": "ladder"}))
    pred = {"commit": "abc", "corpora": {"salad": {"flat": {repr(9e8): {"n_star": 2e4, "l_star": 2.5}}}}}
    (out / "prediction.json").write_text(json.dumps(pred))
    points = holdout_points(grid, pred, log=lambda m: None)
    assert len(points) == 3
    (row,) = holdout_status(grid, out)
    # none run: three at 30 s x (9e8 / 3e8)
    assert (row["planned"], row["done"], row["mean_s"]) == (3, 0, None)
    assert row["left_hours"] == pytest.approx(3 * 90 / 3600)
    (folder / f"{points[0].stem}.json").write_text(json.dumps(
        {"family": "flat", "budget_flops": 9e8, "seed": 0, "non_embedding_params": 2e4, "bpb": None,
         "point_wall_s": 50.0, "point_kind": "holdout"}))
    (row,) = holdout_status(grid, out)
    # one run, diverged (it stopped early: its time says nothing of a finished run's): two left at
    # the largest budget's mean times the ratio
    assert (row["done"], row["diverged"], row["mean_s"]) == (1, 1, 50.0)
    assert row["left_hours"] == pytest.approx(2 * 90 / 3600)
    (folder / f"{points[1].stem}.json").write_text(json.dumps(
        {"family": "flat", "budget_flops": 9e8, "seed": 1, "non_embedding_params": 2e4, "bpb": 2.6,
         "point_wall_s": 70.0, "point_kind": "holdout"}))
    (row,) = holdout_status(grid, out)
    # a finished held-out run: the one left costs its time
    assert (row["done"], row["diverged"], row["mean_s"]) == (2, 1, 60.0)
    assert row["left_hours"] == pytest.approx(70 / 3600)
    assert "| salad | C9e08 | 2/3 | 1 | 60 | 0.03 | 0.0 h |" in holdout_table([row])
    gfile = tmp_path / "grid.json"
    gfile.write_text(json.dumps(spec))
    assert main(["scaling", "--grid", str(gfile), "--out", str(out), "--status"]) == 0
    assert "| salad | C9e08 | 2/3 | 1 | 60 |" in capsys.readouterr().out


def test_a_runs_curve_is_read_at_a_share_of_its_flops():
    from rltok_lab.run_curve import curve_at

    rec = {"budget_flops": 1e9, "curve": _curve(1e9, [3.0, 2.0, 1.0], shares=[0.2, 0.6, 1.0])}
    assert curve_at(rec, 0.4) == pytest.approx(2.5)  # halfway between the first two evaluations
    assert curve_at(rec, 0.19) == 3.0 and curve_at(rec, 1.01) == 1.0  # within 0.02 of an end: that end
    assert curve_at(rec, 0.1) is None  # before the curve: no guess
    assert curve_at({"budget_flops": 1e9}, 0.5) is None and curve_at({"budget_flops": 1e9, "curve": []}, 0.5) is None
    # an evaluation without a val loss is skipped
    rec["curve"].insert(1, {"step": 15, "train_flops": 0.4e9, "val_bpb": None})
    assert curve_at(rec, 0.4) == pytest.approx(2.5)


def test_a_group_is_predicted_and_scored_as_its_best_member(tmp_path):
    """A group's envelope fits its best member per budget (chosen on the selection split, as the
    report's); at the held-out budget its prediction is scored against the member that is best
    there among the families' held-out runs."""
    from rltok_lab.scaling_holdout import run_holdout, score_table, write_prediction

    data = corpus_folder(tmp_path, "salad")
    out = tmp_path / "study"
    folder = out / "salad"
    folder.mkdir(parents=True)
    law = {"a": lambda c: 1.5 + 40 * c ** -0.2, "b": lambda c: 1.6 + 40 * c ** -0.2}  # a is the better family
    n_star = lambda c: 2e4 * (c / 1e8) ** 0.5  # noqa: E731

    def loss(fam, c, n, s):
        return law[fam](c) + 0.05 * math.log(n / n_star(c)) ** 2 + 0.002 * (s - 0.5)

    for fam in law:
        for c in (1e7, 3e7, 1e8):
            for n in (2500, 5000, 10000, 20000, 50000, 80000):
                for s in (0, 1):
                    rec = {"family": fam, "budget_flops": c, "target_size": n, "non_embedding_params": n, "seed": s,
                           "bpb": loss(fam, c, n, s), "bpb_select": loss(fam, c, n, s), "split": "test",
                           "point_kind": "ladder"}
                    (folder / f"{budget_tag(c)}__{fam}__N{n}__s{s}.json").write_text(json.dumps(rec))
    grid = parse_grid({"corpora": {"salad": str(data)}, "budgets": [1e7, 3e7, 1e8], "holdout_budgets": [5e8],
                       "holdout_seeds": [0, 1], "preset": "test", "n_boot": 50, "groups": {"best": ["a", "b"]},
                       "crossovers": [["a", "b"], ["best", "b"]],
                       "families": [{"name": fam, "method": "flat", "sizes": [2500, 5000, 10000, 20000, 50000, 80000]}
                                    for fam in law]})
    write_prediction(grid, out, log=lambda m: None)
    pred = json.loads((out / "prediction.json").read_text())["corpora"]["salad"]
    assert set(pred) == {"a", "b", "best"}
    assert pred["best"][repr(5e8)]["l_star"] == pytest.approx(pred["a"][repr(5e8)]["l_star"], abs=1e-6)

    def run(grid_, p, folder_, split):  # the held-out runs follow the same law
        n = p.rung.achieved
        bpb = loss(p.family.name, p.budget, n, p.seed)
        return {"family": p.family.name, "budget_flops": p.budget, "target_size": p.rung.target, "seed": p.seed,
                "non_embedding_params": n, "bpb": bpb, "bpb_select": bpb, "split": split, "wall_s": 0.0,
                "point_kind": p.kind}

    scores, paired = run_holdout(grid, out, log=lambda m: None, runner=run)
    by = {s["family"]: s for s in scores}
    assert set(by) == {"a", "b", "best"} and by["best"]["member"] == "a"
    assert by["best"]["measured"] == pytest.approx(by["a"]["measured"]) and by["best"]["seeds"] == [0, 1]
    assert abs(by["best"]["error"]) < 0.02 and by["best"]["baseline_error"] is not None
    assert "| salad | best (a) | 5e+08 |" in score_table(scores) and by["best"]["members_run"] == ["a", "b"]
    # the grid's pairs at the held-out budget, each side at its predicted size, paired by seed: a is
    # 0.1 below b by its law (its size's excess over the optimum is tiny), the group is a
    rows = {(r["a"], r["b"]): r for r in paired["salad"]}
    assert set(rows) == {("a", "b"), ("best", "b")} and all(r["budget"] == 5e8 for r in rows.values())
    assert rows["a", "b"]["difference"]["seeds"] == [0, 1]
    assert rows["a", "b"]["difference"]["mean"] == pytest.approx(-0.1, abs=0.01)
    assert rows["best", "b"]["difference"]["mean"] == pytest.approx(rows["a", "b"]["difference"]["mean"])
    assert json.loads((out / "prediction_score.json").read_text())["paired"]["salad"] == paired["salad"]
    assert (out / "prediction_score.png").stat().st_size > 0  # predicted against measured, per family
    # a member's diverged seed is counted against the group; a group whose members all diverged keeps its row
    from rltok_lab.scaling_holdout import holdout_points, score_holdout

    held = sorted(folder.glob("C5e08__*__s*.json"))
    points = holdout_points(grid, json.loads((out / "prediction.json").read_text()), log=lambda m: None)
    saved = {f: f.read_text() for f in held}
    for f in held:
        if "__a__" in f.name and f.name.endswith("__s1.json"):
            f.write_text(json.dumps({**json.loads(saved[f]), "bpb": None, "bpb_select": None}))
    by = {s["family"]: s for s in score_holdout(grid, out, points, json.loads((out / "prediction.json").read_text()))}
    assert by["best"]["member"] == "a" and by["best"]["seeds"] == [0] and by["best"]["diverged_seeds"] == 1
    for f in held:
        f.write_text(json.dumps({**json.loads(saved[f]), "bpb": None, "bpb_select": None}))
    by = {s["family"]: s for s in score_holdout(grid, out, points, json.loads((out / "prediction.json").read_text()))}
    assert by["best"]["measured"] is None and by["best"]["diverged_seeds"] == 4 and by["best"]["member"] is None
    for f, text in saved.items():
        f.write_text(text)
    # a forecast of a ladder budget covers the group too, scored against its best member's fit there
    from rltok_lab.scaling_holdout import forecast_grid, forecast_table, prediction_name, score_forecast

    grid3 = dataclasses.replace(grid, budgets=(1e7, 3e7, 1e8, 3e8), holdout_budgets=(5e8,))
    for f in folder.glob("C5e08__*"):  # the held-out runs of above, not part of this forecast's study
        f.unlink() if f.is_file() else shutil.rmtree(f)
    write_prediction(forecast_grid(grid3, [3e8]), out, log=lambda m: None, name=prediction_name([3e8]))
    forecast = json.loads((out / prediction_name([3e8])).read_text())
    for fam in law:
        for n in (5000, 10000, 20000, 50000, 80000):
            for s in (0, 1):
                rec = {"family": fam, "budget_flops": 3e8, "target_size": n, "non_embedding_params": n, "seed": s,
                       "bpb": loss(fam, 3e8, n, s), "bpb_select": loss(fam, 3e8, n, s), "split": "test",
                       "point_kind": "ladder"}
                (folder / f"{budget_tag(3e8)}__{fam}__N{n}__s{s}.json").write_text(json.dumps(rec))
    rows = {r["family"]: r for r in score_forecast(grid3, out, [3e8], forecast)}
    assert set(rows) == {"a", "b", "best"} and rows["best"]["member"] == "a" and rows["a"]["member"] is None
    assert rows["best"]["l_star"] == pytest.approx(rows["a"]["l_star"]) and abs(rows["best"]["error"]) < 0.02
    assert "| salad | best (a) | C3e08 |" in forecast_table(list(rows.values()))


def test_held_out_paired_rows_of_other_corpora_are_kept_and_the_cli_prints_them(tmp_path, monkeypatch, capsys):
    import rltok_lab.scaling_holdout as holdout

    spec = {"corpora": {"a": str(corpus_folder(tmp_path, "a")), "b": str(corpus_folder(tmp_path, "b"))},
            "budgets": [1e8], "holdout_budgets": [1e9], "preset": "test", "crossovers": [["f", "g"]],
            "families": [{"name": n, "method": "flat", "sizes": [5e3]} for n in ("f", "g")]}
    grid = parse_grid(spec)
    out = tmp_path / "o"
    out.mkdir()
    row = {"a": "f", "b": "g", "budget": 1e9, "size_a": 5e3, "size_b": 5e3, "reason": None, "verdict": "a better",
           "difference": {"mean": -0.1, "lo": -0.2, "hi": -0.05, "sd": 0.02, "seeds": [0, 1, 2]}}
    # each corpus's process writes its part; neither drops the other's scores or paired rows
    for corpus in ("a", "b"):
        one = dataclasses.replace(grid, corpora={corpus: grid.corpora[corpus]})
        holdout._write_scores(out / holdout.SCORE, one, {"commit": "abc"}, [{"corpus": corpus, "family": "f"}],
                              {corpus: [{**row, "difference": {**row["difference"], "mean": -0.1 if corpus == "a"
                                                               else -0.3}}]})
    written = json.loads((out / holdout.SCORE).read_text())
    assert [s["corpus"] for s in written["scores"]] == ["a", "b"] and set(written["paired"]) == {"a", "b"}
    assert written["paired"]["b"][0]["difference"]["mean"] == -0.3
    # the CLI prints the held-out budget's paired table after the scores
    gfile = tmp_path / "grid.json"
    gfile.write_text(json.dumps(spec))
    monkeypatch.setattr(holdout, "run_holdout", lambda g, o, log: ([], {"a": [row]}))
    assert main(["scaling", "--grid", str(gfile), "--out", str(out), "--holdout"]) == 0
    printed = capsys.readouterr().out
    assert "At 1e+09 FLOPs, each side at its predicted size" in printed
    assert "| f − g | -0.100 [-0.200, -0.050] (3) | –" in printed


def test_a_held_out_pair_whose_one_side_all_diverged_keeps_a_row_that_says_so(tmp_path):
    from rltok_lab.scaling_holdout import holdout_paired

    grid = parse_grid({"corpora": {"a": "x"}, "budgets": [1e8], "holdout_budgets": [1e9], "preset": "test",
                       "crossovers": [["f", "g"], ["f", "h"]],
                       "families": [{"name": n, "method": "flat", "sizes": [5e3]} for n in ("f", "g", "h")]})
    folder = tmp_path / "a"
    folder.mkdir()
    for fam, bpb in (("f", 2.0), ("g", None)):  # h never ran at 1e9: no row for f − h
        for s in (0, 1):
            (folder / f"{budget_tag(1e9)}__{fam}__N5000__s{s}.json").write_text(json.dumps(
                {"family": fam, "budget_flops": 1e9, "target_size": 5e3, "seed": s, "non_embedding_params": 5e3,
                 "bpb": bpb, "bpb_select": bpb}))
    (row,) = holdout_paired(grid, folder)
    assert (row["a"], row["b"], row["difference"]) == ("f", "g", None)
    assert row["reason"] == "g: every held-out seed diverged"
    for s in (0, 1):  # g finished after all: a paired row
        (folder / f"{budget_tag(1e9)}__g__N5000__s{s}.json").write_text(json.dumps(
            {"family": "g", "budget_flops": 1e9, "target_size": 5e3, "seed": s, "non_embedding_params": 5e3,
             "bpb": 2.5, "bpb_select": 2.5}))
    (row,) = holdout_paired(grid, folder)
    assert row["difference"]["mean"] == pytest.approx(-0.5) and row["difference"]["seeds"] == [0, 1]


def test_the_prediction_plot_draws_what_a_score_has_and_nothing_without_a_prediction(tmp_path):
    from rltok_lab.study_plots import plot_prediction_scores

    pytest.importorskip("matplotlib")
    rows = [{"corpus": "a", "family": "f", "prediction": {"l_star": 2.0, "l_star_interval": [1.9, 2.2]},
             "measured": 2.05, "measured_interval": [2.0, 2.1]},
            {"corpus": "a", "family": "g", "prediction": {"l_star": 2.5, "l_star_interval": [None, None]},
             "measured": None, "measured_interval": None},  # no interval, every seed diverged
            {"corpus": "b", "family": "best", "member": "f", "prediction": {"l_star": 1.5, "l_star_interval": [1.4, 1.6]},
             "measured": 1.7, "measured_interval": [1.6, 1.8]}]
    path = plot_prediction_scores(rows, tmp_path / "p.png", "C1e09")
    assert path == tmp_path / "p.png" and path.stat().st_size > 0
    assert plot_prediction_scores([{"corpus": "a", "family": "f", "prediction": {"l_star": None}}],
                                  tmp_path / "q.png") is None and not (tmp_path / "q.png").exists()


def test_a_held_out_runs_time_is_estimated_at_its_own_size_not_at_the_ladders_mean(tmp_path):
    from rltok_lab.scaling_holdout import holdout_points
    from rltok_lab.scaling_status import holdout_status, per_flop_seconds

    data = corpus_folder(tmp_path, "salad")
    spec = {"corpora": {"salad": str(data)}, "budgets": [3e8], "holdout_budgets": [9e8],
            "holdout_seeds": [0, 1], "preset": "test", "families": [{"method": "flat", "sizes": [1e4, 4e4]}]}
    grid = parse_grid(spec)
    out = tmp_path / "study"
    folder = out / "salad"
    folder.mkdir(parents=True)
    for n, seconds in ((1e4, 20.0), (4e4, 80.0)):  # time per FLOP in proportion to N
        (folder / f"{budget_tag(3e8)}__flat__N{n:.0f}__s0.json").write_text(json.dumps(
            {"family": "flat", "budget_flops": 3e8, "seed": 0, "non_embedding_params": n, "bpb": 3.0,
             "point_wall_s": seconds, "point_kind": "ladder"}))
    # a learning-rate check at the same budget took far longer: it is not the family's time
    (folder / f"{budget_tag(3e8)}__flat__N40000__s9.json").write_text(json.dumps(
        {"family": "flat", "budget_flops": 3e8, "seed": 9, "non_embedding_params": 4e4, "bpb": 3.0,
         "point_wall_s": 5000.0, "point_kind": "check"}))
    pred = {"commit": "abc", "corpora": {"salad": {"flat": {repr(9e8): {"n_star": 2e4, "l_star": 2.5}}}}}
    (out / "prediction.json").write_text(json.dumps(pred))
    points = holdout_points(grid, pred, log=lambda m: None)
    n = points[0].rung.achieved
    (row,) = holdout_status(grid, out)
    # 20 s at N 1e4 and 80 s at 4e4 on 3e8 FLOPs: 20 s x (n / 1e4) x 3 per held-out run
    assert row["left_hours"] == pytest.approx(2 * 20.0 * (n / 1e4) * 3 / 3600)
    assert row["left_hours"] != pytest.approx(2 * 50.0 * 3 / 3600)  # not the ladder's mean times the ratio
    fit = per_flop_seconds([{"non_embedding_params": 1e4, "point_wall_s": 20.0}], 3e8)
    assert fit is None  # one size: no fit, the mean decides
