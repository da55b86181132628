"""Bytes from anywhere: the standard library, local files/folders/globs, hub datasets.

Everything is read as raw bytes: any byte string is valid input, no decoding ever happens.
Documents (files, hub records) are joined into one stream with DOC_SEP between them.
Splits are deterministic (see `split_documents`): a folder holding `train*` and `val*` (and
`test*`) files uses them as given; otherwise a source of at least MIN_DOCS_FOR_DOC_SPLIT
documents holds out whole documents, chosen by a hash of their bytes, so train and val share
no document; a smaller source holds out the last `val_fraction` of every document.
"""

from __future__ import annotations

import bz2
import glob as globlib
import gzip
import hashlib
import lzma
import os
import sys
import sysconfig
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch


# Written between two documents in every corpus stream, so a window that runs from the end of
# one file into the next sees the change. 0xFF never occurs in valid UTF-8, so it cannot be
# confused with any text document's bytes, and it still fits the uint8 storage. (A binary or
# invalid-UTF-8 file may hold 0xFF itself; such files are read as they are.)
DOC_SEP = 0xFF
# Below this many documents the validation split is the tail of every document instead of
# whole held-out documents (too few to pick from without a lopsided split).
MIN_DOCS_FOR_DOC_SPLIT = 20


class DataError(ValueError):
    """A user-facing data problem (missing path, empty corpus...)."""


def _open_decompressed(path: Path):
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".xz") or name.endswith(".lzma"):
        return lzma.open(path, "rb")
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    if name.endswith(".zst") or name.endswith(".zstd"):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


def _read_errors() -> tuple[type[BaseException], ...]:
    """What a damaged, vanished or unreadable file can raise while being read."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


@dataclass
class ReadReport:
    files: int = 0  # files read (empty ones included)
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason): unreadable
    empty: list[str] = field(default_factory=list)  # files that held no bytes

    def summary(self) -> str:
        parts = []
        if self.skipped:
            path, reason = self.skipped[0]
            parts.append(f"{len(self.skipped)} unreadable (first: {path}: {reason})")
        if self.empty:
            parts.append(f"{len(self.empty)} empty (first: {self.empty[0]})")
        return ", ".join(parts)


def read_file(path: Path, limit: int = 0) -> bytes:
    with _open_decompressed(path) as f:
        return f.read(limit) if limit > 0 else f.read()


def stdlib_files() -> list[Path]:
    """The running Python's standard-library sources, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts]
    return sorted(files)


def expand_paths(spec: str) -> list[Path]:
    """A file, a folder (every file below it, hidden ones skipped) or a glob pattern."""
    if not spec.strip():
        raise DataError("empty data path (set data.train / --data to a file, folder, glob or 'stdlib')")
    if spec == "stdlib":
        files = stdlib_files()
        if not files:
            raise DataError(f"no standard-library sources found under {sysconfig.get_paths()['stdlib']}")
        return files
    path = Path(spec).expanduser()
    try:
        return _expand_local(spec, path)
    except OSError as e:  # e.g. a name too long, a folder we may not list
        raise DataError(f"cannot list data path {spec}: {e}") from None


