"""A tiny scaling study run for real (one budget, two sizes, two seeds, flat bytes and two boundary
rules) for the lab's tests that read a grid's results folder and its run folders."""

from __future__ import annotations

from conftest import corpus_folder
from rltok.cli import main as rltok_main

GRID = """
budgets = [3e8]
seeds = [0, 1]
split = "test"
preset = "test"
max_eval_windows = 2
interior_only = false
overrides = ["model.target_rate=0.25"]
crossovers = [["uniform", "flat"]]

[corpora]
salad = "{data}"

[[families]]
method = "flat"
sizes = [2e4, 5e4]

[[families]]
method = "rl"
sizes = [2e4, 5e4]

[[families]]
method = "uniform"
sizes = [2e4, 5e4]
"""


def tiny_study(tmp_path):
    """-> (grid file, results folder) of the study above, every point run."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(data=corpus_folder(tmp_path, "salad")))
    out = tmp_path / "study"
    assert rltok_main(["scaling", "--grid", str(grid), "--out", str(out)]) == 0
    return grid, out
