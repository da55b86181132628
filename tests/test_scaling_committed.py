"""A grid with `committed_only`: its points run from committed code, or (allowed) their records are
marked and left out of every fit and table, and rerun once the tree is committed."""

import json
from types import SimpleNamespace

import pytest

from rltok.analysis import compare, scaling
from rltok.cli import main
from rltok.config import ConfigError

GRID = """
budgets = [1e8]
seeds = [0]
preset = "test"
committed_only = {flag}
[corpora]
salad = "{data}"
[[families]]
method = "flat"
sizes = [5e3]
"""


def _grid(tmp_path, flag="true"):
    (tmp_path / "data").mkdir(exist_ok=True)
    path = tmp_path / "grid.toml"
    path.write_text(GRID.format(flag=flag, data=tmp_path / "data"))
    return path


def test_a_dirty_tree_is_refused_unless_allowed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "git_commit", lambda: "abc1234+dirty")
    grid = scaling.load_grid(_grid(tmp_path))
    assert grid.committed_only
    with pytest.raises(ConfigError, match="committed_only.*abc1234.*--allow-dirty"):
        scaling.check_committed(grid)
    scaling.check_committed(grid, allow_dirty=True)
    # from the command line: one error line, before any run
    assert main(["scaling", "--grid", str(_grid(tmp_path)), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--allow-dirty" in err[0] and not (tmp_path / "out" / "salad").exists()
    # clean, or a grid that does not ask: no refusal
    monkeypatch.setattr(compare, "git_commit", lambda: "abc1234")
    scaling.check_committed(grid)
    monkeypatch.setattr(compare, "git_commit", lambda: "abc1234+dirty")
    scaling.check_committed(scaling.load_grid(_grid(tmp_path, "false")))


def test_committed_only_is_true_or_false(tmp_path):
    with pytest.raises(ConfigError, match="committed_only is true or false"):
        scaling.load_grid(_grid(tmp_path, '"yes"'))


def test_a_record_from_a_dirty_tree_is_marked_left_out_and_rerun_once_clean(tmp_path, monkeypatch):
    grid = scaling.load_grid(_grid(tmp_path))
    monkeypatch.setattr(scaling, "_run_point", lambda *a: {"commit": "abc1234+dirty", "bpb": 1.0})
    point = scaling.Point("salad", 1e8, SimpleNamespace(name="flat"), SimpleNamespace(target=5e3), 0, "ladder")
    rec = scaling.run_point(grid, point, tmp_path, "test")
    assert rec["excluded"] == scaling.UNCOMMITTED
    (tmp_path / "salad").mkdir()
    (tmp_path / "salad" / f"{point.stem}.json").write_text(json.dumps(rec))
    assert scaling.read_records(tmp_path / "salad") == []  # no fit or table reads it
    monkeypatch.setattr(compare, "git_commit", lambda: "abc1234+dirty")
    assert scaling.point_done(tmp_path, point)  # still dirty: not run again and again
    monkeypatch.setattr(compare, "git_commit", lambda: "def5678")
    assert not scaling.point_done(tmp_path, point)  # committed now: the point runs again
    # a clean record under the same grid is not marked
    monkeypatch.setattr(scaling, "_run_point", lambda *a: {"commit": "def5678", "bpb": 1.0})
    assert "excluded" not in scaling.run_point(grid, point, tmp_path, "test")
