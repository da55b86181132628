"""Bytes from anywhere: the standard library, local files/folders/globs, hub datasets.

Everything is read as raw bytes: any byte string is valid input, no decoding ever happens.
Documents (files, hub records) are joined into one stream with DOC_SEP between them.
Splits are deterministic (see `split_documents`): a folder holding `train*` and `val*` (and
`test*`) files uses them as given; otherwise a source of at least MIN_DOCS_FOR_DOC_SPLIT
documents holds out whole documents, chosen by a hash of their bytes, so train and val share
no document; a smaller source holds out the last `val_fraction` of every document.

A folder written by `rltok prepare` (rltok.prepare, rltok.shards) is read from its byte shards
without loading it; `mix:DIR=W,DIR=W` mixes several of them; a large unprepared source is
prepared into a cache folder on first use (`load_corpus(prepare_above=...)`).

Why one file of this length: every path from a source to train/val bytes (reading, the split
rule, load_corpus, evaluation bytes, the window samplers) is here, so the in-memory loader and
rltok.prepare share one split rule (split_cuts, corpus_cuts) and one DOC_SEP.
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

from .config import DataConfig


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


def open_hub_dataset(spec: str):
    """The records of `name[:config][@split]` (split "train" by default), through `datasets`:
    a Hub dataset streamed (network), a folder written by `save_to_disk`, local data files of a
    packaged builder (`json:PATH`, `parquet:PATH`, `csv:PATH`, `text:PATH`, `arrow:PATH`; globs
    allowed) or a local folder of such files. Streamed where the source allows: nothing is
    downloaded or converted as a whole first."""
    try:
        import datasets
    except ImportError:
        raise DataError("hub datasets need the optional extra: pip install 'rltok[hub]'") from None
    split = "train"
    if "@" in spec:
        spec, split = spec.rsplit("@", 1)
    name, _, config = spec.partition(":")
    local = Path(name).expanduser()
    if (local / "state.json").is_file() or (local / "dataset_dict.json").is_file():  # save_to_disk
        ds = datasets.load_from_disk(str(local))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"dataset {name} has no split {split!r}; splits: {sorted(ds)}")
            ds = ds[split]
        return ds
    if name in HUB_FILE_BUILDERS:
        return datasets.load_dataset(name, data_files=os.path.expanduser(config), split=split, streaming=True)
    return datasets.load_dataset(name, config or None, split=split, streaming=True)


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


def read_hub_dataset(spec: str, max_bytes: int, text_field: str) -> tuple[list[bytes], ReadReport]:
    """`name[:config][@split]` (see `open_hub_dataset`) into memory, up to max_bytes."""
    report = ReadReport()
    docs = []
    try:
        for data in iter_hub_texts(open_hub_dataset(spec), text_field):
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


def doc_key(doc: bytes) -> int:
    """The hash that orders documents for the validation split (the first 8 bytes of a BLAKE2b
    digest, read big-endian); rltok.prepare computes the same one incrementally."""
    return int.from_bytes(hashlib.blake2b(doc, digest_size=8).digest(), "big")


def _stream_len(lengths: np.ndarray) -> int:
    """Length of the stream to_tensor makes of pieces of these lengths (DOC_SEP between non-empty ones)."""
    nonempty = int(np.count_nonzero(lengths))
    return int(lengths.sum()) + max(0, nonempty - 1)


def split_cuts(keys, lengths, val_fraction: float) -> tuple[np.ndarray, str]:
    """The rule of `split_documents` on the documents' keys (`doc_key`) and lengths alone, so that
    a corpus prepared on disk splits exactly as one read into memory: for each document, how
    many of its first bytes go to train (the rest is held out), and the rule ("documents" or
    "tails")."""
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
    if _stream_len(lengths - cuts) >= 2:
        return cuts, rule
    total = int(lengths.sum())
    cut = max(1, total - max(2, int(total * val_fraction)))
    seen = np.cumsum(lengths) - lengths
    return np.clip(cut - seen, 0, lengths), "stream"


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
    cuts, rule = split_cuts([doc_key(d) for d in docs], [len(d) for d in docs], val_fraction)
    train = [d[:c] for d, c in zip(docs, cuts.tolist())]
    val = [d[c:] for d, c in zip(docs, cuts.tolist())]
    if rule == "documents":
        return [d for d in train if d], [v for v in val if v], rule
    return train, [v for v in val if v], rule


@dataclass
class Corpus:
    # uint8 tensors, or byte streams read from a prepared folder without loading it
    # (rltok.shards.ByteStream: len(), slices, gather(), numpy())
    train: torch.Tensor
    val: torch.Tensor
    source: str
    skipped_files: int = 0  # unreadable or empty files left out while reading
    # how val was made: "given" (an explicit val source or train.*/val.* files), "documents"
    # (whole held-out documents), "tails" (the end of every document), "stream" (the end of a
    # tiny corpus); see split_documents
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
        """Identifies the training bytes, so a resume can tell when the data changed under it. A
        prepared stream's CRC-32 comes from its manifest (nothing is read); it equals the CRC of
        the same bytes loaded into memory, so the two are interchangeable."""
        crc = self.train.crc32() if hasattr(self.train, "crc32") else zlib.crc32(self.train.contiguous().numpy())
        return {"train_bytes": len(self.train), "crc32": crc}


def _split_files(folder: Path, name: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.split(".")[0] == name)


def named_split(spec: str, split: str) -> str | None:
    """If `spec` is a folder holding `<split>.*` files, return a glob for them."""
    path = Path(spec).expanduser()
    if path.is_dir() and _split_files(path, split):
        return str(path / f"{split}.*")
    return None


def _prepared_source(spec: str, val: str, val_fraction: float, max_bytes: int, text_field: str,
                     prepare_above: int | None, cache_dir: str) -> str | None:
    """The prepared folder to read `spec` from: the folder itself when `rltok prepare` wrote it,
    the cache folder when the source is large (prepared there on first use), else None."""
    from .shards import is_prepared

    if is_prepared(spec):
        return spec
    from .prepare import is_large, prepare_cached

    limit = DataConfig.prepare_above if prepare_above is None else prepare_above
    if not is_large(spec, val, max_bytes, limit):
        return None
    return str(prepare_cached(spec, val=val, val_fraction=val_fraction, max_bytes=max_bytes,
                              text_field=text_field, cache_dir=cache_dir))


def load_corpus(train: str = "stdlib", val: str = "", val_fraction: float = 0.02, max_bytes: int = 0,
                text_field: str = "text", *, prepare_above: int | None = None, cache_dir: str = "") -> Corpus:
    """The train and val streams of a source (see the module docstring). A prepared folder is
    read from its shards (`max_bytes` then keeps the first bytes of its train split); a source
    larger than `prepare_above` bytes (default data.prepare_above; 0 = never) is prepared into
    `cache_dir` first, with a message."""
    if train.startswith("mix:"):
        from .shards import open_mixture

        return open_mixture(train[4:])
    prepared = _prepared_source(train, val, val_fraction, max_bytes, text_field, prepare_above, cache_dir)
    if prepared is not None:
        from .shards import open_prepared

        corpus = open_prepared(prepared).corpus(source=train)
        if prepared == train:  # the user's own prepared folder: caps and a val source apply on top
            if max_bytes:
                corpus.train = corpus.train.prefix(max_bytes)
            if val:
                docs, _ = read_documents(val, 0, text_field)
                corpus.val, corpus.split = to_tensor(docs), "given"
        if len(corpus.train) < 2 or len(corpus.val) < 2:
            raise DataError(f"prepared corpus {prepared} is too small ({len(corpus.train)} train bytes, "
                            f"{len(corpus.val)} val bytes)")
        return corpus
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
    cuts, rule = corpus_cuts([doc_key(d) for d in docs], [len(d) for d in docs], val_fraction)
    tr = [d[:c] for d, c in zip(docs, cuts.tolist())]
    va = [d[c:] for d, c in zip(docs, cuts.tolist())]
    corpus = Corpus(to_tensor(tr), to_tensor(va), train, skipped, rule)
    if len(corpus.train) < 2:
        raise DataError(f"data source {train!r} is too small to train on ({len(corpus.train)} bytes)")
    return corpus


def load_eval_bytes(spec: str, split: str = "val", max_bytes: int = 0, val_fraction: float = 0.02,
                    *, prepare_above: int | None = None, cache_dir: str = "") -> torch.Tensor:
    """Bytes to evaluate on: the named split of a split folder or of a prepared folder, else
    exactly the val bytes `load_corpus` holds out (split="val": whole documents or document
    tails, see `split_documents`) or the whole source (split="all"); documents separated by
    DOC_SEP. From a prepared folder the result is a byte stream read on demand."""
    if spec.startswith("mix:"):
        if split != "val":
            raise DataError(f"a mix: source has only its sources' val splits, not {split!r}")
        return load_corpus(spec, val_fraction=val_fraction).val
    from .shards import is_prepared, open_prepared

    if is_prepared(spec):
        if split == "all":
            raise DataError(f"{spec} is a prepared corpus: its splits are kept, not the whole source; "
                            "evaluate on --split train, val or test")
        stream = open_prepared(spec).stream(split)
        return stream.prefix(max_bytes) if max_bytes else stream
    named = named_split(spec, split)
    if named:
        docs, _ = read_documents(named, max_bytes)
        return to_tensor(docs)
    if split == "all":
        docs, _ = read_documents(spec, max_bytes)
        return to_tensor(docs)
    return load_corpus(spec, val_fraction=val_fraction, max_bytes=max_bytes, prepare_above=prepare_above,
                       cache_dir=cache_dir).val


def take_windows(data, starts: torch.Tensor, length: int) -> torch.Tensor:
    """The `length` bytes from each start, (len(starts), length) uint8. A byte stream reads just
    these windows from disk."""
    if isinstance(data, torch.Tensor):
        return data[starts.unsqueeze(1) + torch.arange(length)]
    return torch.from_numpy(data.gather(starts.numpy(), length))


class WindowSampler:
    """Random (x, y) windows of seq_len+1 bytes; its RNG state is the data position.

    Data-parallel sharding: with `world_size` N every rank draws the starts of the whole global
    batch (batch_size * N windows) from the same seeded generator and keeps its own block of
    batch_size rows, so N ranks together see exactly the batch one process with batch_size * N
    would, and the generator state stays identical on every rank. Each rank reads only its own
    windows. `data` is a uint8 tensor or a byte stream (rltok.shards); a stream that draws its
    own starts (a weighted mixture of sources) is asked for them."""

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(data) < 2:
            raise DataError("need at least 2 bytes of training data")
        self.data = data
        self.batch_size = batch_size  # per rank
        self.seq_len = min(seq_len, getattr(data, "window_limit", len(data)) - 1)
        self.rank, self.world_size = rank, world_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.batch_size * self.world_size
        if hasattr(self.data, "draw_starts"):
            starts = self.data.draw_starts(self.gen, n, self.seq_len + 1)
        else:
            starts = torch.randint(0, len(self.data) - self.seq_len, (n,), generator=self.gen)
        starts = starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        win = take_windows(self.data, starts, self.seq_len + 1).long()
        return win[:, :-1], win[:, 1:]

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])


def _eval_starts(n: int, seq_len: int, max_windows: int) -> tuple[torch.Tensor, int]:
    if n < 2:
        raise DataError("evaluation data needs at least 2 bytes")
    seq_len = min(seq_len, n - 1)
    n_all = (n - 1) // seq_len
    idx = np.arange(n_all)
    if max_windows and n_all > max_windows:
        idx = np.linspace(0, n_all - 1, max_windows).round().astype(np.int64)
    return torch.from_numpy(idx * seq_len), seq_len


def eval_windows(data: torch.Tensor, seq_len: int, max_windows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (x, y) windows tiling `data` in order, the same on every call; with
    `max_windows`, an evenly spaced subset of them. Returns (N, T) long tensors."""
    starts, seq_len = _eval_starts(len(data), seq_len, max_windows)
    win = take_windows(data, starts, seq_len + 1).long()
    return win[:, :-1], win[:, 1:]


def rank_eval_windows(data: torch.Tensor, seq_len: int, max_windows: int, rank: int = 0,
                      world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A data-parallel rank's share of `eval_windows(data, seq_len, max_windows)`, reading only
    those windows: ranks take equal consecutive blocks (FSDP needs the same number of forwards on
    every rank; a remainder is left out). With fewer windows than ranks every rank takes all of
    them, and `shared` (the third value) says so: their sums are then averaged, not added."""
    starts, seq_len = _eval_starts(len(data), seq_len, max_windows)
    shared = len(starts) < world_size
    if not shared and world_size > 1:
        n = len(starts) // world_size
        starts = starts[rank * n:(rank + 1) * n]
    win = take_windows(data, starts, seq_len + 1).long()
    return win[:, :-1], win[:, 1:], shared


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
