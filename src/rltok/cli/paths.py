"""Paths the user names, checked before anything is loaded or computed, where a command will write
and what it will read: each problem one ConfigError that says what the path is."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from rltok.config import ConfigError

NAME_MAX = 255  # bytes in one path component on every common filesystem
MAX_TEXT_BYTES = 16 << 20  # a prompt or a text to segment: far more than any model's context


def _check_path(path: Path, flag: str) -> None:
    """No component of `path` is too long a name, and no existing ancestor is anything but a folder."""
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(f"{flag} {str(path)[:80]}...: a path component is {len(os.fsencode(part))} bytes "
                              f"long, more than the {NAME_MAX} a file name may have")
    for parent in reversed(path.absolute().parents):
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            return  # created when written
        except OSError as e:
            raise ConfigError(f"{flag} {path}: cannot use {parent} ({e.strerror})") from None
        if not stat.S_ISDIR(mode):
            raise ConfigError(f"{flag} {path}: {parent} is a file, not a folder")


def check_output_file(path: str | Path, flag: str) -> Path:
    """`path` can be written as a file: checked before the work that produces it."""
    path = Path(path)
    _check_path(path, flag)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name")
    return path


def check_output_folder(path: str | Path, flag: str) -> Path:
    """`path` can be a folder (existing or to be made); an empty name is refused rather than
    taken for the current folder, whose files a command would then overwrite."""
    if not str(path).strip():
        raise ConfigError(f"{flag} is empty: give the folder to write")
    path = Path(path)
    _check_path(path, flag)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a folder")
    return path


def refuse_foreign_folder(out: str | Path, flag: str) -> None:
    """A new run starts in a folder that does not exist, is empty, or already is a run folder
    (what the rest of `train` checks); a folder of other files (a project, the current folder)
    is refused: the run would replace its config.json and metrics.jsonl."""
    from rltok.training.run_lock import LOCK

    out = Path(out)
    names = _entries(out, flag)
    if not names or LOCK in names or "checkpoints" in names:  # a run's folder holds its lock from its start on
        return
    raise ConfigError(f"{flag} {out} already holds files that are not a run's ({_shown(names)}); a new run there "
                      "would replace its config.json and metrics.jsonl: choose another folder, or pass --overwrite")


def _entries(out: Path, flag: str) -> list[str]:
    """The names in folder `out`, sorted (none where it is not a folder yet)."""
    try:
        return sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    except OSError as e:
        raise ConfigError(f"{flag} {out}: cannot list the folder ({e.strerror or e})") from None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def read_input(name: str, what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a file the user named ('-': stdin), at most `limit`; a folder, a FIFO or a
    device is named as such, and more than `limit` bytes is an error, not an endless read."""
    from rltok.config.files import read_bytes
    from rltok.data.sources import DataError

    if name != "-":
        return read_bytes(name, what, limit, error=DataError)
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise DataError(f"{what} standard input holds more than {limit:,} bytes (the limit for it)")
    return data


def refuse_other_files(out: str | Path, flag: str, own, what: str) -> None:
    """`out` may be new, empty or already this command's output (`own(name)` says which of its
    entries are); a folder holding anything else (a project, a user's README) is refused: the
    command would replace its files."""
    out = Path(out)
    other = [n for n in _entries(out, flag) if not own(n)]
    if other:
        raise ConfigError(f"{flag} {out} holds files that are not {what} ({_shown(other)}), which it would replace: "
                          "give a new or empty folder")
