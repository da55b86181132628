"""Run folders named on an instrument's command line: patterns expanded, a study point's folder
resolved to the trainer folder inside it."""

from __future__ import annotations

import glob
from pathlib import Path


def expand(patterns: list[str]) -> list[Path]:
    """The folders the arguments name: a quoted pattern with * expanded (sorted), a path as given."""
    return [Path(r) for p in patterns for r in (sorted(glob.glob(p)) if "*" in p else [p])]


def trainer_folder(path: Path) -> Path:
    """A study point's folder holds one trainer folder (METHOD_sSEED); a trainer folder is itself."""
    inner = [p for p in Path(path).glob("*_s*") if p.is_dir()]
    return inner[0] if len(inner) == 1 and not (Path(path) / "config.json").exists() else Path(path)
