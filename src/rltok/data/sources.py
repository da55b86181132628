"""Bytes from anywhere (the standard library, local files/folders/globs, hub datasets), read raw, never
decoded; and the train/validation split rule shared by the in-memory loader and `rltok prepare`."""
from __future__ import annotations

import bz2
import glob as globlib
import gzip
import hashlib
import lzma
import os
import sysconfig
import warnings
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import zstandard



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


_OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".lzma": lzma.open, ".bz2": bz2.open}


def _open_decompressed(path: Path):
    name = path.name.lower()
    if name.endswith((".zst", ".zstd")):
        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    opener = next((f for ext, f in _OPENERS.items() if name.endswith(ext)), open)
    return opener(path, "rb")


# what a damaged, vanished or unreadable file can raise while being read
_READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError, zstandard.ZstdError)


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

    def check(self, spec: str, noun: str = "file(s)", stacklevel: int = 3) -> None:
        """Nothing read is an error; files left out are a warning (`stacklevel` from here)."""
        if self.bytes == 0:
            detail = f"; skipped {self.summary()}" if self.skipped or self.empty else ""
            raise DataError(f"data source {spec!r} holds no bytes: {self.files} {noun} read{detail}")
        if self.skipped or self.empty:
            warnings.warn(f"{spec}: skipped {self.summary()}; read {self.files - len(self.empty)} {noun}, "
                          f"{self.bytes:,} bytes", stacklevel=stacklevel)


def read_file(path: Path, limit: int = 0) -> bytes:
    with _open_decompressed(path) as f:
        return f.read(limit) if limit > 0 else f.read()


