"""The comparison report's computed verdict (scripts/compare_report.py)."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "compare_report.py"
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
