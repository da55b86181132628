"""Run folders named on an instrument's command line: patterns expanded, a study point's folder
resolved to the trainer folder inside it."""

from __future__ import annotations

import glob
from pathlib import Path


def expand(patterns: list[str]) -> list[Path]:
    """The folders the arguments name: a quoted pattern with * expanded (sorted), a path as given."""
    return [Path(r) for p in patterns for r in (sorted(glob.glob(p)) if "*" in p else [p])]


def trainer_folder(path: Path) -> Path:
    """A study point's folder holds one trainer folder (METHOD_sSEED, with checkpoints/); a trainer
    or model folder is itself. Two trainer folders in one point are an error, not a guess."""
    path = Path(path)
    if (path / "checkpoints").is_dir() or (path / "config.json").exists() or not path.is_dir():
        return path
    inner = sorted(p for p in path.iterdir() if (p / "checkpoints").is_dir())
    if len(inner) > 1:
        raise ValueError(f"{path} holds {len(inner)} run folders ({', '.join(p.name for p in inner)}); name one")
    return inner[0] if inner else path
