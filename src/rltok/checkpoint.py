"""Checkpoints that survive crashes: one folder per step, written under a temporary name and
renamed into place (atomic on POSIX), with a manifest of SHA-256 checksums checked on load.

    <run>/checkpoints/step_000600/
        model.safetensors   weights (loadable anywhere, no pickle)
        config.json         the full Config
        trainer.pt          optimiser, scheduler, every RNG stream, data position, step
        manifest.json       file -> sha256, written last
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import Config, ConfigError

MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, partial or corrupt."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _writer_pid(name: str) -> int | None:
    try:
        return int(name.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return None


def clean_stale(run_dir: str | Path) -> None:
    """Tidy up after writers that were killed: delete their half-written `.tmp_step_*` folders
    and put back a `.old_step_*` folder whose replacement never arrived (killed between the two
    renames of a re-save). Folders of live writers are left alone."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    for stale in root.iterdir():
        if not stale.name.startswith((".tmp_step_", ".old_step_")):
            continue
        pid = _writer_pid(stale.name)
        if pid is not None and _pid_alive(pid):
            continue
        if stale.name.startswith(".old_step_"):
            final = root / stale.name[len(".old_"):].rsplit("_", 1)[0]
            if not final.exists():
                os.rename(stale, final)
                continue
        shutil.rmtree(stale, ignore_errors=True)


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module | None, cfg: Config,
                    trainer_state: dict | None = None, keep_last: int = 3,
                    state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `<run_dir>/checkpoints/step_<step>` atomically and prune to the newest `keep_last`
    (0 keeps all). A crash at any point leaves either the complete new checkpoint or none, and
    the older ones untouched. `state_dict` replaces `model.state_dict()` (a sharded model's
    weights gathered beforehand)."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    clean_stale(run_dir)
    final = ckpt_root / f"step_{step:07d}"
    tmp = ckpt_root / f".tmp_step_{step:07d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        weights = model.state_dict() if state_dict is None else state_dict
        state = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt", "step": str(step)})
        (tmp / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        if trainer_state is not None:
            torch.save(trainer_state, tmp / "trainer.pt")
        files = sorted(p.name for p in tmp.iterdir())
        manifest = {"step": step, "files": {name: _sha256(tmp / name) for name in files}}
        for name in files:
            with open(tmp / name, "rb+") as f:
                os.fsync(f.fileno())
        # the manifest is written last: a folder with a valid manifest is complete
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        _fsync_dir(tmp)
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
    _fsync_dir(ckpt_root)
    _prune(ckpt_root, keep_last)
    return final


def _prune(ckpt_root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for path in list_checkpoints(ckpt_root.parent)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


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


REQUIRED = ("model.safetensors", "config.json")


def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless the manifest is complete and every file matches it."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no manifest (partial write?)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint {path}: manifest is not valid JSON") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or any(name not in files for name in REQUIRED):
        raise CheckpointError(f"checkpoint {path}: manifest does not list {' and '.join(REQUIRED)}")
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        if _sha256(f) != digest:
            raise CheckpointError(f"checkpoint {path}: {name} is corrupt (checksum mismatch)")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder (its newest valid checkpoint, falling back to older
    ones with a warning when the newest is corrupt)."""
    path = Path(path).expanduser()
    if path.is_file():  # a file inside a checkpoint folder, e.g. .../model.safetensors
        path = path.parent
    if (path / MANIFEST).exists() or (path / "model.safetensors").exists():
        verify_checkpoint(path)
        return path
    candidates = list_checkpoints(path)
    if not candidates:
        if not path.exists():
            raise CheckpointError(f"checkpoint path not found: {path}")
        raise CheckpointError(f"no checkpoints under {path}")
    errors = []
    for cand in reversed(candidates):
        try:
            verify_checkpoint(cand)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        if errors:
            warnings.warn(f"skipping {len(errors)} unusable checkpoint(s) ({'; '.join(errors)}); "
                          f"falling back to {cand}", stacklevel=2)
        return cand
    raise CheckpointError(f"no valid checkpoint under {path}: " + "; ".join(errors))


def load_config_from(path: Path) -> Config:
    try:
        return Config.from_dict(json.loads((path / "config.json").read_text())).validate()
    except (json.JSONDecodeError, ConfigError) as e:
        raise CheckpointError(f"checkpoint {path}: bad config.json ({e})") from None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", with_trainer_state: bool = False):
    """-> (model, cfg, trainer_state or None, checkpoint folder). A folder written by
    `save_pretrained` (rltok.hub) loads too, without trainer state."""
    from .hub import PretrainedError, from_pretrained, is_pretrained_dir
    from .model.factory import build_model

    if is_pretrained_dir(path) and not (Path(path) / MANIFEST).exists():
        try:
            model, cfg, _ = from_pretrained(path, device=device, return_config=True)
        except PretrainedError as e:
            raise CheckpointError(str(e)) from None
        return model.train(), cfg, None, Path(path)
    ckpt = resolve_checkpoint(path)
    cfg = load_config_from(ckpt)
    try:
        state = load_file(ckpt / "model.safetensors", device=str(device))
    except Exception as e:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"checkpoint {ckpt}: cannot read model.safetensors ({e})") from None
    model = build_model(cfg.model, state_dict=state)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch: weights and config.json disagree
        raise CheckpointError(f"checkpoint {ckpt} does not match its config: {e}") from None
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {ckpt} does not match its config: missing {missing}, unexpected {unexpected}")
    model.to(device)
    trainer_state = None
    if with_trainer_state and (ckpt / "trainer.pt").is_file():
        try:  # our own file, checksum-verified above; it holds numpy RNG state, hence no weights_only
            trainer_state = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)
        except Exception as e:
            raise CheckpointError(f"checkpoint {ckpt}: cannot read trainer.pt ({e})") from None
    return model, cfg, trainer_state, ckpt
