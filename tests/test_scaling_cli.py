"""`rltok scaling`: a tiny grid runs end to end (a JSON per run with the study's fields), a
second invocation skips every finished point, and the fit writes fits.json and the plots."""

from __future__ import annotations

import json

import pytest

from conftest import corpus_folder
from rltok.analysis.scaling import budget_tag, load_grid, parse_grid
from rltok.cli import main
from rltok.config import ConfigError

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

    grid = load_grid(Path(__file__).resolve().parents[1] / "scripts" / "scaling_gpu_grid.toml")
    assert min(grid.budgets) == 1e15 and max(grid.budgets) == 1e18
    for fam in grid.families:
        assert method_overrides(fam.method) and len(fam.sizes) >= 5
    assert grid.groups["hierarchy"] == ("uniform", "whitespace", "rl")
    assert ("bytes", "bpe_token") in grid.crossovers
