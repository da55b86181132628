"""Hardening against hostile input and a hostile environment: what the CLI does with hub datasets,
full disks, closed pipes, odd paths, bad flags and settings. Each case ends with exit 0 or one
`error:` line (exit 2), never a traceback, and never costs a checkpoint."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from rltok.cli import main

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
TEXT = b"".join(b"row %d: plain words and punctuation, %x more.\n" % (i, i * 7) for i in range(400))
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1", "train.seq_len=64"]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_user_error(capsys, argv, *messages) -> str:
    code, _, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for m in messages:
        assert m in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "data.txt"
    p.write_bytes(TEXT)
    return p


# ---- hub datasets run no code ----------------------------------------------------------------------

def test_hub_datasets_never_run_a_loading_script(monkeypatch):
    datasets = pytest.importorskip("datasets")
    from rltok.data.sources import open_hub_dataset

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(k) or [])
    open_hub_dataset("someone/a-dataset")
    open_hub_dataset("json:/nowhere/*.json")
    assert len(calls) == 2 and all(k.get("trust_remote_code") is False for k in calls)


def test_the_datasets_floor_runs_no_dataset_scripts_by_default():
    """datasets 2.16-2.19 ran a dataset's own script by default; 3.0 stopped."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    floors = [re.fullmatch(r"datasets>=(\d+)\.(\d+).*", d) for deps in extras.values() for d in deps
              if d.startswith("datasets")]
    assert floors and all(m and (int(m[1]), int(m[2])) >= (3, 0) for m in floors)
