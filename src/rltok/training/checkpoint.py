"""Training checkpoints: writing them atomically, and finding and checking the folder to load. A
checkpoint is a model folder plus trainer.pt, FSDP's dcp/ and a manifest of checksums written last
(docs/CONFIG.md, "What a run writes")."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path

import torch

from rltok.config import Config
from rltok.config.files import fsync_dir, read_json, sha256_file
from rltok.model.pretrained import CONFIG, WEIGHTS, CheckpointError, write_model_files
from rltok.training.safe_load import load_tensors_only

TRAINER = "trainer.pt"
MANIFEST = "manifest.json"
SHARDED = "dcp"  # FSDP's sharded model and optimiser state, a folder inside the checkpoint
REQUIRED = (WEIGHTS, CONFIG)  # what a manifest must list
_STEP_DIR = re.compile(r"step_\d+")


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _writer_alive(name: str) -> bool:
    """Whether the process whose pid ends a staging folder's name still runs."""
    try:
        os.kill(int(name.rsplit("_", 1)[1]), 0)
    except (IndexError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # it runs, owned by someone else
        return True
    return True


# ---- writing ---------------------------------------------------------------------------------
def run_results(run_dir: str | Path, step: int) -> dict:
    """Results of a run at `step`, from its metrics.jsonl: the step, bytes seen and the last
    validation results logged up to it (with `val_step` when that was an earlier step)."""
    from rltok.training.tracking import read_metrics

    records = read_metrics(Path(run_dir) / "metrics.jsonl", step)
    out: dict = {"step": step}
    if records:
        out["bytes"] = records[-1].get("bytes")
    with_val = [r for r in records if "val_bpb" in r]
    if with_val:
        last = with_val[-1]
        out.update({k: last[k] for k in ("val_bpb", "val_rate", "val_bytes_per_chunk", "val_space_align") if k in last})
        if last.get("step") != step:
            out["val_step"] = last.get("step")
    return {k: v for k, v in out.items() if v is not None}


def clean_stale(run_dir: str | Path) -> None:
    """Tidy up after killed writers: delete their half-written `.tmp_step_*` folders and put back a
    `.old_step_*` whose replacement never arrived. Folders of live writers are left alone."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    for stale in root.iterdir():
        if not stale.name.startswith((".tmp_step_", ".old_step_")):
            continue
        if _writer_alive(stale.name):
            continue
        if stale.name.startswith(".old_step_"):
            final = root / stale.name[len(".old_"):].rsplit("_", 1)[0]
            if not final.exists():
                os.rename(stale, final)
                continue
        shutil.rmtree(stale, ignore_errors=True)


def stage_checkpoint(run_dir: str | Path, step: int) -> Path:
    """The empty temporary folder the checkpoint of `step` is written into before it is renamed
    into place. Under FSDP every rank first writes its shards into `<it>/dcp` (SHARDED), then
    rank 0 completes it with save_checkpoint(staged=...)."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    clean_stale(run_dir)
    tmp = ckpt_root / f".tmp_step_{step:07d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module | None, cfg: Config,
                    trainer_state: dict | None = None, keep_last: int = 3,
                    state_dict: dict[str, torch.Tensor] | None = None, results: dict | None = None,
                    staged: Path | None = None) -> Path:
    """Write `<run_dir>/checkpoints/step_<step>` atomically (a crash leaves the complete new
    checkpoint or none) and prune to the newest `keep_last` (0 keeps all). `results` for the card
    (default: the run's own metrics.jsonl); `state_dict` replaces `model.state_dict()` (a sharded
    model's, gathered); `staged`: stage_checkpoint's folder, already holding the sharded state."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:  # a name the loader would never list
        raise ValueError(f"a checkpoint's step is a whole number >= 0, got {step!r}")
    ckpt_root = Path(run_dir) / "checkpoints"
    final = ckpt_root / f"step_{step:07d}"
    tmp = stage_checkpoint(run_dir, step) if staged is None else staged
    try:
        if results is None:
            results = run_results(run_dir, step)
        write_model_files(tmp, model, cfg, results, name=Path(run_dir).resolve().name, state_dict=state_dict)
        if trainer_state is not None:
            torch.save(trainer_state, tmp / TRAINER)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        manifest = {"step": step, "files": {name: sha256_file(tmp / name) for name in files}}
        for name in files:
            with open(tmp / name, "rb+") as f:
                os.fsync(f.fileno())
        if (tmp / SHARDED).is_dir():
            fsync_dir(tmp / SHARDED)
        # the manifest is written last: a folder with a valid manifest is complete
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # e.g. a full disk: leave no half-written folder
        raise
    if final.exists():  # re-saving the same step: move the old one out of the way first
        old = ckpt_root / f".old_step_{step:07d}_{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_dir(ckpt_root)
    if keep_last > 0:
        for path in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)
    return final


def checkpoint_step(path: Path) -> int:
    return int(path.name.removeprefix("step_"))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete-looking checkpoint folders, oldest step first (not yet verified)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")
             and p.name.removeprefix("step_").isdigit()]
    return sorted(found, key=checkpoint_step)


# ---- finding and checking a folder -------------------------------------------------------------
def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless the manifest is complete and every file matches it."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no manifest (partial write?)")
    # bounded: a manifest nested thousands deep is one error, and the fallback goes on past it
    manifest = read_json(manifest_path, f"checkpoint {path}: manifest", limit=1 << 20, error=CheckpointError)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or any(name not in files for name in REQUIRED):
        raise CheckpointError(f"checkpoint {path}: manifest does not list {' and '.join(REQUIRED)}")
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        if sha256_file(f) != digest:
            raise CheckpointError(f"checkpoint {path}: {name} is corrupt (checksum mismatch)")


def is_checkpoint_dir(path: Path) -> bool:
    """A training checkpoint (must carry a valid manifest), as opposed to a model folder."""
    return ((path / MANIFEST).exists() or (path / TRAINER).exists()
            or (_STEP_DIR.fullmatch(path.name) is not None and path.parent.name == "checkpoints"))


def is_model_dir(path: Path) -> bool:
    """A folder with the model files and no manifest (save_pretrained's, a Hub snapshot)."""
    return not is_checkpoint_dir(path) and (path / WEIGHTS).is_file() and (path / CONFIG).is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """The local folder to load: a checkpoint folder (verified against its manifest), a model
    folder, or for a run folder its newest valid checkpoint (falling back to older ones with a
    warning when the newest is corrupt). A file inside any of them stands for its folder."""
    given = path = Path(path).expanduser()
    if path.is_file():  # e.g. .../model.safetensors
        path = path.parent
    if is_checkpoint_dir(path) or ((path / WEIGHTS).exists() and not (path / CONFIG).exists()):
        verify_checkpoint(path)
        return path
    if is_model_dir(path):
        return path
    candidates = list_checkpoints(path)
    if not candidates:
        if not path.exists():
            raise CheckpointError(f"checkpoint path not found: {path} (not a folder holding an rltok model or run)")
        if given != path:  # a file, but not one of a model's
            raise CheckpointError(f"{given} is not part of an rltok checkpoint, model or run folder (its folder holds "
                                  f"no checkpoints and no {WEIGHTS} + {CONFIG})")
        raise CheckpointError(f"no checkpoints under {path}, and no {WEIGHTS} + {CONFIG} in it")
    cand, errors = newest_valid(candidates)
    if cand is None:
        raise CheckpointError(f"no valid checkpoint under {path}: " + "; ".join(errors))
    if errors:
        warnings.warn(f"skipping {len(errors)} unusable checkpoint(s) ({'; '.join(errors)}); "
                      f"falling back to {cand}", stacklevel=2)
    return cand


def newest_valid(candidates: list[Path]) -> tuple[Path | None, list[str]]:
    """(the newest of `candidates`, oldest first, that passes its manifest's checksums, or None;
    why each newer one failed)."""
    errors = []
    for cand in reversed(candidates):
        try:
            verify_checkpoint(cand)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        return cand, errors
    return None, errors


def read_trainer_state(folder: Path) -> dict | None:
    if not (folder / TRAINER).is_file():
        return None
    try:  # tensors and plain values only: a run folder from elsewhere must not run code here
        return load_tensors_only(folder / TRAINER)
    except pickle.UnpicklingError:
        raise CheckpointError(f"checkpoint {folder}: {TRAINER} holds more than tensors and plain values "
                              "(refused: unpickling it could run code)") from None
    except Exception as e:
        raise CheckpointError(f"checkpoint {folder}: cannot read {TRAINER} ({' '.join(str(e).split())[:300]})") from None
