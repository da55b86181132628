"""The CPU study runs over many sessions: every ladder its grid file builds today must be the one its
finished runs trained, or a change to the shape rule (or to the grid) would silently mix two ladders
in one study. Checked against the study's committed records."""
from pathlib import Path

import pytest

from rltok.analysis.scaling import RESULTS_GLOB, budget_ladders, budget_tag, load_grid
from rltok.model.sizing import method_spec
from rltok_lab import records

REPO = Path(__file__).resolve().parents[2]  # the repository
GRID = REPO / "lab" / "scripts" / "scaling_cpu_grid.toml"
RECORDS = REPO / "lab" / "results" / "scaling"  # its packed records, one file per corpus


@pytest.mark.skipif(not RECORDS.is_dir(), reason="the study's records are not in this checkout")
def test_the_cpu_grid_builds_the_ladders_its_records_ran():
    grid = load_grid(GRID)
    checked = 0
    for corpus in grid.corpora:
        runs = [r for r in records.load("scaling", corpus, RESULTS_GLOB) if r.get("point_kind", "ladder") == "ladder"]
        for fam in grid.families:
            ladders = budget_ladders(grid, fam, grid.budgets, log=lambda message: None)
            for budget, rungs in ladders.items():
                by_target = {rung.target: rung for rung in rungs}
                for rec in runs:
                    if rec["family"] != fam.name or rec["budget_flops"] != budget:
                        continue
                    where = f"{corpus} {budget_tag(budget)} {fam.name} N {rec['target_size']:.0f} s{rec['seed']}"
                    rung = by_target.get(rec["target_size"])
                    assert rung is not None, f"{where}: no such rung in today's ladder"
                    assert rec["method"] == method_spec(fam.method, rung.overrides), where
                    assert rec["non_embedding_params"] == rung.achieved, where
                    checked += 1
    assert checked >= 4 * 9 * 5 * 2 * 2  # four finished budgets' ladders, 9 families, 2 seeds, 2 corpora
