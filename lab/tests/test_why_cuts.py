"""`python -m rltok_lab why-cuts`: a grid's hierarchies read at their val-chosen size with the true
advantage, and the placement arithmetic on cases with known answers."""

from __future__ import annotations

import json

import pytest

from rltok_lab.cli import main as lab_main
from rltok_lab.true_advantage import CLASSES
from rltok_lab.why_cuts import placement_values
from tiny_study import tiny_study


def _classes(cands, cuts, ds):
    return {c: {"candidates": n, "cuts": k, "mean_D": d} for c, n, k, d in zip(CLASSES, cands, cuts, ds)}


def test_placement_against_random_cuts_and_the_best_class_level_placement():
    # two classes: 100 candidates at D = 1, 300 at D = 0; random placement is worth 0.25 per cut
    cands, ds = [100, 300, 0, 0, 0, 0, 0], [1.0, 0.0, None, None, None, None, None]
    rule, best = placement_values(_classes(cands, [50, 50, 0, 0, 0, 0, 0], ds))
    assert rule == pytest.approx(0.5 - 0.25) and best == pytest.approx(1.0 - 0.25)
    # more cuts than the best class holds: the rest fall in the next class
    rule, best = placement_values(_classes(cands, [0, 200, 0, 0, 0, 0, 0], ds))
    assert rule == pytest.approx(-0.25) and best == pytest.approx(100 / 200 - 0.25)
    assert placement_values(_classes(cands, [0] * 7, ds)) == (0.0, 0.0)


def test_why_cuts_reads_each_hierarchy_at_its_chosen_size_from_its_run_folders(tmp_path, capsys):
    grid, out = tiny_study(tmp_path)
    capsys.readouterr()
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- why-cuts:begin -->\nold\n<!-- why-cuts:end -->\nafter\n")
    args = ["why-cuts", "--grid", str(grid), "--out", str(out), "--budget", "3e8", "--per-class", "4",
            "--batch", "2", "--json", str(tmp_path / "why.json")]
    assert lab_main([*args, "--splice", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n<!-- why-cuts:begin -->") and text.endswith("<!-- why-cuts:end -->\nafter\n")
    assert "old" not in text and "| rl |" in text and "| uniform |" in text and "| flat |" not in text
    readings = json.loads((tmp_path / "why.json").read_text())["readings"]
    assert {r["family"] for r in readings} == {"rl", "uniform"}  # flat bytes have no cuts to read
    records = [json.loads(p.read_text()) for p in (out / "salad").glob("C*.json")]
    for r in readings:
        assert r["seeds"] == [0, 1]
        assert r["size"] in {rec["non_embedding_params"] for rec in records if rec["family"] == r["family"]}
        cls = r["classes"]
        assert sum(c["candidate_share"] for c in cls.values()) == pytest.approx(1.0)
        assert all(0 <= c["cut_rate"] <= 1 for c in cls.values() if c["cut_rate"] is not None)
        assert sum(c["n"] for c in cls.values()) > 0 and r["mean_abs_d"] >= 0
    # the uniform rule cuts every 4th byte whatever the bytes: its cut rate is near 0.25 in every common class
    uniform = next(r for r in readings if r["family"] == "uniform")
    assert sum(c["cuts"] for c in uniform["classes"].values()) / sum(
        c["candidates"] for c in uniform["classes"].values()) == pytest.approx(0.25, abs=0.03)

    # --per-seed: a row per seed of the same cells
    assert lab_main([*args, "--families", "rl", "--per-seed"]) == 0
    per_seed = json.loads((tmp_path / "why.json").read_text())["readings"]
    rl = next(r for r in readings if r["family"] == "rl")
    assert [(r["family"], r["seeds"], r["size"]) for r in per_seed] == [("rl s0", [0], rl["size"]),
                                                                       ("rl s1", [1], rl["size"])]
    assert sum(r["classes"]["mid_word"]["cuts"] for r in per_seed) == rl["classes"]["mid_word"]["cuts"]

    # an output that cannot be written is refused before any checkpoint is read
    folder_as_json = [a if a != str(tmp_path / "why.json") else str(tmp_path) for a in args]
    assert lab_main(folder_as_json) != 0 and "is a folder" in capsys.readouterr().err

    # a record whose run folder lost its checkpoints is one clear error, not a traceback
    import shutil

    for ckpt in (out / "salad" / "runs").glob("C*__rl__*__s0/*/checkpoints"):
        shutil.rmtree(ckpt)
    assert lab_main([*args, "--families", "rl"]) != 0
    err = capsys.readouterr().err
    assert "no checkpoints" in err and "Traceback" not in err
