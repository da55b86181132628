"""The comparison report script's BPE baseline rows (lab/scripts/compare_report.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from rltok_lab import records
from test_bpe_baseline import table_row  # the library tests' helpers

REPO = Path(__file__).resolve().parents[2]  # the repository


def test_report_renders_committed_runs_without_the_new_fields(tmp_path):
    spec = importlib.util.spec_from_file_location("compare_report", REPO / "lab" / "scripts" / "compare_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    dest = tmp_path / "results" / "compare" / "code-py"
    for name in ("bpe_token_s0.json", "bpe_token_s1.json"):  # the committed records, packed
        assert "depth" not in json.loads(records.extract("compare", f"code-py/{name}", dest).read_text())
    md = "\n".join(report.render_corpus("compare", "code-py", tmp_path / "runs", True, None, "gap",
                                        tmp_path / "results"))
    row = table_row(md[md.index("| method |"):], "bpe_token")
    assert (row["depth"], row["width"], row["vocab"]) == ("–", "–", "–")

