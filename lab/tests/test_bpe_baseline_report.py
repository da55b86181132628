"""The comparison report script's BPE baseline rows (lab/scripts/compare_report.py)."""

from __future__ import annotations

import importlib.util
import json
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
from rltok_lab import records

REPO = Path(__file__).resolve().parents[2]
TEXT = b"".join(b"def f%d(x):\n    return x * %d  # the quick brown fox jumps\n" % (i, i * 7) for i in range(1200))


def train_bytes() -> torch.Tensor:
    return torch.frombuffer(bytearray(TEXT), dtype=torch.uint8)


def run(method, bpb, **extra):
    r = {"method": method, "seed": 0, "bpb": bpb, "rate": 0.25, "bytes_per_chunk": 4.0, "space_align": None,
         "train_flops_per_byte": 1e6, "train_flops": 1e12, "budget_flops": 1e12, "train_bytes": 1e6,
         "train_bytes_per_s": 5e3, "params": 2_000_000, "state_mb": 30.0, "peak_mem_mb": 500.0}
    return {**r, **extra}


def table_row(table: str, method: str) -> list[str]:
    header = table.splitlines()[0].split("|")[1:-1]
    line = next(x for x in table.splitlines() if x.startswith(f"| {method} |"))
    return dict(zip((h.strip() for h in header), (c.strip() for c in line.split("|")[1:-1])))


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

