"""`rltok scaling`: a tiny grid runs end to end (a JSON per run with the study's fields), a
second invocation skips every finished point, and the fit writes fits.json and the plots."""

from __future__ import annotations

import dataclasses
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
    # the family's rate changed and its records were moved aside, but not its run folders: they
    # would resume at the new rate from the old state
    moved = dataclasses.replace(grid, families=(dataclasses.replace(grid.families[0], lr_mult=1),))
    run_grid(moved, tmp_path / "o", log=lambda m: None)  # the records stand: nothing runs (done at their rate)
    for path in (tmp_path / "o" / "salad").glob("C*.json"):
        path.rename(tmp_path / path.name)
    with pytest.raises(ConfigError, match="was trained at lr .* but the grid now gives flat lr .* move .* aside"):
        run_grid(moved, tmp_path / "o", log=lambda m: None)
    for path in tmp_path.glob("C*.json"):
        path.rename(tmp_path / "o" / "salad" / path.name)


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


def test_records_of_two_splits_in_one_corpus_are_one_error_line(tmp_path, capsys):
    synthetic_study(tmp_path / "o" / "salad", [1e8], [5000], [0], lambda c: 5e3)
    rec = json.loads((tmp_path / "o" / "salad" / "C1e08__flat__N5000__s0.json").read_text())
    (tmp_path / "o" / "salad" / "C1e08__flat__N5000__s1.json").write_text(json.dumps({**rec, "seed": 1, "split": "val"}))
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"corpora": {"salad": str(tmp_path / "salad")}, "budgets": [1e8],
                                "families": [{"method": "flat", "sizes": [5e3]}]}))
    assert main(["scaling", "--grid", str(grid), "--out", str(tmp_path / "o"), "--fit-only"]) == 2
    assert "several splits (test, val)" in capsys.readouterr().err


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
    assert bad["commit"]  # the code it ran: a diverged run is not taken for one from uncommitted code
    n = len(calls)
    run_grid(grid, out, log=lambda m: None, runner=run)
    assert len(calls) == n  # recorded: not retried
    study = fit_corpus(out / "salad", n_boot=10)
    assert study["flat"].isofits[1e8].interior and len(read_records(out / "salad")) == 2 * 3 * 2 + 2


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


def test_an_override_the_method_sets_again_is_refused_before_any_run(tmp_path, capsys):
    from rltok.analysis.scaling import budget_ladders

    spec = {"corpora": {"salad": str(corpus_folder(tmp_path, "salad"))}, "budgets": [1e8], "preset": "test",
            "families": [{"name": "ws", "method": "uniform", "overrides": ["model.chunker=whitespace"], "sizes": [2e4]}]}
    grid = parse_grid(spec)
    with pytest.raises(ConfigError, match=r"family ws: its method 'uniform' sets model.chunker=uniform itself"):
        budget_ladders(grid, grid.families[0], [1e8], log=lambda m: None)
    (tmp_path / "grid.json").write_text(json.dumps(spec))
    # the command plans every point first: one error, nothing trained
    assert main(["scaling", "--grid", str(tmp_path / "grid.json"), "--out", str(tmp_path / "o")]) != 0
    assert "'model.chunker=whitespace' would be silently replaced" in capsys.readouterr().err
    assert not (tmp_path / "o" / "runs").exists()
    # a grid-wide key a method sets (n-gram rows under +ngram) is refused the same way
    ngram = parse_grid({**spec, "overrides": ["model.ngram_vocab=1024"],
                        "families": [{"method": "uniform+ngram", "sizes": [2e4]}]})
    with pytest.raises(ConfigError, match="ngram_vocab"):
        budget_ladders(ngram, ngram.families[0], [1e8], log=lambda m: None)
    # a key the size ladder sets at each size is refused too
    shaped = parse_grid({**spec, "families": [{"method": "uniform", "overrides": ["model.d_byte=48"], "sizes": [2e4]}]})
    with pytest.raises(ConfigError, match="'model.d_byte=48' sets a key the size ladder sets"):
        budget_ladders(shaped, shaped.families[0], [1e8], log=lambda m: None)
    spelled = parse_grid({**spec, "families": [{"method": "uniform", "overrides": ["model.chunker.kind=whitespace"],
                                                "sizes": [2e4]}]})
    with pytest.raises(ConfigError, match="model.chunker.kind=whitespace"):  # the kind spelled as a key
        budget_ladders(spelled, spelled.families[0], [1e8], log=lambda m: None)
    same = parse_grid({**spec, "families": [{"method": "flat", "overrides": ["model.arch=flat"], "sizes": [2e4]}]})
    assert budget_ladders(same, same.families[0], [1e8], log=lambda m: None)[1e8]  # what the ladder says too
    # saying what the method says, or a key it leaves alone (a sub-key of its rule), is fine
    for fam in ({"method": "whitespace", "overrides": ["model.chunker=whitespace"], "sizes": [2e4]},
                {"method": "rl", "overrides": ["model.chunker.window=8"], "sizes": [2e4]}):
        ok = parse_grid({**spec, "families": [fam]})
        assert budget_ladders(ok, ok.families[0], [1e8], log=lambda m: None)[1e8]


