"""The comparison report script's BPE baseline rows (lab/scripts/compare_report.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import tiny_model_config
from rltok.analysis.compare import (markdown_table, matched_flat_layers, method_config, method_overrides,
                                    model_shape, summarize)
from rltok.config import ConfigError, load_config
from rltok.data.bpe import fit_bpe_to_rate, train_bpe, truncate_bpe
from rltok.data.sources import Corpus
from rltok.model.factory import build_model
from rltok.model.flops import attention_flops, block_linear_flops, config_forward_flops_per_byte, train_flops_per_byte
from rltok.training.trainer import Trainer
from test_bpe_baseline import table_row  # the library tests' helpers

REPO = Path(__file__).resolve().parents[2]  # the repository


def test_report_renders_committed_runs_without_the_new_fields(tmp_path):
    spec = importlib.util.spec_from_file_location("compare_report", REPO / "lab" / "scripts" / "compare_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    src = REPO / "lab" / "results" / "compare" / "code-py"
    dest = tmp_path / "results" / "compare" / "code-py"
    dest.mkdir(parents=True)
    for name in ("bpe_token_s0.json", "bpe_token_s1.json"):
        assert "depth" not in json.loads((src / name).read_text())
        shutil.copy(src / name, dest / name)
    md = "\n".join(report.render_corpus("compare", "code-py", tmp_path / "runs", True, None, "gap",
                                        tmp_path / "results"))
    row = table_row(md[md.index("| method |"):], "bpe_token")
    assert (row["depth"], row["width"], row["vocab"]) == ("–", "–", "–")

