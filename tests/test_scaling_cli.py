"""`rltok scaling`: a tiny grid runs end to end (a JSON per run with the study's fields), a
second invocation skips every finished point, and the fit writes fits.json and the plots."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shutil

import pytest

from conftest import corpus_folder
from rltok.analysis.scaling import budget_tag, load_grid, parse_grid, read_records
from rltok.cli import main
from rltok.config import ConfigError, load_config

GRID = """
budgets = [1e8, 5e8]
seeds = [0]
split = "test"
preset = "test"
max_eval_windows = 2
n_boot = 50

[corpora]
salad = "{data}"

[[families]]
method = "flat"
n_min = 5e3
n_max = 5e4
points = 3

[[families]]
name = "uniform_w16"
method = "uniform"
overrides = ["model.window=16"]
sizes = [2e4, 5e4, 1.2e5]
"""


def test_a_tiny_grid_runs_resumes_and_fits(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(data=corpus_folder(tmp_path, "salad")))
    out = tmp_path / "study"
    assert main(["scaling", "--grid", str(grid), "--out", str(out)]) == 0
    runs = sorted((out / "salad").glob("C*.json"))
    assert len(runs) == 2 * 2 * 3  # budgets x families x sizes x seeds
    recs = [json.loads(p.read_text()) for p in runs]
    assert {r["family"] for r in recs} == {"flat", "uniform_w16"}
    for r in recs:
        assert r["split"] == "test" and r["seed"] == 0 and r["budget_flops"] in (1e8, 5e8)
        assert r["non_embedding_params"] == r["ladder_params"] < r["params"]  # the trained model's own N
        assert r["train_flops"] >= 0.5 * r["budget_flops"]  # a few steps: the last one may overshoot
        assert r["point_wall_s"] > r["wall_s"] > 0  # the whole point: its evaluations too
    assert len({(r["family"], r["non_embedding_params"]) for r in recs}) == 6
    assert (out / "salad" / "C1e08__flat__N5000__s0.json").exists()
    err = capsys.readouterr().err
    assert "12 points: 0 done already, 12 to run" in err

    assert main(["scaling", "--grid", str(grid), "--out", str(out)]) == 0  # everything is there
    captured = capsys.readouterr()
    assert "12 points: 12 done already, 0 to run" in captured.err
    assert "training" not in captured.err and "[1/" not in captured.err
    fits = json.loads((out / "salad" / "fits.json").read_text())["families"]
    assert set(fits) == {"flat", "uniform_w16"}
    assert set(fits["flat"]["isofits"]) == {repr(1e8), repr(5e8)}
    assert (out / "salad" / "inference_salad.png").exists() and "(inference_salad.png)" in \
        (out / "salad" / "report.md").read_text()
    assert {p.name for p in (out / "salad").glob("*.png")} >= {"isoflop_flat.png", "isoflop_uniform_w16.png"}
    assert "| flat | 1e+08 |" in captured.out and ("interior" in captured.out or "extend" in captured.out)


def test_fit_only_trains_nothing_and_bad_grids_are_one_error(tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"corpora": [str(corpus_folder(tmp_path, "salad"))], "budgets": [1e8],
                                "families": [{"method": "flat", "sizes": [5e3]}]}))
    assert load_grid(grid).corpora == {"salad": str(tmp_path / "salad")}
    assert main(["scaling", "--grid", str(grid), "--out", str(tmp_path / "o"), "--fit-only"]) == 0
    assert "no runs yet" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown key"):
        parse_grid({"corpora": ["x"], "budgets": [1], "families": [{"method": "flat", "sizes": [1]}], "seed": 1})
    with pytest.raises(ConfigError, match="families\\[0\\]"):
        parse_grid({"corpora": ["x"], "budgets": [1], "families": [{"method": "flat"}]})
    with pytest.raises(ConfigError, match="overrides"):
        parse_grid({"corpora": ["x"], "budgets": [1], "families": [{"method": "flat@model.d_chunk=16", "sizes": [1]}]})
    with pytest.raises(ConfigError, match="name"):
        parse_grid({"corpora": ["x"], "budgets": [1], "families": [{"name": "a__b", "method": "flat", "sizes": [1]}]})
    assert budget_tag(1e8) == "C1e08" and budget_tag(3.162e14) == "C3.162e14"


def test_the_gpu_grid_file_parses_and_names_known_methods():
    from pathlib import Path

    from rltok.analysis.compare import method_overrides
    from rltok.analysis.scaling_grid import family_sizes

    grid = load_grid(Path(__file__).resolve().parents[1] / "scripts" / "scaling_gpu_grid.toml")
    assert min(grid.budgets) == 1e15 and max(grid.budgets) == 1e18 and grid.holdout_budgets == (3e18,)
    for fam in grid.families:
        assert method_overrides(fam.method)
        assert len(family_sizes(grid, fam, 1e15)) == 5 and family_sizes(grid, fam, 1e18)[0] > family_sizes(grid, fam, 1e15)[-1]
    assert grid.groups["hierarchy"] == ("uniform", "whitespace", "rl")
    assert ("bytes", "bpe_token") in grid.crossovers
    # under "wsd" a size of one budget goes on from the previous budget's run of the same model
    from rltok.analysis.scaling import budget_ladders

    assert grid.branches and grid.cooldown_frac == 0.2
    ladders = budget_ladders(grid, grid.families[0], grid.budgets[:2], log=lambda m: None)
    shapes = [{tuple(r.overrides) for r in ladders[b]} for b in grid.budgets[:2]]
    assert len(shapes[0] & shapes[1]) == 4  # as the grid file's comment counts


# ---------------------------------------------------------------- the study's rules

RULES = {"corpora": ["x"], "budgets": [1e8, 1e10], "size_rule": {"coef": 1.0, "exponent": 0.5, "span": 4, "points": 5},
         "lr_rule": {"lr_ref": 1e-3, "n_ref": 1e4, "exponent": 0.5}, "warmup_frac": 0.1,
         "families": [{"method": "flat"}, {"name": "uniform_x4", "method": "uniform", "size_coef": 4.0, "lr_mult": 0.5},
                      {"name": "own", "method": "flat", "sizes": [1e3, 4e3, 1.6e4]}]}


def test_size_windows_per_budget_and_the_lr_rule_parse():
    from rltok.analysis.scaling_grid import family_sizes, point_lr, run_base, step_ratio

    grid = parse_grid(RULES)
    flat, uniform, own = grid.families
    assert family_sizes(grid, flat, 1e8) == [2500, 5000, 10000, 20000, 40000]  # 1e4 / 4 .. 1e4 * 4
    assert family_sizes(grid, flat, 1e10) == [25000, 50000, 100000, 200000, 400000]
    assert family_sizes(grid, uniform, 1e8) == [10000, 20000, 40000, 80000, 160000]  # its own coef
    assert family_sizes(grid, own, 1e8) == family_sizes(grid, own, 1e10) == [1e3, 4e3, 1.6e4]
    assert step_ratio(grid, flat) == pytest.approx(2.0) and step_ratio(grid, own) == pytest.approx(4.0)
    assert point_lr(grid, flat, 4e4) == pytest.approx(1e-3 / 2) and point_lr(grid, uniform, 1e4) == pytest.approx(5e-4)
    assert run_base(grid, uniform)[0] == "train.warmup_frac=0.1"
    plain = parse_grid({k: v for k, v in RULES.items() if k != "lr_rule"})
    assert point_lr(plain, plain.families[0], 4e4) is None  # the preset's lr, nothing added
    assert point_lr(plain, plain.families[1], 4e4) == pytest.approx(0.5 * load_config("tiny").train.lr)
    for bad, match in (({**RULES, "size_rule": {"coef": 1, "exponent": 0.5, "span": 4}}, "missing points"),
                       ({**RULES, "lr_rule": {"lr_ref": 1, "n_ref": 1, "exponent": 0, "x": 1}}, "unknown key"),
                       ({**RULES, "holdout_budgets": [1e8]}, "differ"),
                       ({**RULES, "warmup_frac": 1.5}, "warmup_frac"),
                       ({k: v for k, v in RULES.items() if k != "size_rule"}, "size_rule")):
        with pytest.raises(ConfigError, match=match):
            parse_grid(bad)


def known_loss_runner(n_star):
    """A stand-in for run_point: bpb a parabola in ln N with its minimum at n_star(budget), a
    small offset per seed; the record fields the study reads."""
    import math

    calls = []

    def run(grid, p, folder, split):
        calls.append(p.stem)
        n = p.rung.achieved
        bpb = 2.0 + 0.05 * math.log(n / n_star(p.budget)) ** 2 + 0.001 * p.seed
        return {"family": p.family.name, "budget_flops": p.budget, "target_size": p.rung.target, "seed": p.seed,
                "non_embedding_params": n, "bpb": bpb, "split": split, "wall_s": 0.0, "point_kind": p.kind}
    return run, calls


def test_ladders_extend_until_interior_then_the_optimum_gets_more_seeds(tmp_path):
    from rltok.analysis.scaling_adapt import run_grid

    data = corpus_folder(tmp_path, "salad")
    grid = parse_grid({"corpora": [str(data)], "budgets": [1e8], "seeds": [0, 1], "preset": "test",
                       "size_rule": {"coef": 1.0, "exponent": 0.5, "span": 2, "points": 3}, "extend": 3,
                       "optimum_seeds": [2], "families": [{"method": "flat"}]})
    run, calls = known_loss_runner(lambda c: 5e4)  # the window is 5e3..2e4: the optimum lies above it
    out = tmp_path / "study"
    result = run_grid(grid, out, log=lambda m: None, runner=run)
    recs = read_records(out / "salad")
    ext = sorted({r["target_size"] for r in recs if r["point_kind"] == "extension"})
    assert ext == [40000, 80000]  # one step (2x) at a time, until the best size is inside the ladder
    assert result["ran"] == 6 and result["added"] == 2 * 2 + 1
    best = [r for r in recs if r["point_kind"] == "optimum"]
    assert len(best) == 1 and best[0]["seed"] == 2 and best[0]["target_size"] == 40000  # N 45,536: nearest 5e4
    n_calls = len(calls)
    assert run_grid(grid, out, log=lambda m: None, runner=run)["added"] == 0 and len(calls) == n_calls
    (out / "salad" / "C1e08__flat__N80000__s1.json").unlink()  # an extension interrupted after one seed
    assert run_grid(grid, out, log=lambda m: None, runner=run)["added"] == 1
    assert calls[-1] == "C1e08__flat__N80000__s1"
    limited = dataclasses.replace(grid, extend=1)
    shutil.rmtree(out)
    run_grid(limited, out, log=lambda m: None, runner=run)
    assert sorted({r["target_size"] for r in read_records(out / "salad") if r["point_kind"] == "extension"}) == [40000]


def test_holdout_overrides_reach_the_held_out_runs_only_and_set_only_how_they_compute(tmp_path):
    from rltok.analysis.scaling import Point, family_rungs, point_base

    data = corpus_folder(tmp_path, "salad")
    spec = {"corpora": [str(data)], "budgets": [1e8], "holdout_budgets": [1e9], "preset": "test",
            "families": [{"method": "flat", "sizes": [5e3]}], "holdout_overrides": ["train.optimizer_kernel=fused"]}
    grid = parse_grid(spec)
    fam = grid.families[0]
    rung = family_rungs(grid, fam, [5e3])[5000]
    ladder, held = Point("salad", 1e8, fam, rung, 0), Point("salad", 1e9, fam, rung, 0, "holdout")
    assert "train.optimizer_kernel=fused" not in point_base(grid, ladder)
    assert point_base(grid, held)[-1] == "train.optimizer_kernel=fused"
    assert load_config("test", overrides=point_base(grid, held)).train.optimizer_kernel == "fused"
    for bad in (["train.lr=0.1"], ["model.d_chunk=8"], "train.threads=1", ["train.threads"]):
        with pytest.raises(ConfigError, match="holdout_overrides"):
            parse_grid({**spec, "holdout_overrides": bad})


def test_a_run_whose_evaluation_gives_nan_is_recorded_as_diverged(tmp_path):
    from rltok.analysis.scaling_adapt import run_grid

    data = corpus_folder(tmp_path, "salad")
    grid = parse_grid({"corpora": [str(data)], "budgets": [1e8], "seeds": [0, 1], "preset": "test",
                       "size_rule": {"coef": 1.0, "exponent": 0.5, "span": 2, "points": 3},
                       "families": [{"method": "flat"}]})
    run, _ = known_loss_runner(lambda c: 1e4)

    def nan_once(grid, p, folder, split):
        rec = run(grid, p, folder, split)
        return {**rec, "bpb": math.nan} if p.seed == 1 and p.rung.target == 10000 else rec
    out = tmp_path / "study"
    run_grid(grid, out, log=lambda m: None, runner=nan_once)
    bad = [r for r in read_records(out / "salad") if r.get("diverged")]
    assert len(bad) == 1 and bad[0]["bpb"] is None and "non-finite bpb" in bad[0]["diverged"]
    assert "NaN" not in (out / "salad" / "C1e08__flat__N10000__s1.json").read_text()


def test_verdict_seeds_add_seeds_at_the_best_size_of_the_families_and_budgets_named(tmp_path):
    from rltok.analysis.scaling_adapt import run_grid

    data = corpus_folder(tmp_path, "salad")
    spec = {"corpora": [str(data)], "budgets": [1e8, 3e8], "seeds": [0, 1], "preset": "test", "optimum_seeds": [2],
            "size_rule": {"coef": 1.0, "exponent": 0.5, "span": 2, "points": 3},
            "families": [{"method": "flat"}, {"name": "other", "method": "flat"}],
            "verdict_seeds": {"seeds": [2, 3, 4], "families": ["flat"], "budgets": [3e8]}}
    grid = parse_grid(spec)
    assert (grid.verdict_seeds, grid.verdict_families, grid.verdict_budgets) == ((2, 3, 4), ("flat",), (3e8,))
    run, calls = known_loss_runner(lambda c: 1.2e4)
    out = tmp_path / "study"
    run_grid(grid, out, log=lambda m: None, runner=run)
    recs = read_records(out / "salad")
    verdict = [r for r in recs if r["point_kind"] == "verdict"]
    # seed 2 is the optimum's already; 3 and 4 at flat's best size at 3e8 only, never at 1e8 nor for `other`
    assert sorted(r["seed"] for r in verdict) == [3, 4]
    assert {(r["family"], r["budget_flops"]) for r in verdict} == {("flat", 3e8)}
    best = [r for r in recs if r["point_kind"] == "optimum" and r["family"] == "flat" and r["budget_flops"] == 3e8]
    assert {r["target_size"] for r in verdict} == {best[0]["target_size"]}
    n_calls = len(calls)
    assert run_grid(grid, out, log=lambda m: None, runner=run)["added"] == 0 and len(calls) == n_calls
    for bad, match in (({"seeds": [3]}, "seeds and families"), ({"seeds": [3], "families": ["nope"]}, "nope"),
                       ({"seeds": [3], "families": ["flat"], "budgets": [1e9]}, "budgets"),
                       ({"seeds": [3], "families": ["flat"], "sede": 1}, "sede")):
        with pytest.raises(ConfigError, match=match):
            parse_grid({**spec, "verdict_seeds": bad})


def test_a_family_window_can_be_recentred_at_one_budget_and_the_others_keep_theirs():
    from rltok.analysis.scaling_grid import family_sizes

    spec = {**RULES, "families": [{"method": "flat", "centres": {"1e10": 4e5}}, *RULES["families"][1:]]}
    grid = parse_grid(spec)
    flat = grid.families[0]
    assert flat.centre_at(1e10) == 4e5 and flat.centre_at(1e8) is None
    assert family_sizes(grid, flat, 1e8) == [2500, 5000, 10000, 20000, 40000]  # the rule's window, as before
    assert family_sizes(grid, flat, 1e10) == [100000, 200000, 400000, 800000, 1600000]  # 4e5 / 4 .. 4e5 * 4
    for fam, match in (({"method": "flat", "centres": {"1e9": 4e5}}, "not budgets of the grid"),
                       ({"method": "flat", "centres": {"1e10": -1}}, "must be > 0"),
                       ({"method": "flat", "centres": {"1e10": "big"}}, "are numbers"),
                       ({"method": "flat", "sizes": [1e3], "centres": {"1e10": 4e5}}, "needs the size_rule")):
        with pytest.raises(ConfigError, match=match):
            parse_grid({**spec, "families": [fam]})


def test_the_lr_rule_and_warmup_reach_the_runs_and_their_records(tmp_path):
    import math

    grid = parse_grid({"corpora": [str(corpus_folder(tmp_path, "salad"))], "budgets": [1e8], "preset": "test",
                       "max_eval_windows": 2, "warmup_frac": 0.25,
                       "lr_rule": {"lr_ref": 2e-3, "n_ref": 1e4, "exponent": 0.5},
                       "families": [{"method": "flat", "sizes": [5e3, 2e4], "lr_mult": 2}]})
    from rltok.analysis.scaling_adapt import run_grid

    run_grid(grid, tmp_path / "o", log=lambda m: None)
    recs = read_records(tmp_path / "o" / "salad")
    assert len(recs) == 2
    for r in recs:
        assert r["lr"] == pytest.approx(2 * 2e-3 * math.sqrt(1e4 / r["ladder_params"]), rel=1e-12)
        assert r["config"]["train"]["lr"] == r["lr"] and r["lr_mult"] == 2 and r["point_kind"] == "ladder"
        assert r["config"]["train"]["warmup_frac"] == 0.25


def synthetic_study(folder, budgets, sizes, seeds, n_star, split="test"):
    """Records of a known law in a corpus folder: L = 1.5 + 40 C^-0.2 + 0.05 ln(N / N*(C))^2."""
    import math

    folder.mkdir(parents=True)
    for c in budgets:
        for n in sizes:
            for s in seeds:
                bpb = 1.5 + 40 * c ** -0.2 + 0.05 * math.log(n / n_star(c)) ** 2 + 0.002 * (s - 0.5)
                rec = {"family": "flat", "budget_flops": c, "target_size": n, "non_embedding_params": n, "seed": s,
                       "bpb": bpb, "split": split, "point_kind": "ladder"}
                (folder / f"{budget_tag(c)}__flat__N{n}__s{s}.json").write_text(json.dumps(rec))


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
    from rltok.analysis.scaling_holdout import predictions_block

    assert "`prediction.json`: the held-out budgets C5e08" in predictions_block(out)
    assert "Scored against C5e08's runs at the predicted sizes" in predictions_block(out)
    # a family whose every held-out seed diverged keeps its row, unscored, and says why
    from rltok.analysis.scaling_holdout import holdout_points, score_holdout, score_table

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
    from rltok.analysis.scaling_holdout import predictions_block

    block = predictions_block(out)
    assert "`prediction_C3e08.json`: a forecast of the study's own budget C3e08" in block
    assert "| salad | flat | C3e08 |" in block and "--holdout --at 3e+08`" in block
    # a forecast is scored once its budget is complete, not from a partial ladder
    assert main([*args, "--holdout", "--at", "3e8"]) == 2 and "not complete" in capsys.readouterr().err
    (out / "salad" / "C3e08__flat__N5000__s0.json").write_text(json.dumps(
        {"family": "flat", "budget_flops": 3e8, "target_size": 5000, "non_embedding_params": 5000, "seed": 0,
         "bpb": 3.0, "split": "test", "point_kind": "ladder"}))  # one run of 3e8: its fits are provisional
    assert main([*args, "--fit-only"]) == 0 and "salad 3e+08 is not complete" in capsys.readouterr().err
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
    from rltok.analysis.scaling_holdout import forecast_table, score_forecast

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
    from rltok.analysis.scaling_holdout import write_prediction
    with pytest.raises(ConfigError, match="exist already"):
        write_prediction(held, out)


def test_choices_read_the_selection_split_and_one_corpus_runs_alone(tmp_path, capsys):
    """With select_split every record is also scored on that split (`bpb_select`), and the
    study's choices read it; eval_context reaches the scoring; `--corpus` runs one corpus of the
    grid and leaves the other."""
    from rltok.analysis.scaling_fit import choice_loss

    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({
        "corpora": {"a": str(corpus_folder(tmp_path, "a")), "b": str(corpus_folder(tmp_path, "b"))},
        "budgets": [1e8], "preset": "test", "max_eval_windows": 2, "select_split": "val", "eval_context": 8,
        "families": [{"method": "flat", "sizes": [5e3]}]}))
    out = tmp_path / "o"
    assert main(["scaling", "--grid", str(grid), "--out", str(out), "--corpus", "b"]) == 0
    assert not (out / "a").exists()
    (rec,) = read_records(out / "b")
    assert rec["split"] == "test" and rec["select_split"] == "val" and rec["eval_context"] == 8
    assert rec["bpb_select"] != rec["bpb"] and choice_loss(rec) == rec["bpb_select"]
    assert choice_loss({"bpb": 3.0}) == 3.0
    assert main(["scaling", "--grid", str(grid), "--out", str(out), "--corpus", "c"]) == 2
    assert "--corpus c" in capsys.readouterr().err


def test_a_diverged_run_is_recorded_and_the_grid_goes_on(tmp_path):
    """A run that diverges (too large a rate for its size) is a result: its record says so, with
    no bpb; the other points still run, a rerun does not retry it, and the fits leave it out."""
    from rltok.analysis.scaling import fit_corpus
    from rltok.analysis.scaling_adapt import run_grid
    from rltok.training.trainer import TrainingDiverged

    grid = parse_grid({"corpora": [str(corpus_folder(tmp_path, "salad"))], "budgets": [1e8, 1e9], "seeds": [0, 1],
                       "preset": "test", "extend": 1, "optimum_seeds": [2],
                       "families": [{"method": "flat", "sizes": [1e3, 4e3, 1.6e4]}]})
    good, calls = known_loss_runner(lambda c: 4e3)

    def run(grid, p, folder, split):
        if p.rung.target == 1.6e4 and p.seed == 1 and p.budget == 1e8:
            calls.append(p.stem)
            raise TrainingDiverged("5 consecutive non-finite steps")
        return good(grid, p, folder, split)

    out = tmp_path / "study"
    result = run_grid(grid, out, log=lambda m: None, runner=run)
    assert result["ran"] == 2 * 3 * 2
    bad = json.loads((out / "salad" / "C1e08__flat__N16000__s1.json").read_text())
    assert bad["bpb"] is None and "non-finite" in bad["diverged"] and bad["non_embedding_params"] > 0
    n = len(calls)
    run_grid(grid, out, log=lambda m: None, runner=run)
    assert len(calls) == n  # recorded: not retried
    study = fit_corpus(out / "salad", n_boot=10)
    assert study["flat"].isofits[1e8].interior and len(read_records(out / "salad")) == 2 * 3 * 2 + 2


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
    from rltok.analysis.scaling_holdout import predict_corpus

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


def test_under_wsd_a_shared_size_branches_from_the_smaller_budget_and_matches_a_run_from_scratch(tmp_path):
    from rltok.analysis.scaling_adapt import run_grid
    from rltok.training.run_folder import BRANCH

    data = corpus_folder(tmp_path, "salad")
    table = {"corpora": [str(data)], "budgets": [1.5e9, 3e9], "preset": "test", "max_eval_windows": 2,
             "warmup_frac": 0.2, "lr_schedule": "wsd", "cooldown_frac": 0.25,
             "families": [{"method": "flat", "sizes": [5e3]}]}
    grid = parse_grid(table)
    out = tmp_path / "wsd"
    assert run_grid(grid, out, log=lambda m: None)["ran"] == 2
    small, large = (json.loads((out / "salad" / f"{budget_tag(c)}__flat__N5000__s0.json").read_text())
                    for c in (1.5e9, 3e9))
    assert small["branched_from"] is None and small["own_flops"] == small["train_flops"]
    assert large["branched_from"] == "C1.5e09__flat__N5000__s0"
    # the smaller run up to its cool-down (the last quarter of 1.5e9) was not paid again
    assert large["own_flops"] < large["train_flops"] - 0.7 * 1.5e9 and large["train_flops"] >= 3e9
    warm = small["config"]["train"]["warmup_steps"]
    assert abs(warm - 0.2 * small["steps"]) <= 1  # warmup_frac of the steps the smallest budget plans ...
    for r in (small, large):  # ... at every budget
        assert r["config"]["train"]["warmup_steps"] == warm and r["config"]["train"]["lr_schedule"] == "wsd"
        assert r["config"]["train"]["cooldown_frac"] == 0.25
    assert run_grid(grid, out, log=lambda m: None) == {"points": 2, "done": 2, "ran": 0, "added": 0}

    def scratch(grid, p, folder, split):  # the same grid, but no run keeps its branch: all from scratch
        from rltok.analysis.scaling import run_point

        rec = run_point(grid, p, folder, split)
        for kept in (folder / "runs" / p.stem).glob(f"*/{BRANCH}"):
            shutil.rmtree(kept)
        return rec

    run_grid(grid, tmp_path / "scratch", log=lambda m: None, runner=scratch)
    alone = json.loads((tmp_path / "scratch" / "salad" / "C3e09__flat__N5000__s0.json").read_text())
    assert alone["branched_from"] is None and alone["own_flops"] == alone["train_flops"] == large["train_flops"]
    assert alone["bpb"] == large["bpb"] and alone["steps"] == large["steps"]


def test_the_cosine_default_keeps_every_run_its_own_and_schedule_keys_are_checked(tmp_path):
    from rltok.analysis.scaling_adapt import run_grid

    table = {"corpora": [str(corpus_folder(tmp_path, "salad"))], "budgets": [1e8, 2e8], "preset": "test",
             "max_eval_windows": 2, "families": [{"method": "flat", "sizes": [5e3]}]}
    grid = parse_grid(table)
    assert grid.lr_schedule is None and not grid.branches
    run_grid(grid, tmp_path / "o", log=lambda m: None)
    for r in read_records(tmp_path / "o" / "salad"):
        assert "branched_from" not in r and "own_flops" not in r and r["config"]["train"]["lr_schedule"] == "cosine"
    assert not list((tmp_path / "o" / "salad" / "runs").glob("*/*/branch"))
    with pytest.raises(ConfigError, match="lr_schedule must be cosine or wsd"):
        parse_grid({**table, "lr_schedule": "step"})
    with pytest.raises(ConfigError, match="cooldown_frac"):
        parse_grid({**table, "cooldown_frac": 0.3})  # without "wsd"
    with pytest.raises(ConfigError, match="cooldown_frac"):
        parse_grid({**table, "lr_schedule": "wsd", "cooldown_frac": 0})


def test_a_points_wall_time_counts_its_interrupted_attempts(tmp_path, monkeypatch):
    """run_point's `point_wall_s`: the whole point (evaluations included), and the seconds an
    interrupted attempt ran before the one that finished."""
    import time

    from rltok.analysis import scaling

    attempts = []

    def fake(grid, p, folder, split, run_root):
        attempts.append(run_root)
        time.sleep(0.2)
        if len(attempts) == 1:
            raise KeyboardInterrupt
        return {"wall_s": 0.05}

    monkeypatch.setattr(scaling, "_run_point", fake)
    from types import SimpleNamespace

    point = scaling.Point("salad", 1e9, SimpleNamespace(name="flat"), SimpleNamespace(target=1e4), 0, "ladder")
    with pytest.raises(KeyboardInterrupt):
        scaling.run_point(None, point, tmp_path, "test")
    rec = scaling.run_point(None, point, tmp_path, "test")
    assert attempts[0] == attempts[1] == tmp_path / "runs" / point.stem
    assert 0.4 <= rec["point_wall_s"] < 5 and rec["wall_s"] == 0.05


def test_the_grid_example_of_the_docs_parses():
    import tomllib
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "SCALING.md").read_text()
    block = text[text.index("**The grid** (TOML"):]
    block = block[block.index("```toml") + len("```toml"):]
    grid = parse_grid(tomllib.loads(block[:block.index("```")]))
    assert grid.verdict_families == ("whitespace",) and grid.optimum_seeds == (2,) and grid.interior_only
    ws = next(f for f in grid.families if f.name == "whitespace")
    assert (ws.aspect, ws.byte_ratio) == (48.0, 0.67)


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


def test_the_profile_pairing_script_pairs_two_families_at_every_shared_rung_and_seed(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # B is A plus 0.1 at the small rung and 0.3 at the large one; a rung or seed only one ran is left
    # out. B's ladder was centred elsewhere: its targets differ from A's, its shapes (what pairs) do not
    width = {1000: 32, 2000: 48, 4000: 64}
    for fam, extra in (("a", {1000: 0.0, 2000: 0.0}), ("b", {1000: 0.1, 2000: 0.3, 4000: 0.0})):
        for n, add in extra.items():
            target = n if fam == "a" else 1.07 * n
            for s in (0, 1, 2) if (fam, n) != ("a", 2000) else (0, 1):
                rec = {"family": fam, "budget_flops": 1e9, "target_size": target, "seed": s, "non_embedding_params": n,
                       "bpb": 2.0 + add + 0.01 * s, "width": width[n], "depth": 1, "config": {"model": {"arch": "flat"}}}
                (folder / f"{budget_tag(1e9)}__{fam}__N{target:.0f}__s{s}.json").write_text(json.dumps(rec))
    # seed 3 of the small rung: A finished, B diverged (a diverged record states no shape: it takes
    # its rung's from B's finished seeds, so the pair is found and counted as left out)
    (folder / f"{budget_tag(1e9)}__a__N1000__s3.json").write_text(json.dumps(
        {"family": "a", "budget_flops": 1e9, "target_size": 1000.0, "seed": 3, "non_embedding_params": 1000,
         "bpb": 2.0, "width": 32, "depth": 1}))
    (folder / f"{budget_tag(1e9)}__b__N1070__s3.json").write_text(json.dumps(
        {"family": "b", "budget_flops": 1e9, "target_size": 1070.0, "seed": 3, "non_embedding_params": 1000,
         "bpb": None, "diverged": "non-finite loss"}))
    proc = subprocess.run([sys.executable, str(repo / "scripts" / "scaling_pair_profile.py"), "--out",
                           str(tmp_path / "study"), "--a", "a", "--b", "b", "--budget", "1e9"],
                          capture_output=True, text=True, check=True)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| salad |")]
    assert rows[0].startswith("| salad | 32 × 1 | 1,000 / 1,000 | 3 | -0.100 | s0 -0.100, s1 -0.100, s2")
    assert rows[1].startswith("| salad | 48 × 1 | 2,000 / 2,000 | 2 | -0.300 |") and len(rows) == 3
    # the 5 (rung, seed) pairs pooled, and the 2 rung means
    assert rows[2].startswith("| salad | -0.180 [") and "(5) | -0.200 [" in rows[2] and rows[2].endswith("(2) |")
    assert "1 shared (rung, seed) pairs left out: a side diverged" in proc.stdout


def test_the_shapes_script_tables_each_shape_by_budget_and_bins_differences_by_steps(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # budget 1e9 ran shapes S and M, budget 3e9 ran M and L; seed 2 (an optimum seed) only at M of 1e9
    runs = {1e9: {"16/32 1+1+1": (1000, 2.5, 400), "32/48 1+1+1": (2000, 2.3, 200)},
            3e9: {"32/48 1+1+1": (2000, 2.1, 600), "32/64 1+2+1": (4000, 2.2, 300)}}
    for fam in ("u", "r"):
        for budget, shapes in runs.items():
            for sh, (n, bpb, steps) in shapes.items():
                # the learned family's gap falls with steps: +0.1 at 200 steps, +0.033 at 600
                add = 20 / steps if fam == "r" else 0.0
                seeds = (0, 1, 2) if (budget, sh) == (1e9, "32/48 1+1+1") else (0, 1)
                for s in seeds:
                    width, depth = sh.split()
                    rec = {"family": fam, "budget_flops": budget, "seed": s, "non_embedding_params": n, "steps": steps,
                           "bpb": bpb + add + 0.5 * s, "bpb_select": bpb + add + 0.01 * s, "width": width, "depth": depth}
                    (folder / f"{budget_tag(budget)}__{fam}__N{n}__s{s}.json").write_text(json.dumps(rec))
    # a diverged run (no bpb, no shape in its record) changes nothing
    (folder / f"{budget_tag(1e9)}__u__N4000__s0.json").write_text(json.dumps(
        {"family": "u", "budget_flops": 1e9, "seed": 0, "non_embedding_params": 4000, "bpb": None, "steps": 0}))
    script = [sys.executable, str(repo / "scripts" / "scaling_shapes.py"), "--out", str(tmp_path / "study")]
    out = subprocess.run(script + ["--family", "u", "--budget", "1e9", "3e9"], capture_output=True, text=True,
                         check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 16/") or line.startswith("| 32/")]
    # seed 2 of the optimum is left out (the seeds every rung ran: 0 and 1), a missing shape is "·"
    assert rows == ["| 16/32 × 1+1+1 | 1,000 | 2.505 | · |", "| 32/48 × 1+1+1 | 2,000 | **2.305** | **2.105** |",
                    "| 32/64 × 1+2+1 | 4,000 | · | 2.205 |"]
    assert "C1e09 seeds 0,1; C3e09 seeds 0,1" in out
    out = subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--split", "test"],
                         capture_output=True, text=True, check=True).stdout
    assert "| 32/48 × 1+1+1 | 2,000 | +0.100 | +0.033 |" in out and "| 16/32 × 1+1+1 | 1,000 | +0.050 | · |" in out
    out = subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--by-steps"],
                         capture_output=True, text=True, check=True).stdout
    bins = [line for line in out.splitlines() if line.startswith("| 2") or line.startswith("| 3")
            or line.startswith("| 4") or line.startswith("| 6")]
    assert bins == ["| 200–200 | 1 | +0.100 | +0.100 |", "| 300–300 | 1 | +0.067 | +0.067 |",
                    "| 400–400 | 1 | +0.050 | +0.050 |", "| 600–600 | 1 | +0.033 | +0.033 |"]
    out = subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--by-steps", "--bins", "1",
                                   "--min-steps", "250"], capture_output=True, text=True, check=True).stdout
    assert "| 300–600 | 3 | +0.050 | +0.050 |" in out  # the 200-step cell left out; (1/15 + 1/20 + 1/30) / 3
    if importlib.util.find_spec("matplotlib"):
        png = tmp_path / "gap.png"
        subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--by-steps", "--plot",
                                 str(png)], capture_output=True, text=True, check=True)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(script + ["--family", "r", "--budget", "1e9", "--by-steps"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--by-steps needs --minus" in bad.stderr


def test_status_counts_runs_per_budget_and_estimates_the_time_left(tmp_path, capsys):
    from rltok.analysis.scaling_adapt import run_grid
    from rltok.analysis.scaling_status import status_table, study_status

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


def test_status_counts_the_held_out_runs_once_the_prediction_exists(tmp_path, capsys):
    from rltok.analysis.scaling_holdout import holdout_points
    from rltok.analysis.scaling_status import holdout_status, holdout_table

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


def test_a_family_can_set_its_shape_rules_aspect_and_byte_width():
    from rltok.analysis.scaling import budget_ladders

    spec = {"corpora": {"salad": "nowhere"}, "budgets": [1e12], "preset": "tiny",
            "families": [{"name": "plain", "method": "uniform", "sizes": [1.5e5]},
                         {"name": "shallow", "method": "uniform", "sizes": [1.5e5], "aspect": 64, "byte_ratio": 0.75}]}
    grid = parse_grid(spec)
    assert (grid.families[0].aspect, grid.families[0].byte_ratio) == (None, None)
    assert (grid.families[1].aspect, grid.families[1].byte_ratio) == (64.0, 0.75)
    (plain,), (shallow,) = (budget_ladders(grid, f, [1e12], log=lambda m: None)[1e12] for f in grid.families)
    assert "model.main_layers=2" in plain.overrides and "model.d_byte=32" in plain.overrides
    # 64 wide with one main layer (width/depth 64), its byte level at 0.75 of it: 48
    assert {"model.d_chunk=64", "model.main_layers=1", "model.d_byte=48"} <= set(shallow.overrides)
    for bad, match in (({"aspect": 0}, "aspect"), ({"aspect": "wide"}, "aspect"), ({"byte_ratio": 1.5}, "byte_ratio")):
        with pytest.raises(ConfigError, match=match):
            parse_grid({**spec, "families": [{"method": "uniform", "sizes": [1.5e5], **bad}]})
    flat = parse_grid({**spec, "families": [{"method": "flat", "sizes": [1.5e5], "byte_ratio": 0.75}]})
    with pytest.raises(ConfigError, match="byte_ratio"):  # the flat model has no byte level
        budget_ladders(flat, flat.families[0], [1e12], log=lambda m: None)


def _curve(budget, values, shares=None):
    """A record's val curve: one evaluation at each share of the run's FLOPs ((1 + k) / len(values)
    unless `shares` says)."""
    shares = shares or [(k + 1) / len(values) for k in range(len(values))]
    return [{"step": 10 * (k + 1), "train_flops": budget * x, "val_bpb": v} for k, (x, v) in enumerate(zip(shares, values))]


def test_a_runs_curve_is_read_at_a_share_of_its_flops():
    from rltok.analysis.run_curve import curve_at

    rec = {"budget_flops": 1e9, "curve": _curve(1e9, [3.0, 2.0, 1.0], shares=[0.2, 0.6, 1.0])}
    assert curve_at(rec, 0.4) == pytest.approx(2.5)  # halfway between the first two evaluations
    assert curve_at(rec, 0.19) == 3.0 and curve_at(rec, 1.01) == 1.0  # within 0.02 of an end: that end
    assert curve_at(rec, 0.1) is None  # before the curve: no guess
    assert curve_at({"budget_flops": 1e9}, 0.5) is None and curve_at({"budget_flops": 1e9, "curve": []}, 0.5) is None
    # an evaluation without a val loss is skipped
    rec["curve"].insert(1, {"step": 15, "train_flops": 0.4e9, "val_bpb": None})
    assert curve_at(rec, 0.4) == pytest.approx(2.5)


def test_the_seed_noise_script_pools_each_sizes_spread_and_finds_where_seeds_parted(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # family f at 1e9: size 1000 seeds 2.0 / 2.2 (sd 0.1414), size 2000 seeds 2.0 / 2.0 / 2.3 (sd 0.1732);
    # at 3e9 size 1000 seeds 2.0 / 2.1 (sd 0.0707); a size with one seed and a diverged run add nothing.
    # The val curves (three evaluations, at a third, two thirds and the end): at 1e9 seed 1 of size
    # 1000 is 0.2 worse from the first; size 2000's seed 2 ends 0.3 worse but parts only at the end;
    # at 3e9 seed 1 is ahead at a third (0.1) and ends 0.1 behind
    runs = {(1e9, 1000): {0: 2.0, 1: 2.2}, (1e9, 2000): {0: 2.0, 1: 2.0, 2: 2.3}, (1e9, 4000): {0: 2.5},
            (3e9, 1000): {0: 2.0, 1: 2.1}}
    parts = {(1e9, 1000, 1): (0.2, 0.2, 0.2), (1e9, 2000, 2): (0.0, 0.0, 0.3), (3e9, 1000, 1): (-0.1, 0.05, 0.1)}
    for (budget, n), by_seed in runs.items():
        for s, bpb in by_seed.items():
            part = parts.get((budget, n, s), (0.0, 0.0, 0.0))
            rec = {"family": "f", "budget_flops": budget, "seed": s, "non_embedding_params": n, "bpb": bpb,
                   "split": "test", "curve": _curve(budget, [3.0 + part[0], 2.8 + part[1], 2.7 + part[2]])}
            (folder / f"{budget_tag(budget)}__f__N{n}__s{s}.json").write_text(json.dumps(rec))
    (folder / f"{budget_tag(1e9)}__f__N8000__s0.json").write_text(json.dumps(
        {"family": "f", "budget_flops": 1e9, "seed": 0, "non_embedding_params": 8000, "bpb": None}))
    script = [sys.executable, str(repo / "scripts" / "scaling_seed_noise.py"), "--out", str(tmp_path / "study")]
    out = subprocess.run(script + ["--parted", "1"], capture_output=True, text=True, check=True).stdout
    # 1e9: sqrt((0.02 + 0.06) / (1 + 2)) = 0.163; 3e9: 0.071; pooled sqrt(0.085 / 4) = 0.146;
    # median of the sizes' own sd (0.141, 0.173, 0.071) = 0.141
    assert "| f | 0.163 (2) | 0.071 (1) | 0.146 (3) | 0.141 |" in out
    assert "**f, C1e09, N = 2,000**: test bpb s0 2.000, s1 2.000, s2 2.300; spread 0.300" in out
    # the sixths between evaluations are read off the line; none before the first evaluation
    assert "| 0.33 | 3.000 | 3.000 | 3.000 | 0.000 |" in out and "| 0.50 | 2.900 | 2.900 | 2.900 | 0.000 |" in out
    assert "| 0.17 |" not in out and "| 0.83 | 2.750 | 2.750 | 2.900 | 0.150 |" in out
    assert "half the final val spread (0.300) present at 83% of the run" in out
    # no size's curves reach a sixth of the run, so none is counted
    assert "Of the 0 sizes" in out
    # curves from a sixth: size 1000 at 1e9 parted at once, size 2000 at the end, 3e9's swapped order
    for (budget, n), by_seed in runs.items():
        for s in by_seed:
            path = folder / f"{budget_tag(budget)}__f__N{n}__s{s}.json"
            rec = json.loads(path.read_text())
            part = parts.get((budget, n, s), (0.0, 0.0, 0.0))
            vals = [3.5 + part[0]] * 2 + [3.0 + part[0]] + [2.8 + part[1]] * 2 + [2.7 + part[2]]
            path.write_text(json.dumps({**rec, "curve": _curve(budget, vals)}))
    out = subprocess.run(script + ["--parted", "1"], capture_output=True, text=True, check=True).stdout
    assert ("Of the 3 sizes whose seeds end 0.05 val bpb or more apart (every sixth of every seed's curve known), "
            "half the final spread was first present in the first third of the run in 2, the second in 0, the last "
            "in 1; the seed that ends best was already ahead of the one that ends worst at a third of the run in 1.") in out
    out = subprocess.run(script + ["--parted", "0", "--budget", "3e9"], capture_output=True, text=True, check=True).stdout
    assert "| f | 0.071 (1) | 0.071 (1) | 0.071 |" in out and "Of the" not in out


def test_the_profile_pairing_script_follows_a_difference_along_the_runs(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # at 1e9, A is 0.2 above B at a sixth of the run and 0.1 after, at seeds 0 and 1 (seed 2 of B
    # diverged); at 3e9 one pair whose evaluations fall between the sixths (A 0.3 above B at the first,
    # 0 at the last: 0.15 halfway); a rung only A ran adds nothing
    for budget, fam, s, curve, shares in [
            *[(1e9, "b", s, [3.0, 2.5, 2.4, 2.3, 2.2, 2.0], None) for s in (0, 1, 2)],
            *[(1e9, "a", s, [3.2, 2.6, 2.5, 2.4, 2.3, 2.1], None) for s in (0, 1, 2)],
            (3e9, "b", 0, [3.0, 2.0], [0.1, 1.0]), (3e9, "a", 0, [3.3, 2.0], [0.1, 1.0])]:
        rec = {"family": fam, "budget_flops": budget, "target_size": 1000.0, "seed": s, "non_embedding_params": 1000,
               "bpb": None if (budget, fam, s) == (1e9, "b", 2) else 2.0, "width": 32, "depth": 1,
               "config": {"model": {"arch": "flat"}}, "curve": _curve(budget, curve, shares)}
        (folder / f"{budget_tag(budget)}__{fam}__N1000__s{s}.json").write_text(json.dumps(rec))
    (folder / f"{budget_tag(1e9)}__a__N2000__s0.json").write_text(json.dumps(
        {"family": "a", "budget_flops": 1e9, "target_size": 2000.0, "seed": 0, "non_embedding_params": 2000, "bpb": 2.0,
         "width": 48, "depth": 1, "curve": _curve(1e9, [9.0] * 6)}))
    script = [sys.executable, str(repo / "scripts" / "scaling_pair_profile.py"), "--out", str(tmp_path / "study"),
              "--a", "a", "--b", "b", "--along"]

    def along(budgets):  # the --along section of the output, and its row's cells
        out = subprocess.run(script + ["--budget", *budgets], capture_output=True, text=True, check=True).stdout
        out = out[out.index("along the run"):]
        return out, next(line for line in out.splitlines() if line.startswith("| salad |")).strip("| ").split(" | ")[1:]

    out, cells = along(["1e9"])
    assert cells == ["+0.200 [+0.200, +0.200] (2)"] + ["+0.100 [+0.100, +0.100] (2)"] * 5
    assert "1 shared (rung, seed) pairs left out: a side diverged" in out and "C1e09 both ran" in out
    _, cells = along(["3e9"])
    assert cells == ["–"] * 6  # one pair: no interval
    # pooled over both budgets, three pairs at each sixth; 3e9's pair read between its evaluations at
    # 0.1 and 1.0: at a sixth 0.3 (1 - 0.0667 / 0.9) = 0.278, at the end 0
    _, cells = along(["1e9", "3e9"])
    assert cells[0].startswith("+0.226 [") and cells[0].endswith("(3)")  # (0.2 + 0.2 + 0.278) / 3
    assert cells[5].startswith("+0.067 [") and cells[5].endswith("(3)")  # (0.1 + 0.1 + 0) / 3


def test_the_seed_noise_script_counts_runs_still_on_the_unigram_plateau(tmp_path):
    import math
    import subprocess
    import sys
    from collections import Counter
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "train.txt").write_text("ab" * 500)
    (data / "val.txt").write_text("aaab" * 100)  # byte frequencies 3/4, 1/4: 0.811 bits per byte
    (data / "test.txt").write_text("ab" * 100)
    counts = Counter(b"aaab")
    entropy = -sum(c / 4 * math.log2(c / 4) for c in counts.values())
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # at a sixth of the run: seed 0 at the entropy + 0.05 (on the plateau), seed 1 at it - 0.3 (off);
    # a record without a curve counts in neither
    for s, at_first in ((0, entropy + 0.05), (1, entropy - 0.3), (2, None)):
        rec = {"family": "f", "budget_flops": 1e9, "seed": s, "non_embedding_params": 1000, "bpb": 1.0,
               "config": {"data": {"train": str(data)}},
               "curve": _curve(1e9, [at_first] + [0.5] * 5) if at_first is not None else []}
        (folder / f"{budget_tag(1e9)}__f__N1000__s{s}.json").write_text(json.dumps(rec))
    out = subprocess.run([sys.executable, str(repo / "scripts" / "scaling_seed_noise.py"), "--out",
                          str(tmp_path / "study"), "--plateau"], capture_output=True, text=True, check=True).stdout
    assert f"byte unigram entropy ({entropy:.3f}, {data})" in out
    assert "| f | 1 | 2 |" in out


def test_a_prediction_with_an_unknown_interval_is_neither_inside_nor_outside_it():
    from rltok.analysis.scaling_fit import Prediction, score_prediction
    from rltok.analysis.scaling_fit import in_interval

    nan = float("nan")
    pred = Prediction("flat", 1e9, 1e4, (nan, nan), 2.0, (nan, nan), 0.95, 3.0, None)
    score = score_prediction(pred, [2.1, 2.2], size=1e4)
    assert score.within is None and score.size_within is None and score.error == pytest.approx(0.15)
    known = dataclasses.replace(pred, l_star_interval=(1.9, 2.1), n_star_interval=(5e3, 2e4))
    assert score_prediction(known, [2.3, 2.4], size=1e4).within is False
    assert score_prediction(known, [2.0, 2.05], size=3e4).size_within is False
    assert in_interval(1.0, (nan, 2.0)) is None and in_interval(1.0, (0.5, 2.0)) is True
    assert in_interval(3.0, (0.5, 2.0)) is False


def test_a_group_is_predicted_and_scored_as_its_best_member(tmp_path):
    """A group's envelope fits its best member per budget (chosen on the selection split, as the
    report's); at the held-out budget its prediction is scored against the member that is best
    there among the families' held-out runs."""
    from rltok.analysis.scaling_holdout import run_holdout, score_table, write_prediction

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
    from rltok.analysis.scaling_holdout import holdout_points, score_holdout

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
    from rltok.analysis.scaling_holdout import forecast_grid, forecast_table, prediction_name, score_forecast

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