def _curve(budget, values, shares=None):
    """A record's val curve: one evaluation at each share of the run's FLOPs ((1 + k) / len(values)
    unless `shares` says)."""
    shares = shares or [(k + 1) / len(values) for k in range(len(values))]
    return [{"step": 10 * (k + 1), "train_flops": budget * x, "val_bpb": v} for k, (x, v) in enumerate(zip(shares, values))]


TIMING = {"wall_s", "point_wall_s", "bytes_per_s", "eval_wall_s", "train_wall_s", "commit", "date", "command",
          "created", "machine", "seconds", "interrupted_s", "threads", "peak_mem_mb"}


def _untimed(obj):
    """A record or fit without what differs between two runs of the same point (clocks, where it ran)."""
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k not in TIMING and not k.endswith(("_s", "_wall", "per_s"))
                and "dir" not in k and "path" not in k}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def test_two_shards_run_as_processes_merge_into_the_records_and_fits_of_one_process(tmp_path, capsys):
    import subprocess
    import sys

    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(data=corpus_folder(tmp_path, "salad")).replace("budgets = [1e8, 5e8]", "budgets = [1e8]"))
    whole = tmp_path / "whole"
    assert main(["scaling", "--grid", str(grid), "--out", str(whole)]) == 0
    for k in (1, 2):
        proc = subprocess.run([sys.executable, "-m", "rltok.cli", "scaling", "--grid", str(grid), "--out",
                               str(tmp_path / f"shard{k}"), "--shard", f"{k}/2"], capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"shard {k}/2" in proc.stderr and not (tmp_path / f"shard{k}" / "salad" / "fits.json").exists()
    names = [sorted(p.name for p in (tmp_path / f"shard{k}" / "salad").glob("C*.json")) for k in (1, 2)]
    assert names[0] and names[1] and not set(names[0]) & set(names[1])  # disjoint cells, both non-empty
    merged = tmp_path / "merged"
    capsys.readouterr()
    assert main(["scaling", "--grid", str(grid), "--out", str(merged), "--merge", str(tmp_path / "shard1"),
                 str(tmp_path / "shard2")]) == 0
    assert "merged 6 records" in capsys.readouterr().err

    def records(folder):
        return {p.name: _untimed(json.loads(p.read_text())) for p in sorted((folder / "salad").glob("C*.json"))}

    assert records(merged) == records(whole) and len(records(whole)) == 6
    fits = [_untimed(json.loads((f / "salad" / "fits.json").read_text())["families"]) for f in (whole, merged)]
    assert fits[0] == fits[1]
    # merging again is idempotent; a different record of the same point is refused in one line
    assert main(["scaling", "--grid", str(grid), "--out", str(merged), "--merge", str(tmp_path / "shard1")]) == 0
    rec = next((tmp_path / "shard1" / "salad").glob("C*.json"))
    rec.write_text(rec.read_text().replace('"seed": 0', '"seed": 0, "x": 1'))
    capsys.readouterr()
    assert main(["scaling", "--grid", str(grid), "--out", str(merged), "--merge", str(tmp_path / "shard1")]) == 2
    assert "the same point run twice" in capsys.readouterr().err
    assert main(["scaling", "--grid", str(grid), "--out", str(merged), "--shard", "3/2"]) == 2


def test_a_family_may_set_its_own_rules_settings(tmp_path):
    """A family of method `gumbel` with `model.chunker.temperature=0.5` in its overrides: every
    config the harness loads for it has the method's rule under that setting (the base alone, with
    the preset's rule, has no such key)."""
    from rltok.analysis.compare import method_config
    from rltok.analysis.scaling import budget_ladders
    from rltok.analysis.scaling_grid import base_lr, point_lr, run_base

    grid = parse_grid({"corpora": {"salad": "unused"}, "budgets": [1e8], "preset": "test",
                       "families": [{"method": "gumbel", "overrides": ["model.chunker.temperature=0.5"],
                                     "sizes": [2e4], "lr_mult": 2}]})
    fam = grid.families[0]
    (rung,) = budget_ladders(grid, fam, [1e8], log=lambda m: None)[1e8]
    assert point_lr(grid, fam, rung.achieved) == 2 * base_lr(grid, fam) == 2 * load_config("test").train.lr
    cfg = method_config(f"gumbel@{','.join(rung.overrides)}", run_base(grid, fam), "d", tmp_path, 0, "test")
    assert cfg.model.chunker.kind == "gumbel" and cfg.model.chunker.temperature == 0.5
