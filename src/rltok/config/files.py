"""Files a user hands over, read within bounds (each problem one error naming the file), and a run
folder's own files, written without following links."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import warnings
from pathlib import Path

from rltok.config.registry import ConfigError

MAX_DEPTH = 64  # nesting no config, grid, manifest or record comes near
MAX_BYTES = 64 << 20  # a config, manifest or record is kilobytes; metrics of a long run megabytes
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_LINK_ERRNOS = (errno.ELOOP, errno.EMLINK)  # what O_NOFOLLOW gives for a link (Linux, the BSDs)


def _depth(value) -> int:
    """How deeply lists and mappings nest in `value`, without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break
            todo.extend((v, level + 1) for v in item)
    return deepest


def parse(text: str, what: str, kind: str = "json", error: type[Exception] = ConfigError):
    """`text` parsed as JSON or TOML (`kind`); any way it fails is one `error` naming `what`."""
    try:
        if kind == "toml":
            import tomllib

            value = tomllib.loads(text)
        else:
            value = json.loads(text)
    except RecursionError:
        raise error(f"{what} is nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as e:  # a syntax error, or an integer longer than Python converts
        why = ("holds a number too long to read" if "integer string conversion" in str(e)
               else f"is not valid {kind.upper()}: {' '.join(str(e).split())[:200]}")
        raise error(f"{what} {why}") from None
    if _depth(value) > MAX_DEPTH:
        raise error(f"{what} is nested too deeply (more than {MAX_DEPTH} levels)")
    return value


_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def read_bytes(path: str | Path, what: str, limit: int = MAX_BYTES, follow: bool = True,
               error: type[Exception] = ConfigError) -> bytes:
    """The bytes of the regular file `path`, at most `limit`; with follow=False a link there is
    refused rather than followed, and a folder, a FIFO or a device is named as such."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise error(_refusal(path, what, e)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # (checked before opening a file object, which refuses a folder)
            kind = _KINDS.get(stat.S_IFMT(mode))
            raise error(f"{what} {path} is {kind + ', ' if kind else ''}not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{what} {path} is larger than {limit:,} bytes")
    return data


def read_text(path: str | Path, what: str, limit: int = MAX_BYTES, follow: bool = True,
              error: type[Exception] = ConfigError, decode_errors: str = "strict", kind: str = "") -> str:
    """The UTF-8 text of the regular file `path` (read_bytes)."""
    data = read_bytes(path, what, limit, follow, error)
    try:
        return data.decode("utf-8", errors=decode_errors)
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not {f'valid {kind.upper()} (not UTF-8)' if kind else 'UTF-8 text'}") from None


def read_json(path: str | Path, what: str, limit: int = MAX_BYTES, follow: bool = True,
              error: type[Exception] = ConfigError, kind: str = "json"):
    """A JSON (or TOML) file read and parsed within bounds: one `error` for whatever is wrong."""
    return parse(read_text(path, what, limit, follow, error, kind=kind), f"{what} {path}", kind, error)


def read_record(path: str | Path, what: str = "run record", limit: int = 16 << 20, warn: bool = True,
                hint: str = "left out") -> dict | None:
    """The JSON object in `path`, or None when the file does not hold one (empty, truncated, `[]`,
    nested too deeply): then a warning names it (`warn`) and says what becomes of it (`hint`)."""
    try:
        rec = read_json(path, what, limit)
        if not isinstance(rec, dict):
            raise ConfigError(f"{what} {path} holds a JSON {type(rec).__name__}, not an object")
    except ConfigError as e:
        if warn:
            warnings.warn(f"{e}; {hint}", stacklevel=2)
        return None
    return rec


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def parse_lines(text: str) -> list:
    """The JSON values of a JSON-lines text; a line that does not parse or nests too deeply (a
    torn last line, a damaged one) is skipped."""
    out = []
    for line in text.splitlines():
        try:
            out.append(parse(line, "line"))
        except ConfigError:
            continue
    return out


# ---- a run folder's own files ------------------------------------------------------------------


def _refusal(path, what: str, e: OSError) -> str:
    if e.errno in _LINK_ERRNOS:
        return (f"{what} {path} is a symbolic link; a run folder's own files are never followed: "
                "remove the link, or choose another folder")
    if e.errno == errno.ENOENT:
        return f"{what} not found: {path}"
    return f"cannot read {what} {path}: {e.strerror or e}"


def refuse_link(path: str | Path, what: str = "") -> None:
    """A link (or anything but a plain file or folder) where a run folder keeps its own file or
    folder is refused: writing there would follow it out of the folder."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"cannot use {path}: {e.strerror or e}") from None
    if stat.S_ISLNK(mode):
        raise ConfigError(f"{what or 'run folder file'} {path} is a symbolic link; a run folder's own files "
                          "are never followed: remove the link, or choose another folder")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ConfigError(f"{what or 'run folder file'} {path} is not a regular file or folder")


def open_own(path: str | Path, mode: str = "w", what: str = "run folder file"):
    """A run folder's own file opened for writing ("w": truncated, "a": appended, "r+": as it
    is) without following a link; a link there is one ConfigError."""
    flags = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "r+": os.O_RDWR | os.O_CREAT}[mode]
    try:
        fd = os.open(path, flags | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        if e.errno in _LINK_ERRNOS:
            raise ConfigError(_refusal(path, what, e)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{what} {path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, mode)


def write_own(path: str | Path, text: str, what: str = "run folder file") -> None:
    """Replace a run folder's own file with `text` (a link there is refused, not followed)."""
    with open_own(path, "w", what) as f:
        f.write(text)


def write_atomic(path: str | Path, text: str) -> None:
    """`text` in `path` whole or not at all, even across a power loss: written to a temporary
    file beside it, fsynced, renamed over it, and the folder fsynced so the rename is kept."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open_own(tmp, "w", "temporary file") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    """Keep a rename in `path` across a power loss. Where a folder cannot be opened or synced at all
    this is a no-op; a failing disk (EIO) still raises."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES):
            raise
    finally:
        os.close(fd)
