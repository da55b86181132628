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


# What a resume may change: how long the run goes, how often it logs, evaluates and
# checkpoints, where it runs and where its metrics go. Anything else would continue a
# different run than the one the checkpoints belong to.
MAY_CHANGE_ON_RESUME = ("train.max_steps", "train.log_every", "train.eval_every", "train.eval_batches",
                        "train.checkpoint_every", "train.keep_checkpoints", "train.threads", "train.device",
                        "train.tensorboard", "train.wandb", "train.out_dir", "train.schedule_on_resume")


def saved_config(run_dir: str | Path) -> dict | None:
    """The config a run folder's run was started with (its config.json), or None without one."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the run's config {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a config")
    return data


def absolute_data(cfg: Config) -> Config:
    """The data sources as absolute paths: a run folder's config.json names the same data from
    any working directory, and a resume compares paths, not spellings."""
    from rltok.data.sources import absolute_spec

    cfg.data.train, cfg.data.val = absolute_spec(cfg.data.train), absolute_spec(cfg.data.val)
    return cfg


def _with_absolute_data(saved: dict) -> dict:
    data = dict(saved.get("data") or {})
    from rltok.data.sources import absolute_spec

    for key in ("train", "val"):
        if isinstance(data.get(key), str):
            data[key] = absolute_spec(data[key])
    return {**saved, "data": data}


def require_run_folder(run_dir: str | Path) -> None:
    """`--resume` continues a run: a folder that holds none (a typo) is an error naming what is
    missing, never a fresh run."""
    path = Path(run_dir)
    if not path.exists():
        raise ConfigError(f"--resume: there is no run folder {path} (no such folder); check --out, or drop "
                          "--resume to start a new run there")
    if not path.is_dir():
        raise ConfigError(f"--resume: {path} is a file, not a run folder")
    if not (path / "config.json").is_file():
        what = "checkpoints/ but no config.json" if (path / "checkpoints").is_dir() else "no config.json and no checkpoints/"
        raise ConfigError(f"--resume: {path} is not a run folder: it holds {what} (what `rltok train --out` "
                          "writes when a run starts)")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(saved: dict, cfg: Config) -> dict[str, tuple]:
    """Keys (section.key) whose value in `cfg` differs from the saved config, outside those a
    resume may change: key -> (saved value, new value)."""
    old, new = _flat(saved), _flat(json.loads(json.dumps(cfg.to_dict())))
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if k not in MAY_CHANGE_ON_RESUME and old.get(k) != new.get(k)}


def resume_config(run_dir: str | Path, saved: dict, preset: str | None, file: str | None, overrides: list[str],
                  allow_change: bool = False) -> Config:
    """The config a `--resume` continues with: the run's own saved config with the overrides
    given on top (or, with an explicit preset, that preset's config). Any difference outside
    MAY_CHANGE_ON_RESUME is refused, listing the keys, unless `allow_change`."""
    from rltok.config import _read_config_file, apply_dict, apply_override, load_config

    if preset is not None:
        cfg = load_config(preset, file, overrides)
    else:
        cfg = Config.from_dict(saved)
        if file:
            apply_dict(cfg, _read_config_file(file))
        for ov in overrides:
            apply_override(cfg, ov)
        cfg.validate()
    absolute_data(cfg)
    changes = config_changes(_with_absolute_data(saved), cfg)
    if changes and not allow_change:
        listed = ", ".join(f"{k} ({old!r} -> {new!r})" for k, (old, new) in changes.items())
        shown = "; ".join(f"{k}" for k in MAY_CHANGE_ON_RESUME)
        raise ConfigError(f"--resume continues the run in {run_dir} with its own config, but these keys differ "
                          f"from it: {listed}. Only {shown} may change on a resume; pass "
                          "--allow-config-change to continue with the changed config anyway")
    return cfg
