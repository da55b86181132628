"""The run folder's rules: one run per folder, what training writes there when it starts, and
which checkpoints a resume keeps. Rank 0 alone calls what writes."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from rltok.config import Config, ConfigError, apply_dict, apply_override, load_config
from rltok.config.files import read_json, write_own
from rltok.config.loading import _read_config_file
from rltok.config.plugins import MissingPlugin
from rltok.data.sources import absolute_spec
from rltok.model.pretrained import read_config
from rltok.training.checkpoint import (CheckpointError, checkpoint_step, is_checkpoint_dir, list_checkpoints,
                                       read_trainer_state, resolve_checkpoint)
from rltok.training.schedule import cooldown_left
from rltok.training.tracking import read_metrics


def refuse_other_run(run_dir: Path, resume: bool) -> None:
    """A fresh run may not start in a folder that holds another run's checkpoints."""
    existing = list_checkpoints(run_dir)
    if existing and not resume:
        # a second run in the same folder would mix trajectories, and pruning would delete
        # the new run's checkpoints in favour of the old run's higher steps
        raise ConfigError(f"{run_dir} already holds a run (newest checkpoint: {existing[-1].name}); "
                          "pass --resume to continue it, or choose another --out / train.out_dir")


def start(run_dir: Path, cfg: Config) -> None:
    """Create the folder and write the config the run trains with."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_own(run_dir / "config.json", json.dumps(cfg.to_dict(), indent=2), "the run's config")


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
                        "train.tensorboard", "train.wandb", "train.out_dir", "train.schedule_on_resume",
                        "train.optimizer_kernel")  # the optimiser's state is the same under every kernel


# <run>/branch: the state a "wsd" run held just before its cool-down (Trainer._keep_branch), shaped
# as a run folder of one checkpoint, out of reach of the rotating checkpoints' pruning
BRANCH = "branch"
# what a branch changes besides what a resume may: the budget grows (and the steps it plans)
MAY_CHANGE_ON_BRANCH = ("train.flops_budget",)


def branch_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / BRANCH


def branch_checkpoint(path: str | Path) -> Path:
    """The branch checkpoint `path` stands for: a run folder's (in its branch/), that branch/
    folder, or a checkpoint folder itself; verified against its manifest."""
    path = Path(path)
    if not (branch_root(path).is_dir() or path.name == BRANCH or is_checkpoint_dir(path)):
        raise ConfigError(f"{path} holds no branch checkpoint (a run with train.lr_schedule=wsd and a FLOPs "
                          f"budget keeps one in {BRANCH}/ as its cool-down begins)")
    ckpt = resolve_checkpoint(branch_root(path) if branch_root(path).is_dir() else path)
    if not (ckpt.name.startswith("step_") and ckpt.name.removeprefix("step_").isdigit()):
        raise ConfigError(f"{ckpt} is not a training checkpoint of a run (a step_N folder)")
    return ckpt


def branch_refusal(saved: Config, state: dict | None, cfg: Config) -> str | None:
    """Why a run with config `cfg` may not go on from a checkpoint (config `saved`, trainer state
    `state`) to its own budget as if it had trained from scratch; None when it may (the checks
    below: "wsd" before its cool-down, a budget that grows, nothing else that follows it)."""
    st, nt = saved.train, cfg.train
    if not (st.constant_phase and nt.constant_phase):
        return "both runs must use train.lr_schedule=wsd (a cosine decays from the first step on)"
    if st.flops_budget <= 0 or state is None:
        return "the checkpoint's run had no train.flops_budget or the checkpoint has no trainer state"
    if nt.flops_budget < st.flops_budget:
        return f"train.flops_budget may only grow ({st.flops_budget:.4g} -> {nt.flops_budget:.4g})"
    if st.warmup_steps != nt.warmup_steps:
        return (f"the warm-up differs (train.warmup_steps {st.warmup_steps} -> {nt.warmup_steps}): it must not follow "
                "the budget (give both runs the same train.warmup_steps with warmup_frac 0, or compare.run_one's "
                "warmup_at)")
    if cfg.objective.tokenizer_phase > 0 or saved.objective.tokenizer_phase > 0:
        return "objective.tokenizer_phase is a share of the budget, so its end moves with it"
    if cfg.objective.policy_until < 1 or saved.objective.policy_until < 1:
        return "objective.policy_until is a share of the budget, so the policy would settle at another step"
    spent = (state.get("objective") or {}).get("flops_spent", 0.0)
    if not state.get("branch_point") and cooldown_left(state["step"], st, spent / st.flops_budget) is not None:
        return f"the checkpoint (step {state['step']}) was taken inside its run's cool-down"
    old = _with_absolute_data(json.loads(json.dumps(saved.to_dict())))  # as a config.json holds it
    changes = config_changes(old, absolute_data(Config.from_dict(cfg.to_dict())))
    changes = {k: v for k, v in changes.items() if k not in MAY_CHANGE_ON_BRANCH}
    if changes:
        return "these keys differ: " + ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in changes.items())
    return None


def check_branch(ckpt: Path, cfg: Config) -> None:
    """Raise ConfigError unless `cfg` may go on from the checkpoint `ckpt` (branch_refusal)."""
    why = branch_refusal(read_config(ckpt)[0], read_trainer_state(ckpt), cfg)
    if why is not None:
        raise ConfigError(f"cannot branch from {ckpt}: {why}")


def seed_from_branch(run_dir: str | Path, ckpt: Path) -> None:
    """Start the run folder `run_dir` at the branch checkpoint `ckpt`: a copy of it becomes the
    folder's checkpoint (a resume goes on from it), and the records its run logged up to it
    begin the folder's metrics.jsonl, so that the run's history is its whole trajectory."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp_{ckpt.name}_{os.getpid()}"  # what clean_stale removes if the copy dies
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt, tmp)
    # <parent run>/branch/checkpoints/step_N, or a checkpoint of its own: <parent run>/checkpoints/step_N
    parent = ckpt.parents[2] if ckpt.parents[1].name == BRANCH else ckpt.parents[1]
    records = read_metrics(parent / "metrics.jsonl", checkpoint_step(ckpt))
    write_own(Path(run_dir) / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records), "metrics file")
    os.rename(tmp, root / ckpt.name)


