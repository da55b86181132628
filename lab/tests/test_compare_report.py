"""The comparison report's computed verdict (lab/scripts/compare_report.py)."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "compare_report.py"
_spec = importlib.util.spec_from_file_location("compare_report", _PATH)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def row(method, mean, sd, seeds=3):
    return {"method": method, "bpb_mean": mean, "bpb_std": sd, "seeds": seeds}


def test_verdict_beats_ties_and_loses_by_two_seed_sds():
    rows = [row("rl", 2.0, 0.01), row("uniform", 2.1, 0.01), row("fixed", 2.015, 0.01), row("whitespace", 1.9, 0.02)]
    lines = report.verdict(rows, "rl")
    assert any("`rl` beats `uniform`" in line for line in lines)
    assert any("`rl` ties (within 2 std of the seeds) `fixed`" in line for line in lines)
    assert any("`rl` loses to `whitespace`" in line for line in lines)


def test_verdict_finds_the_method_with_overrides():
    rows = [row("rl+ngram+cvocab@model.target_rate=0.158", 2.0, 0.01),
            row("uniform+ngram+cvocab@model.target_rate=0.158", 2.1, 0.01)]
    lines = report.verdict(rows, "rl+ngram+cvocab")
    assert len(lines) == 1 and "beats `uniform+ngram+cvocab@model.target_rate=0.158`" in lines[0]
    # ambiguous or absent: no verdict rather than a guess
    assert report.verdict(rows + [row("rl+ngram+cvocab@model.target_rate=0.2", 2.0, 0.01)], "rl+ngram+cvocab") == []
    assert report.verdict(rows, "rl") == []


def test_tuned_bpe_against_the_best_byte_models_at_equal_flops_and_at_no_more_parameters():
    grid = [{**row("bpe_token@model.bpe_vocab=1024,model.flat_layers=1", 2.70, 0.01), "params": 840_000},
            {**row("bpe_token@model.bpe_vocab=4096,model.flat_layers=3", 2.80, 0.02), "params": 2_900_000}]
    byte = [{**row("flat+ngram", 2.75, 0.01), "params": 25_700_000}, {**row("rl", 3.75, 0.04), "params": 1_660_000},
            {**row("flat", 3.78, 0.02), "params": 540_000}, {**row("bpe_token", 2.89, 0.01), "params": 13_000_000}]
    lines = report.tuned_bpe_against_bytes(grid, byte)
    assert "`bpe_token@model.bpe_vocab=1024,model.flat_layers=1`, 2.7000" in lines[0]
    assert "at equal FLOPs: `flat+ngram`, 2.7500" in lines[1] and "+0.0500" in lines[1] and "+5.0 of" in lines[1]
    # no more parameters than the best BPE-token model's 0.84M: only the plain flat model fits
    assert "no more parameters: `flat`, 3.7800" in lines[2]


def test_byte_models_run_beside_the_grid_count_as_candidates():
    grid = [{**row("bpe_token@model.bpe_vocab=1024,model.flat_layers=1", 2.70, 0.01), "params": 836_160},
            {**row("flat@model.ngram_vocab=380", 2.90, 0.01), "params": 836_160}]
    lines = report.tuned_bpe_against_bytes(grid, [{**row("flat", 3.78, 0.02), "params": 544_320}])
    assert "no more parameters: `flat@model.ngram_vocab=380`, 2.9000" in lines[2]


def test_verdict_pairs_the_difference_by_seed():
    ours = dict(row("rl", 2.0, 0.05), bpb_by_seed={0: 1.95, 1: 2.0, 2: 2.05})
    other = dict(row("uniform", 2.03, 0.05), bpb_by_seed={0: 1.98, 1: 2.02, 2: 2.09})
    line = report.verdict([ours, other], "rl")[0]
    assert "ties" in line  # unpaired: inside two seed sds
    assert "paired by seed +0.0300 ± 0.0100 over 3" in line  # paired: each seed 0.02-0.04 apart
    assert "paired" not in report.verdict([ours, dict(other, bpb_by_seed={5: 2.0})], "rl")[0]


def test_byte_models_from_several_sections_count_each_run_once(tmp_path):
    import json
    for folder, seeds in (("embedding/b4", [0]), ("boundaries_vocab/b4", [0, 1, 2])):
        d = tmp_path / folder / "code-py"
        d.mkdir(parents=True)
        for s in seeds:
            (d / f"whitespace+ngram_s{s}.json").write_text(json.dumps({"method": "whitespace+ngram", "seed": s}))
        (d / "flat_s0.json").write_text(json.dumps({"method": "flat", "seed": 0, "folder": folder}))
    runs = report.byte_model_runs(("embedding/b4", "boundaries_vocab/b4"), "code-py", tmp_path)
    assert sorted((r["method"], r["seed"]) for r in runs) == [("flat", 0), ("whitespace+ngram", 0),
                                                                ("whitespace+ngram", 1), ("whitespace+ngram", 2)]
    assert next(r for r in runs if r["method"] == "flat")["folder"] == "embedding/b4"  # the first section wins


def test_one_seed_on_both_sides_is_an_order_not_a_verdict():
    lines = report.verdict([row("rl", 2.0, None, seeds=1), row("uniform", 2.1, None, seeds=1)], "rl")
    assert "is ahead of (one seed each" in lines[0] and "beats" not in lines[0]
