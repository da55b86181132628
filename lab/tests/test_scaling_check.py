"""`rltok scaling --check-optimum`: each family's best size of a budget run again at other
multiples of the learning-rate rule's rate and with variant overrides, scored against the study's
own runs there (paired by seed), resumable, one table per budget."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from conftest import corpus_folder
from rltok.analysis.scaling import parse_grid, read_records
from rltok.analysis.scaling_adapt import run_grid
from rltok_lab.scaling_check import (FOLDER, check_markdown, optimum_points, parse_variant,
                                          run_optimum_check)
from lab_cli import main
from rltok.config import ConfigError


def lr_runner(best_mult: float, full_cost: float):
    """A stand-in for run_point: bpb a parabola in ln N (minimum at 2e4) and in ln(lr multiple)
    (minimum at `best_mult`), `full_cost` more with full attention, a seed offset."""
    calls = []

    def run(grid, p, folder, split):
        calls.append(p.stem)
        n = p.rung.achieved
        bpb = (2.0 + 0.05 * math.log(n / 2e4) ** 2 + 0.1 * math.log(p.family.lr_mult / best_mult) ** 2
               + 0.01 * p.seed + (full_cost if "model.flat_window=0" in p.family.overrides else 0.0))
        return {"family": p.family.name, "budget_flops": p.budget, "target_size": p.rung.target, "seed": p.seed,
                "non_embedding_params": n, "ladder_params": n, "bpb": bpb + 0.1, "bpb_select": bpb,
                "split": split, "wall_s": 0.0, "point_kind": p.kind, "lr_mult": p.family.lr_mult}
    return run, calls


def grid_of(data):
    return parse_grid({"corpora": {"salad": str(data)}, "budgets": [1e8], "seeds": [0, 1], "preset": "test",
                       "select_split": "val", "optimum_seeds": [2],
                       "families": [{"method": "flat", "sizes": [5e3, 2e4, 8e4],
                                     "overrides": ["model.flat_window=16"]}]})


@pytest.mark.parametrize("best_mult, holds", [(1.0, True), (2.0, False)])
def test_the_rule_is_checked_at_the_optimum_and_variants_are_paired(tmp_path, best_mult, holds):
    grid, out = grid_of(corpus_folder(tmp_path, "salad")), tmp_path / "study"
    run, calls = lr_runner(best_mult, full_cost=0.03)
    run_grid(grid, out, log=lambda m: None, runner=run)
    full = parse_variant("flat_full=flat:model.flat_window=0")
    assert full.overrides == ("model.flat_window=0",)
    result = run_optimum_check(grid, out, 1e8, (0.5, 2.0), [full], log=lambda m: None, runner=run)
    checked = sorted(p.name for p in (out / FOLDER / "salad").glob("C*.json"))
    assert checked == [f"C1e08__{name}__N20000__s{s}.json" for name in ("flat_full", "flat_lr0.5", "flat_lr2")
                       for s in (0, 1)]  # the best size only, the grid's seeds
    (row,) = result["rule"]
    assert row["mults"] == [0.5, 1.0, 2.0] and row["seeds"] == [0, 1]  # seed 2 ran at 1x only
    assert row["holds"] is holds and row["best_mult"] == best_mult
    assert row["rule_gap"] == pytest.approx(0.0 if holds else 0.1 * math.log(2) ** 2)
    assert row["test"][1] == pytest.approx(row["select"][1] + 0.1)  # the reported split beside the choice
    (var,) = result["variants"]
    assert var["select"]["mean"] == pytest.approx(0.03) and var["bpb"]["seeds"] == [0, 1]
    md = (out / FOLDER / "C1e08.md").read_text()
    assert md == check_markdown(result) and "| salad | flat | 1 |" in md and "| salad | flat_full | flat |" in md
    assert f"holds for {int(holds)} of 1 families" in md
    n = len(calls)
    run_optimum_check(grid, out, 1e8, (0.5, 2.0), [full], log=lambda m: None, runner=run)
    assert len(calls) == n  # resumable: nothing ran twice
    assert len(read_records(out / "salad")) == 3 * 2 + 1  # the study's folder holds the study only


def test_a_check_needs_the_study_and_names_known_families(tmp_path):
    grid, out = grid_of(corpus_folder(tmp_path, "salad")), tmp_path / "study"
    with pytest.raises(ConfigError, match="no runs at budget"):
        optimum_points(grid, out, 1e8)
    run, _ = lr_runner(1.0, 0.0)
    run_grid(grid, out, log=lambda m: None, runner=run)
    with pytest.raises(ConfigError, match="no family 'bpe'"):
        optimum_points(grid, out, 1e8, variants=[parse_variant("x=bpe:model.bpe_vocab=64")])
    with pytest.raises(ConfigError, match="NAME=FAMILY"):
        parse_variant("flat:model.flat_window=0")
    with pytest.raises(ConfigError, match="not 1"):
        run_optimum_check(grid, out, 1e8, (1.0,), log=lambda m: None, runner=run)


def test_the_check_runs_from_the_command_line(tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"corpora": {"salad": str(corpus_folder(tmp_path, "salad"))}, "budgets": [1e8],
                                "preset": "test", "max_eval_windows": 2, "select_split": "val",
                                "lr_rule": {"lr_ref": 3e-3, "n_ref": 1e4, "exponent": 0.3},
                                "families": [{"method": "flat", "sizes": [5e3, 2e4]}]}))
    args = ["scaling", "--grid", str(grid), "--out", str(tmp_path / "o")]
    assert main(args) == 0
    assert main([*args, "--check-optimum", "1e8", "--lr-mults", "0.5", "--policy-lr-mults", "0.5", "--variant",
                 "flat_w8=flat:model.flat_window=8"]) == 0
    out = capsys.readouterr().out
    assert "| salad | flat | 1 |" in out and "| salad | flat_w8 | flat | model.flat_window=8 |" in out
    recs = read_records(tmp_path / "o" / FOLDER / "salad")
    half = [r for r in recs if r["family"] == "flat_lr0.5"]
    study = [r for r in read_records(tmp_path / "o" / "salad") if r["target_size"] == half[0]["target_size"]]
    assert half[0]["lr"] == pytest.approx(0.5 * study[0]["lr"], rel=1e-12)  # half the rule's rate, same size
    assert half[0]["non_embedding_params"] == study[0]["non_embedding_params"]
    saved = json.loads((tmp_path / "o" / FOLDER / "C1e08.json").read_text())
    assert "--check-optimum 1e+08" in saved["command"] or "--check-optimum 1e8" in saved["command"]
    assert "--policy-lr-mults 0.5" in saved["command"] and saved["policy_mults"] == [0.5]
    assert not [r for r in recs if "_plr" in r["family"]]  # the flat model has no boundary rule to rate
    assert main([*args, "--variant", "x=flat"]) == 2 and "--check-optimum" in capsys.readouterr().err


def test_a_check_of_some_families_keeps_the_rows_of_the_others(tmp_path, capsys):
    grid = parse_grid({"corpora": {"salad": str(corpus_folder(tmp_path, "salad"))}, "budgets": [1e8], "seeds": [0, 1],
                       "preset": "test", "select_split": "val",
                       "families": [{"name": name, "method": "flat", "sizes": [5e3, 2e4, 8e4]} for name in ("a", "b")]})
    out = tmp_path / "study"
    run, calls = lr_runner(1.0, 0.0)
    run_grid(grid, out, log=lambda m: None, runner=run)
    run_optimum_check(grid, out, 1e8, (0.5,), log=lambda m: None, runner=run)
    first = json.loads((out / FOLDER / "C1e08.json").read_text())["rule"]
    only_b = dataclasses.replace(grid, families=tuple(f for f in grid.families if f.name == "b"))
    n = len(calls)
    result = run_optimum_check(only_b, out, 1e8, (0.5, 2.0), log=lambda m: None, runner=run)
    assert len(calls) == n + 2  # b at 2x, its two seeds; b at 0.5x ran already
    rows = json.loads((out / FOLDER / "C1e08.json").read_text())["rule"]
    assert [r["family"] for r in rows] == ["a", "b"] and rows[0] == first[0] and rows == result["rule"]
    assert rows[1]["mults"] == [0.5, 1.0, 2.0]
    # from the command line: --family names the grid's families and goes with --check-optimum
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"corpora": {"salad": str(tmp_path / "salad")}, "budgets": [1e8],
                                "families": [{"name": "a", "method": "flat", "sizes": [5e3]}]}))
    args = ["scaling", "--grid", str(path), "--out", str(out)]
    assert main([*args, "--family", "a"]) == 2 and "--check-optimum" in capsys.readouterr().err
    assert main([*args, "--check-optimum", "1e8", "--family", "zz"]) == 2 and "families are a" in capsys.readouterr().err
    from types import SimpleNamespace

    from rltok_lab.cli import _scaling_command
    said = _scaling_command(SimpleNamespace(grid="g", out="o", corpus=None, check_optimum=1e8, lr_mults=[0.5],
                                            variant=[], tolerance=0.02, family=["a", "b"], fit_only=False))
    assert said.endswith("--family a b")  # the table's command reruns the same check


def _policy_mult(p) -> float:
    return next((float(o.split("=")[1]) for o in p.family.overrides if o.startswith("objective.policy_lr_mult=")), 1.0)


def test_policy_rates_diverged_settings_both_corpora_and_an_unfinished_budget(tmp_path):
    """R2's check as the rivals study runs it: the policy's own rate only where the rule has
    parameters, a setting that diverges kept as the worst, the decision over both corpora read
    together, and no check of a budget that is still running."""
    grid = parse_grid({"corpora": {"a": str(corpus_folder(tmp_path, "a")), "b": str(corpus_folder(tmp_path, "b"))},
                       "budgets": [1e8], "seeds": [0, 1], "preset": "test", "select_split": "val",
                       "families": [{"method": "uniform", "sizes": [5e3, 2e4, 8e4]},
                                    {"method": "rl", "sizes": [5e3, 2e4, 8e4]}]})
    base, _ = lr_runner(1.0, 0.0)
    best_policy = {"a": 2.0, "b": 1.0}  # corpus a wants twice the policy's rate, b its own

    def run(grid, p, folder, split):
        rec = base(grid, p, folder, split)
        if p.family.lr_mult == 2.0 and p.family.name.startswith("uniform"):  # uniform breaks down at 2x
            return {**rec, "bpb": None, "bpb_select": None, "diverged": "non-finite loss"}
        shift = 0.1 * math.log(_policy_mult(p) / best_policy[p.corpus]) ** 2 if p.family.name.startswith("rl") else 0
        return {**rec, "bpb": rec["bpb"] + shift, "bpb_select": rec["bpb_select"] + shift}

    out = tmp_path / "study"
    run_grid(grid, out, log=lambda m: None, runner=run)
    gone = sorted((out / "a").glob("C1e08__rl__N5000__s1.json"))[0]
    kept = gone.read_text()
    gone.unlink()
    with pytest.raises(ConfigError, match="a: the study at 1e\\+08 is not complete"):
        run_optimum_check(grid, out, 1e8, (0.5, 2.0), log=lambda m: None, runner=run, policy_mults=(0.5, 2.0))
    gone.write_text(kept)
    result = run_optimum_check(grid, out, 1e8, (0.5, 2.0), log=lambda m: None, runner=run, policy_mults=(0.5, 2.0))
    names = {p.name.split("__")[1] for p in (out / FOLDER / "a").glob("C*.json")}
    assert names == {"uniform_lr0.5", "uniform_lr2", "rl_lr0.5", "rl_lr2", "rl_plr0.5", "rl_plr2"}  # uniform has no policy
    rows = {(r["corpus"], r["family"]): r for r in result["rule"]}
    uni = rows["a", "uniform"]
    assert uni["diverged"] == ["lr 2x"] and uni["seeds"] == [0, 1] and uni["holds"] and uni["select"][2] is None
    assert rows["a", "rl"]["best"] == "policy 2x" and not rows["a", "rl"]["holds"]
    assert rows["b", "rl"]["holds"] and rows["b", "rl"]["policy_mults"] == [0.5, 2.0]
    md = (out / FOLDER / "C1e08.md").read_text()
    assert "| a | uniform | 1 |" in md and "diverged" in md and "## Over the corpora together" in md
    # over both corpora: policy 2x gains 0.048 on a and loses 0.048 on b: rl keeps its rates
    from rltok_lab.scaling_check import pooled_decisions

    pooled = {d["family"]: d for d in pooled_decisions(result["rule"], 0.02)}
    assert pooled["rl"]["keeps"] and pooled["rl"]["corpora"] == ["a", "b"] and pooled["uniform"]["keeps"]
    assert pooled["uniform"]["select"]["lr 2x"] is None  # diverged on both: the worst, not a number
    saved = json.loads((out / FOLDER / "C1e08.json").read_text())
    assert saved["policy_mults"] == [0.5, 2.0] and {d["family"]: d["keeps"] for d in saved["pooled"]} == {"uniform": True,
                                                                                                        "rl": True}
    # where the corpora together want another setting by more than the tolerance, the family moves
    # even though one corpus alone keeps it: a wants policy 2x by 0.048, b is indifferent within 0.01
    rows = [{"corpus": c, "family": "rl", "mults": [1.0], "select": [base], "policy_mults": [2.0],
             "policy_select": [two], "diverged": []} for c, base, two in (("a", 2.048, 2.0), ("b", 2.016, 2.008))]
    (moves,) = pooled_decisions(rows, 0.02)
    assert not moves["keeps"] and moves["best"] == "policy 2x" and moves["rule_gap"] == pytest.approx(0.028)
