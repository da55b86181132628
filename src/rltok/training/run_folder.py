"""The run folder's rules: one run per folder, what training writes there when it starts, and
which checkpoints a resume keeps. Rank 0 alone calls what writes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from rltok.training.checkpoint import checkpoint_step, clean_stale, list_checkpoints
from rltok.config import Config, ConfigError


def refuse_other_run(run_dir: Path, resume: bool) -> None:
    """A fresh run may not start in a folder that holds another run's checkpoints."""
    existing = list_checkpoints(run_dir)
    if existing and not resume:
        # a second run in the same folder would mix trajectories, and pruning would delete
        # the new run's checkpoints in favour of the old run's higher steps
        raise ConfigError(f"{run_dir} already holds a run (newest checkpoint: {existing[-1].name}); "
                          "pass --resume to continue it, or choose another --out / train.out_dir")


def tidy_for_resume(run_dir: Path) -> None:
    """Remove what killed checkpoint writers left behind, before the newest checkpoint is chosen."""
    clean_stale(run_dir)


def start(run_dir: Path, cfg: Config) -> None:
    """Create the folder and write the config the run trains with."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))


def set_aside_after(run_dir: Path, resumed: Path, log: Callable[[str], None]) -> None:
    """Checkpoints newer than the one resumed failed verification. Set them aside, so pruning
    and later resumes never mix them with the trajectory that continues from here."""
    for path in list_checkpoints(run_dir):
        if checkpoint_step(path) > checkpoint_step(resumed):
            aside = path.with_name(f"corrupt_{path.name}_{int(time.time())}")
            os.rename(path, aside)
            log(f"warning: set aside unusable checkpoint {path.name} as {aside.name}")
