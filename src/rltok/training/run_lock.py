"""One live process per run folder: fcntl.flock on `<run>/.lock` (recording the holder, dropped by the
kernel when it dies; nothing is locked without fcntl). The run's own files (OWN) are never links,
or a handed folder could have training write elsewhere."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from rltok.config import ConfigError
from rltok.config.files import open_own, parse, refuse_link

LOCK = ".lock"
# what training writes into a run folder (tracking's sinks, checkpoints, the branch before a cool-down)
OWN = (LOCK, "config.json", "metrics.jsonl", "metrics.jsonl.tmp", "checkpoints", "branch", "tensorboard", "wandb")


def refuse_links(run_dir: str | Path) -> None:
    """One ConfigError when one of the run folder's own files or folders, or a checkpoint in
    it, is a link (or a FIFO, a device): training would write through it out of the folder."""
    run_dir = Path(run_dir)
    for name in OWN:
        refuse_link(run_dir / name)
    for root in (run_dir / "checkpoints", run_dir / "branch" / "checkpoints"):
        refuse_link(root)
        if root.is_dir():
            for entry in sorted(root.iterdir()):
                refuse_link(entry, "checkpoint")


def _holder(text: str) -> str:
    try:
        info = parse(text, "lock")
        return (f"pid {info['pid']} on {info['host']}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['start']))}")
    except (ValueError, KeyError, TypeError):
        return "another process"


class RunLock:
    """Held from `acquire` until `release` (or the process ends)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.file = None
        self.created = False

    def acquire(self) -> "RunLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no advisory locks on this platform
            return self
        self.created = not self.run_dir.exists()
        if not self.created:
            refuse_links(self.run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            f = open_own(self.run_dir / LOCK, "r+", "the run folder's lock")
        except OSError as e:
            raise ConfigError(f"cannot use run folder {self.run_dir}: {e.strerror or e}") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                f.seek(0)
                holder = _holder(f.read(4096))
            except (OSError, ValueError):  # a record that is not text: the refusal still stands
                holder = "another process"
            f.close()
            raise ConfigError(f"run folder {self.run_dir} is in use by {holder}; wait for that run to end, "
                              "or choose another --out / train.out_dir") from None
        try:
            f.seek(0)
            f.truncate()  # the file itself, never a link's target (opened without following one)
            f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "start": time.time()}))
            f.flush()
        except OSError:
            pass  # the lock itself is what counts; the record only names the holder
        self.file = f
        return self

    def abandon(self) -> None:
        """Release, and remove the folder again if acquire created it and nothing else was
        written there (a run refused before it started leaves no trace)."""
        self.release()
        if getattr(self, "created", False):
            try:
                (self.run_dir / LOCK).unlink()
                self.run_dir.rmdir()
            except OSError:
                pass

    def release(self) -> None:
        if self.file is not None:
            import fcntl

            try:
                fcntl.flock(self.file, fcntl.LOCK_UN)
            finally:
                self.file.close()
                self.file = None

    @property
    def held(self) -> bool:
        return self.file is not None

    def __del__(self) -> None:
        # a lock dropped while held (a Trainer built and never fit) lets go of its folder and
        # closes its file, rather than leaving the file for the collector to warn about
        if getattr(self, "file", None) is not None:
            try:
                self.release()
            except Exception:  # noqa: BLE001 - at interpreter exit fcntl may be gone; closing still unlocks
                if self.file is not None:
                    self.file.close()
