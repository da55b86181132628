"""The run folders an instrument is given: a study point resolves to its one trainer folder, a
trainer or model folder to itself, and a point holding two trainer folders is an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from rltok_lab.run_folders import expand, trainer_folder


def test_a_point_resolves_to_its_one_trainer_folder(tmp_path):
    point = tmp_path / "C3e12__rl__N100__s0"
    (point / "rl_s0" / "checkpoints").mkdir(parents=True)
    (point / "notes").mkdir()  # a folder without checkpoints is not a trainer folder
    assert trainer_folder(point) == point / "rl_s0"
    assert trainer_folder(point / "rl_s0") == point / "rl_s0"
    model = tmp_path / "exported"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert trainer_folder(model) == model
    (point / "rl_s1" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds 2 run folders .*rl_s0, rl_s1"):
        trainer_folder(point)


def test_patterns_expand_sorted_and_paths_stay_as_given(tmp_path):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
    assert expand([str(tmp_path / "*"), "not/there"]) == [tmp_path / "a", tmp_path / "b", Path("not/there")]