def stdlib_files() -> list[Path]:
    """The running Python's standard-library sources, in a fixed order. Its empty files (package
    __init__.py) are left out here: they are there by design, not something to report."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts
             and p.stat().st_size > 0]
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
    if path.exists():  # a FIFO or a device (/dev/zero) would be read forever
        raise DataError(f"data path {spec} is neither a file nor a folder (a named pipe or a device?)")
    raise DataError(f"data path not found: {spec}")


def read_documents(spec: str, max_bytes: int = 0, text_field: str = "text") -> tuple[list[bytes], ReadReport]:
    """Read a source into a list of documents (one per file, or per hub record)."""
    if spec.startswith("hf:"):
        return read_hub_dataset(spec[3:], max_bytes, text_field)
    report = ReadReport()
    docs: list[bytes] = []
    # The whole source is read into memory now, so a file that disappears or breaks later
    # cannot hurt the run; one that vanished since listing is skipped like an unreadable one.
    for path in expand_paths(spec):
        remaining = max_bytes - report.bytes if max_bytes else 0
        try:
            data = read_file(path, remaining)
        except _READ_ERRORS as e:
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
    report.check(spec)
    return docs, report


def hub_parts(spec: str) -> tuple[str, str | None, str | None]:
    """The name, config and split of a hub spec `name[:config][@split]` (the text after `hf:`);
    config and split None where the spec has no `:` or `@`. A spec with no name is refused: it
    would read as the working directory."""
    body, at, split = spec.rpartition("@") if "@" in spec else (spec, "", "")
    name, colon, config = body.partition(":")
    if not name.strip():
        raise DataError(f"data 'hf:{spec}' names no dataset after 'hf:' (hf:NAME, hf:BUILDER:PATH or hf:FOLDER)")
    return name, config if colon else None, split if at else None


def open_hub_dataset(spec: str):
    """The records of `name[:config][@split]` (split "train" by default), through `datasets`: a
    Hub dataset, a `save_to_disk` folder, or local files of a builder in HUB_FILE_BUILDERS
    (`json:PATH`, globs allowed); streamed where the source allows."""
    try:
        import datasets
    except ImportError:
        raise DataError("hub datasets need the optional extra: pip install 'rltok[hub]'") from None
    name, config, split = hub_parts(spec)
    config, split = config or "", "train" if split is None else split
    local = Path(name).expanduser()
    if (local / "state.json").is_file() or (local / "dataset_dict.json").is_file():  # save_to_disk
        ds = datasets.load_from_disk(str(local))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"dataset {name} has no split {split!r}; splits: {sorted(ds)}")
            ds = ds[split]
        return ds
    # never a dataset's own loading script: that is code from the Hub (datasets >= 3.0 also
    # refuses it by default; said here so that no version or environment setting turns it on)
    safe = {"trust_remote_code": False}
    if name in HUB_FILE_BUILDERS:
        return datasets.load_dataset(name, data_files=os.path.expanduser(config), split=split, streaming=True, **safe)
    return datasets.load_dataset(name, config or None, split=split, streaming=True, **safe)


# `hf:BUILDER:PATH` reads local data files with one of these `datasets` builders
HUB_FILE_BUILDERS = ("json", "parquet", "csv", "text", "arrow")


def iter_hub_texts(ds, text_field: str, start: int = 0):
    """The text of every record of a dataset from `open_hub_dataset`, from record `start` on, as
    UTF-8 bytes (lone surrogates replaced)."""
    if start:
        ds = ds.skip(start)
    for record in ds:
        if text_field not in record:
            raise DataError(f"the dataset has no field {text_field!r}; fields: {sorted(record)}")
        yield str(record[text_field]).encode("utf-8", errors="replace")


@contextmanager
def hub_errors(spec: str):
    """What `datasets` raises (network, auth, unknown name, unreadable files: many types) as a DataError."""
    try:
        yield
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"cannot read hub dataset {spec!r}: {type(e).__name__}: {e}") from None


def read_hub_dataset(spec: str, max_bytes: int, text_field: str) -> tuple[list[bytes], ReadReport]:
    """`name[:config][@split]` (see `open_hub_dataset`) into memory, up to max_bytes."""
    report = ReadReport()
    docs = []
    with hub_errors(spec):
        for data in iter_hub_texts(open_hub_dataset(spec), text_field):
            docs.append(data)
            report.files += 1
            report.bytes += len(data)
            if max_bytes and report.bytes >= max_bytes:
                break
    if report.bytes == 0:
        raise DataError(f"hub dataset {spec!r} yielded no text")
    return docs, report


def to_tensor(chunks: list[bytes]) -> torch.Tensor:
    """One uint8 stream: the non-empty documents in order, DOC_SEP between two of them (none
    at the start or the end)."""
    joined = bytes([DOC_SEP]).join(c for c in chunks if c)
    return torch.from_numpy(np.frombuffer(joined, dtype=np.uint8).copy())


def doc_key(doc: bytes) -> int:
    """The hash that orders documents for the validation split (the first 8 bytes of a BLAKE2b
    digest, read big-endian); rltok.data.prepare computes the same one incrementally."""
    return int.from_bytes(hashlib.blake2b(doc, digest_size=8).digest(), "big")


def split_cuts(keys, lengths, val_fraction: float) -> tuple[np.ndarray, str]:
    """How many of each document's first bytes go to train, and the rule ("documents" or "tails",
    docs/DATA.md), from the documents' keys and lengths alone, so prepared and in-memory corpora agree.
    "documents" holds out whole documents in hash order (identical ones land on the same side),
    skipping any that would pass twice val_fraction."""
    lengths = np.asarray(lengths, dtype=np.int64)
    keys = np.asarray(keys, dtype=np.uint64)
    total = int(lengths.sum())
    if len(lengths) >= MIN_DOCS_FOR_DOC_SPLIT:
        target, cap = val_fraction * total, 2 * val_fraction * total
        # groups of identical documents, in the order of their key (big-endian = the byte order)
        groups, member = np.unique(keys, return_inverse=True)
        group_bytes = np.bincount(member.reshape(-1), weights=lengths, minlength=len(groups))
        chosen = np.zeros(len(groups), dtype=bool)
        size = 0
        for g, n in enumerate(group_bytes.tolist()):
            if size >= target:
                break
            if size + n <= cap:
                chosen[g] = True
                size += int(n)
        if size >= 2 and total - size >= 2:
            return np.where(chosen[member.reshape(-1)], 0, lengths), "documents"
    return lengths - (lengths * val_fraction).astype(np.int64), "tails"


def corpus_cuts(keys, lengths, val_fraction: float) -> tuple[np.ndarray, str]:
    """`split_cuts`, and for a corpus whose held-out part would be under 2 bytes the "stream"
    rule: the tail of the whole stream is held out (the document cut in two ends train and
    starts val, with no separator on either side of the cut)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cuts, rule = split_cuts(keys, lengths, val_fraction)
    val = lengths - cuts
    if int(val.sum()) + max(0, int(np.count_nonzero(val)) - 1) >= 2:  # the val stream, DOC_SEP included
        return cuts, rule
    total = int(lengths.sum())
    cut = max(1, total - max(2, int(total * val_fraction)))
    seen = np.cumsum(lengths) - lengths
    return np.clip(cut - seen, 0, lengths), "stream"