def unseed(run_dir: str | Path, ckpt: Path) -> None:
    """Undo seed_from_branch: the run folder holds no checkpoint and no records again."""
    shutil.rmtree(Path(run_dir) / "checkpoints" / ckpt.name, ignore_errors=True)
    (Path(run_dir) / "metrics.jsonl").unlink(missing_ok=True)


def saved_config(run_dir: str | Path) -> dict | None:
    """The config a run folder's run was started with (its config.json), or None without one."""
    path = Path(run_dir) / "config.json"
    if not path.is_file() and not path.is_symlink():
        return None
    data = read_json(path, "the run's config", limit=1 << 20, follow=False)
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a config")
    return data


def absolute_data(cfg: Config) -> Config:
    """The data sources as absolute paths: a run folder's config.json names the same data from
    any working directory, and a resume compares paths, not spellings."""
    cfg.data.train, cfg.data.val = absolute_spec(cfg.data.train), absolute_spec(cfg.data.val)
    return cfg


def _with_absolute_data(saved: dict) -> dict:
    data = dict(saved.get("data") or {})
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
    # where the components' code comes from may change (an installed plugin, then its file);
    # the components themselves are compared by their kinds and settings
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if k.split(".")[0] not in ("plugins", "plugin_sources") and k not in MAY_CHANGE_ON_RESUME
            and old.get(k) != new.get(k)
            and not (k in ("data.train", "data.val") and _same_path(old.get(k), new.get(k)))}


def _same_path(a, b) -> bool:
    """Two spellings of one local data path (one through a link): the same data, not a change."""
    def real(spec):
        local = isinstance(spec, str) and spec and spec != "stdlib" and not spec.startswith(("hf:", "mix:"))
        return os.path.realpath(spec) if local else spec

    return real(a) == real(b)


def _budget_growth(run_dir: str | Path, saved: dict, cfg: Config, changes: dict) -> str | None:
    """Whether a resume may give the run a larger train.flops_budget: None when it may
    (branch_refusal), else why not ("" when the budget is unchanged)."""
    if "train.flops_budget" not in changes:
        return ""
    try:
        ckpt = resolve_checkpoint(run_dir)
        state = read_trainer_state(ckpt)
    except CheckpointError as e:
        return f"its checkpoint can be read ({e})"
    planned = Config.from_dict(cfg.to_dict())
    planned.train.warmup_steps = planned.train.warmup_for(planned.train.max_steps)  # as the Trainer resolves it
    why = branch_refusal(Config.from_dict(saved), state, planned)
    if why is None:
        return None
    hint = f"; the state before its cool-down is in {branch_root(run_dir)}" if branch_root(run_dir).is_dir() else ""
    return f"the run could go on as if trained to it from scratch, which it cannot: {why}{hint}"


def resume_config(run_dir: str | Path, saved: dict, preset: str | None, file: str | None, overrides: list[str],
                  allow_change: bool = False) -> Config:
    """The config a `--resume` continues with: the run's own saved config with the overrides
    given on top (or, with an explicit preset, that preset's config). Any difference outside
    MAY_CHANGE_ON_RESUME is refused, listing the keys, unless `allow_change`."""
    if preset is not None:
        cfg = load_config(preset, file, overrides)
    else:
        try:
            cfg = Config.from_dict(saved)
        except MissingPlugin as e:
            raise e.about(f"the run in {run_dir}") from None
        if file:
            apply_dict(cfg, _read_config_file(file))
        for ov in overrides:
            apply_override(cfg, ov)
        cfg.validate()
    absolute_data(cfg)
    changes = config_changes(_with_absolute_data(saved), cfg)
    grown = _budget_growth(run_dir, saved, cfg, changes)
    if grown is None:  # a "wsd" run still before its cool-down may go on to a larger budget
        changes = {k: v for k, v in changes.items() if k not in MAY_CHANGE_ON_BRANCH}
    if changes and not allow_change:
        listed = ", ".join(f"{k} ({old!r} -> {new!r})" for k, (old, new) in changes.items())
        shown = "; ".join(f"{k}" for k in MAY_CHANGE_ON_RESUME)
        budget = f" (train.flops_budget may grow only when {grown})" if grown else ""
        raise ConfigError(f"--resume continues the run in {run_dir} with its own config, but these keys differ "
                          f"from it: {listed}. Only {shown} may change on a resume{budget}; pass "
                          "--allow-config-change to continue with the changed config anyway")
    return cfg