def _expand_local(spec: str, path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise DataError(f"folder {spec} contains no files")
        return files
    if any(c in spec for c in "*?["):
        files = sorted(Path(p) for p in globlib.glob(os.path.expanduser(spec), recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"glob {spec!r} matches no files")
        return files
    raise DataError(f"data path not found: {spec}")


def read_documents(spec: str, max_bytes: int = 0, text_field: str = "text") -> tuple[list[bytes], ReadReport]:
    """Read a source into a list of documents (one per file, or per hub record)."""
    if spec.startswith("hf:"):
        return read_hub_dataset(spec[3:], max_bytes, text_field)
    report = ReadReport()
    docs: list[bytes] = []
    errors = _read_errors()
    # The whole source is read into memory now, so a file that disappears or breaks later
    # cannot hurt the run; one that vanished since listing is skipped like an unreadable one.
    for path in expand_paths(spec):
        remaining = max_bytes - report.bytes if max_bytes else 0
        try:
            data = read_file(path, remaining)
        except errors as e:
            report.skipped.append((str(path), f"{type(e).__name__}: {e}"))
            continue
        except MemoryError:
            raise DataError(f"{path} is too large to read into memory; cap it with data.max_bytes") from None
        report.files += 1
        if data:
            docs.append(data)
            report.bytes += len(data)
        else:
            report.empty.append(str(path))
        if max_bytes and report.bytes >= max_bytes:
            break
    if report.bytes == 0:
        detail = f"; skipped {report.summary()}" if report.skipped or report.empty else ""
        raise DataError(f"data source {spec!r} holds no bytes to train on: {report.files} file(s) read{detail}")
    if report.skipped or report.empty:
        warnings.warn(f"{spec}: skipped {report.summary()}; read {report.files - len(report.empty)} file(s), "
                      f"{report.bytes:,} bytes", stacklevel=2)
    return docs, report


def read_hub_dataset(spec: str, max_bytes: int, text_field: str) -> tuple[list[bytes], ReadReport]:
    """`name[:config][@split]` through the `datasets` library, streamed (needs network)."""
    try:
        import datasets
    except ImportError:
        raise DataError("hub datasets need the optional extra: pip install 'rltok[hub]'") from None
    split = "train"
    if "@" in spec:
        spec, split = spec.rsplit("@", 1)
    name, _, config = spec.partition(":")
    report = ReadReport()
    docs = []
    try:
        ds = datasets.load_dataset(name, config or None, split=split, streaming=True)
        for record in ds:
            if text_field not in record:
                raise DataError(f"dataset {name} has no field {text_field!r}; fields: {sorted(record)}")
            data = str(record[text_field]).encode("utf-8", errors="replace")  # lone surrogates
            docs.append(data)
            report.files += 1
            report.bytes += len(data)
            if max_bytes and report.bytes >= max_bytes:
                break
    except DataError:
        raise
    except Exception as e:  # network, auth, unknown name: the library raises many types
        raise DataError(f"cannot read hub dataset {spec!r}: {type(e).__name__}: {e}") from None
    if report.bytes == 0:
        raise DataError(f"hub dataset {spec!r} yielded no text")
    return docs, report


def to_tensor(chunks: list[bytes]) -> torch.Tensor:
    """One uint8 stream: the non-empty documents in order, DOC_SEP between two of them (none
    at the start or the end)."""
    joined = bytes([DOC_SEP]).join(c for c in chunks if c)
    return torch.from_numpy(np.frombuffer(joined, dtype=np.uint8).copy())


def _doc_key(doc: bytes) -> bytes:
    return hashlib.blake2b(doc, digest_size=8).digest()


def split_documents(docs: list[bytes], val_fraction: float) -> tuple[list[bytes], list[bytes], str]:
    """(train documents, val documents, rule) for a source without an explicit val split.

    "documents": with at least MIN_DOCS_FOR_DOC_SPLIT non-empty documents, whole documents are
    held out. They are taken in the order of a hash of their bytes (so neither file order nor
    file names matter, and identical documents always land on the same side), skipping any
    that would take the held-out bytes past twice val_fraction, until val_fraction of the
    bytes is held out. Train and val then share no document.
    "tails": otherwise (too few documents, none small enough, or nothing left to train on) the
    last val_fraction of every document is held out, as in enwik8-style splits.
    Both keep the documents in their original order on each side."""
    docs = [d for d in docs if d]
    total = sum(map(len, docs))
    if len(docs) >= MIN_DOCS_FOR_DOC_SPLIT:
        target, cap = val_fraction * total, 2 * val_fraction * total
        groups: dict[bytes, list[int]] = {}
        for i, d in enumerate(docs):
            groups.setdefault(_doc_key(d), []).append(i)
        held: set[int] = set()
        size = 0
        for key in sorted(groups):
            if size >= target:
                break
            n = sum(len(docs[i]) for i in groups[key])
            if size + n <= cap:
                held.update(groups[key])
                size += n
        train = [d for i, d in enumerate(docs) if i not in held]
        val = [d for i, d in enumerate(docs) if i in held]
        if size >= 2 and sum(map(len, train)) >= 2:
            return train, val, "documents"
    train, val = [], []
    for d in docs:
        cut = len(d) - int(len(d) * val_fraction)
        train.append(d[:cut])
        val.append(d[cut:])
    return train, [v for v in val if v], "tails"


@dataclass
class Corpus:
    train: torch.Tensor  # uint8
    val: torch.Tensor  # uint8
    source: str
    skipped_files: int = 0  # unreadable or empty files left out while reading
    # how val was made: "given" (an explicit val source or train.*/val.* files), "documents"
    # (whole held-out documents), "tails" (the end of every document), "stream" (the end of a
    # tiny corpus); see split_documents
    split: str = ""

    def describe(self) -> str:
        skipped = f" ({self.skipped_files} file(s) skipped)" if self.skipped_files else ""
        rule = {"documents": "; val = whole held-out documents", "tails": "; val = the tail of every document",
                "stream": "; val = the tail of the stream"}.get(self.split, "")
        return f"{self.source}: {len(self.train):,} train bytes, {len(self.val):,} val bytes{skipped}{rule}"


def _split_files(folder: Path, name: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.split(".")[0] == name)


def named_split(spec: str, split: str) -> str | None:
    """If `spec` is a folder holding `<split>.*` files, return a glob for them."""
    path = Path(spec).expanduser()
    if path.is_dir() and _split_files(path, split):
        return str(path / f"{split}.*")
    return None


def load_corpus(train: str = "stdlib", val: str = "", val_fraction: float = 0.02, max_bytes: int = 0,
                text_field: str = "text") -> Corpus:
    train_spec = named_split(train, "train")
    if train_spec and not val:
        val = named_split(train, "val") or ""
    if val:
        tr_docs, tr_report = read_documents(train_spec or train, max_bytes, text_field)
        va_docs, va_report = read_documents(val, 0, text_field)
        skipped = sum(len(r.skipped) + len(r.empty) for r in (tr_report, va_report))
        return Corpus(to_tensor(tr_docs), to_tensor(va_docs), train, skipped, "given")
    docs, report = read_documents(train, max_bytes, text_field)
    skipped = len(report.skipped) + len(report.empty)
    tr, va, rule = split_documents(docs, val_fraction)
    corpus = Corpus(to_tensor(tr), to_tensor(va), train, skipped, rule)
    if len(corpus.val) < 2:
        # tiny corpora: hold out the tail of the whole stream (as documents: the one cut
        # in two ends train and starts val, with no separator on either side of the cut)
        total = sum(map(len, docs))
        cut = max(1, total - max(2, int(total * val_fraction)))
        tr, va, seen = [], [], 0
        for d in docs:
            k = min(max(cut - seen, 0), len(d))
            tr.append(d[:k])
            va.append(d[k:])
            seen += len(d)
        corpus = Corpus(to_tensor(tr), to_tensor(va), train, skipped, "stream")
    if len(corpus.train) < 2:
        raise DataError(f"data source {train!r} is too small to train on ({len(corpus.train)} bytes)")
    return corpus


def load_eval_bytes(spec: str, split: str = "val", max_bytes: int = 0, val_fraction: float = 0.02) -> torch.Tensor:
    """Bytes to evaluate on: the named split of a split folder, else exactly the val bytes
    `load_corpus` holds out (split="val": whole documents or document tails, see
    `split_documents`) or the whole source (split="all"); documents separated by DOC_SEP."""
    named = named_split(spec, split)
    if named:
        docs, _ = read_documents(named, max_bytes)
        return to_tensor(docs)
    if split == "all":
        docs, _ = read_documents(spec, max_bytes)
        return to_tensor(docs)
    return load_corpus(spec, val_fraction=val_fraction, max_bytes=max_bytes).val


class WindowSampler:
    """Random (x, y) windows of seq_len+1 bytes; its RNG state is the data position.

    Data-parallel sharding: with `world_size` N every rank draws the starts of the whole global
    batch (batch_size * N windows) from the same seeded generator and keeps its own block of
    batch_size rows, so N ranks together see exactly the batch one process with batch_size * N
    would, and the generator state stays identical on every rank."""

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(data) < 2:
            raise DataError("need at least 2 bytes of training data")
        self.data = data
        self.batch_size = batch_size  # per rank
        self.seq_len = min(seq_len, len(data) - 1)
        self.rank, self.world_size = rank, world_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        hi = len(self.data) - self.seq_len
        starts = torch.randint(0, hi, (self.batch_size * self.world_size,), generator=self.gen)
        starts = starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        win = self.data[starts.unsqueeze(1) + torch.arange(self.seq_len + 1)].long()
        return win[:, :-1], win[:, 1:]

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])


def eval_windows(data: torch.Tensor, seq_len: int, max_windows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (x, y) windows tiling `data` in order, the same on every call; with
    `max_windows`, an evenly spaced subset of them. Returns (N, T) long tensors."""
    if len(data) < 2:
        raise DataError("evaluation data needs at least 2 bytes")
    seq_len = min(seq_len, len(data) - 1)
    n_all = (len(data) - 1) // seq_len
    idx = np.arange(n_all)
    if max_windows and n_all > max_windows:
        idx = np.linspace(0, n_all - 1, max_windows).round().astype(np.int64)
    starts = torch.from_numpy(idx * seq_len)
    offsets = starts.unsqueeze(1) + torch.arange(seq_len + 1)
    win = data[offsets].long()
    return win[:, :-1], win[:, 1:]


def read_user_text(text: str | None, file: str | None) -> bytes:
    """Bytes for `segment`/`generate`: a literal string (UTF-8) or a file ('-' = stdin)."""
    if file is not None:
        if file == "-":
            return sys.stdin.buffer.read()
        path = Path(file).expanduser()
        if not path.is_file():
            raise DataError(f"file not found: {file}")
        return read_file(path)
    return (text or "").encode("utf-8", errors="surrogateescape")