@dataclass
class Corpus:
    # uint8 tensors, or byte streams read from a prepared folder without loading it
    # (rltok.data.shards.ByteStream: len(), slices, gather(), numpy())
    train: torch.Tensor
    val: torch.Tensor
    source: str
    skipped_files: int = 0  # unreadable or empty files left out while reading
    # how val was made: "given" (an explicit val source or train.*/val.* files), "documents"
    # (whole held-out documents), "tails" (the end of every document), "stream" (the end of a
    # tiny corpus); see split_cuts
    split: str = ""
    prepared: str = ""  # the prepared folder the streams are read from, if any

    def describe(self) -> str:
        skipped = f" ({self.skipped_files} file(s) skipped)" if self.skipped_files else ""
        rule = {"documents": "; val = whole held-out documents", "tails": "; val = the tail of every document",
                "stream": "; val = the tail of the stream"}.get(self.split, "")
        where = "" if not self.prepared else " (byte shards)" if self.prepared == self.source \
            else f" (byte shards in {self.prepared})"
        return f"{self.source}{where}: {len(self.train):,} train bytes, {len(self.val):,} val bytes{skipped}{rule}"

    def fingerprint(self) -> dict:
        """Identifies the training bytes, so a resume can tell when the data changed under it (a
        prepared stream's CRC-32 comes from its manifest and equals the in-memory one)."""
        crc = self.train.crc32() if hasattr(self.train, "crc32") else zlib.crc32(self.train.contiguous().numpy())
        return {"train_bytes": len(self.train), "crc32": crc}


def named_split(spec: str, split: str) -> str | None:
    """If `spec` is a folder holding `<split>.*` files, return a glob for them."""
    path = Path(spec).expanduser()
    if path.is_dir() and any(p.is_file() and p.name.split(".")[0] == split for p in path.iterdir()):
        return str(path / f"{split}.*")
    return None



def _absolute(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def absolute_spec(spec: str) -> str:
    """`spec` with its local paths absolute and normalised (no trailing slash, no `./`), so that a
    run names the same data from any working directory and one path spelled two ways is one path.
    Names that are not local paths ('stdlib', a Hub dataset) are kept as they are."""
    if not spec.strip() or spec == "stdlib":
        return spec
    if spec.startswith("mix:"):  # mix:DIR=W,DIR=W
        parts = []
        for item in spec[4:].split(","):
            folder, sep, weight = item.rpartition("=")
            parts.append(f"{_absolute(folder)}={weight}" if sep else item)
        return "mix:" + ",".join(parts)
    if spec.startswith("hf:"):  # hf:BUILDER:PATH or hf:LOCAL_FOLDER, each with an optional @split
        name, config, split = hub_parts(spec[3:])
        if name in HUB_FILE_BUILDERS and config:
            config = _absolute(config)
        elif config is None and Path(name).expanduser().exists():
            name = _absolute(name)
        return f"hf:{name}" + ("" if config is None else f":{config}") + ("" if split is None else f"@{split}")
    return _absolute(spec)