def test_the_rerun_table_pairs_each_variant_with_the_studys_record_of_its_corpus_seed_and_size(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    study, bits = tmp_path / "study", tmp_path / "bits"
    for corpus, shift in (("a", 0.01), ("b", -0.03)):
        (study / corpus).mkdir(parents=True)
        (bits / corpus).mkdir(parents=True)
        for s in (0, 1):
            for n, bpb in ((1000, 2.0 + 0.1 * s), (2000, 1.5 + 0.1 * s)):  # two sizes: the variant's is 2000
                rec = {"family": "f", "budget_flops": 1e9, "seed": s, "non_embedding_params": n, "bpb": bpb}
                (study / corpus / f"{budget_tag(1e9)}__f__N{n}__s{s}.json").write_text(json.dumps(rec))
            rec = {"family": "f_fused", "budget_flops": 1e9, "seed": s, "non_embedding_params": 2000,
                   "bpb": 1.5 + 0.1 * s + shift}
            (bits / corpus / f"{budget_tag(1e9)}__f_fused__N2000__s{s}.json").write_text(json.dumps(rec))
    out = subprocess.run([sys.executable, str(repo / "scripts" / "scaling_rerun_table.py"), "--out", str(study),
                          "--results", str(bits), "--budget", "1e9", "--pooled", "fused"],
                         capture_output=True, text=True, check=True).stdout
    assert "| f | fused | +0.0100, +0.0100 | -0.0300, -0.0300 |" in out and "| 0.0300 |" in out
    assert "All 4 fused pairs: -0.0100" in out


def test_the_score_summary_script_splits_a_scores_cells_by_a_group_and_leaves_group_rows_out(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"corpora": {"salad": "x"}, "budgets": [1e9, 3e9], "preset": "test",
                                "groups": {"tall": ["h1", "h2"]},
                                "families": [{"name": n, "method": "flat", "sizes": [1e4]} for n in ("f", "h1", "h2")]}))

    def cell(family, error, within, baseline, lo=2.0, hi=2.2, size_within=True):
        return {"corpus": "salad", "family": family, "error": error, "within": within, "baseline_error": baseline,
                "size_within": size_within, "prediction": {"l_star_interval": [lo, hi]}}

    scores = [cell("f", +0.04, True, +0.05),           # the law closer, the two agree within 0.02
              cell("h1", -0.10, False, -0.01, hi=2.4),  # the rival closer
              cell("h2", -0.02, True, +0.03, size_within=False),  # the law closer
              {**cell("tall", -0.10, False, -0.01), "member": "h1"},  # the group: h1's runs again, left out
              {**cell("f", None, None, None), "corpus": "soup"}]       # every seed diverged: counted apart
    # a prediction without an interval: neither inside nor outside, and no width
    scores.append({**cell("f", +0.06, None, None, lo=None, hi=None), "corpus": "stew"})
    path = tmp_path / "score.json"
    path.write_text(json.dumps({"prediction_commit": "abc", "scores": scores}))
    script = [sys.executable, str(repo / "scripts" / "scaling_score_summary.py"), "--grid", str(grid), "--score",
              str(path)]
    out = subprocess.run(script + ["--kind", "tall"], capture_output=True, text=True, check=True).stdout
    rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in out.splitlines() if line.startswith("| ")}
    assert rows["| all (4)"] == ["0.050", "-0.005 (2 above, 2 below)", "2 of 3", "0.200", "0.030", "2 of 3",
                                 "1 of 3", "3 of 4 |"]
    assert rows["| tall (2)"][:4] == ["0.060", "-0.060 (0 above, 2 below)", "1 of 2", "0.300"]
    assert rows["| not tall (2)"][1] == "+0.050 (2 above, 0 below)"
    assert "1 cells unscored: no measured optimum" in out
    # a held-out score's runs are built at the predicted N*: its N* column is left blank
    path.write_text(json.dumps({"scores": [{**c, "measured": 2.1} for c in scores[:3]]}))
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert next(line for line in out.splitlines() if line.startswith("| all (3)")).endswith("| – |")
    bad = subprocess.run(script + ["--kind", "wide"], capture_output=True, text=True)
    assert bad.returncode != 0 and "the grid's groups are tall" in bad.stderr


def test_held_out_paired_rows_of_other_corpora_are_kept_and_the_cli_prints_them(tmp_path, monkeypatch, capsys):
    import rltok.analysis.scaling_holdout as holdout

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
    from rltok.analysis.scaling_holdout import holdout_paired

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
    from rltok.analysis.scaling_plots import plot_prediction_scores

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
