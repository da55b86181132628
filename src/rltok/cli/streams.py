"""Output that can never stop a command: a stream whose reader has gone (`rltok train ... 2>&1 |
head -3`) or that was closed before the command started (`2>&-`) drops what is written to it, so
a progress line can never cost an hour of training or its checkpoint."""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from typing import Iterator, TextIO

# a reader that has gone (EPIPE), a terminal that was hung up (EIO), a closed descriptor (EBADF)
_GONE = (errno.EPIPE, errno.EIO, errno.EBADF)


class DroppingStream:
    """Writes through to `stream` until the first write that fails because nobody reads any
    more; from then on everything written is dropped (the descriptor is pointed at /dev/null,
    so that the interpreter's own flush at exit does not fail either)."""

    def __init__(self, stream: TextIO | None):
        # None: the descriptor was closed before Python started (`2>&-`)
        self._stream = stream if stream is not None else open(os.devnull, "w")
        self.gone = False

    def _drop(self) -> None:
        self.gone = True
        to_devnull(self._stream)

    def _guarded(self, call, *args, default=None):
        if self.gone:
            return default
        try:
            return call(*args)
        except OSError as e:  # BrokenPipeError included
            if e.errno not in _GONE:
                raise
            self._drop()
            return default

    def write(self, text: str) -> int:
        return self._guarded(self._write, text, default=len(text))

    def _write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except UnicodeEncodeError:  # a path that is not UTF-8, on a stream that is strict about it
            encoding = getattr(self._stream, "encoding", None) or "utf-8"
            return self._stream.write(text.encode(encoding, "backslashreplace").decode(encoding))

    def flush(self) -> None:
        self._guarded(lambda: self._stream.flush())

    def isatty(self) -> bool:
        return not self.gone and self._guarded(lambda: self._stream.isatty(), default=False)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def to_devnull(stream) -> None:
    """Point `stream`'s descriptor at /dev/null, so that later writes and the interpreter's flush at
    exit go nowhere."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture): nothing to do
        pass


@contextmanager
def output_never_fails(stdout: bool) -> Iterator[None]:
    """For the duration: stderr (and `stdout` too, when True) as DroppingStreams."""
    saved = sys.stdout, sys.stderr
    sys.stderr = DroppingStream(sys.stderr)
    if stdout:
        sys.stdout = DroppingStream(sys.stdout)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, DroppingStream):
                stream.flush()
        sys.stdout, sys.stderr = saved
