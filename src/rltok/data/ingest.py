"""Reading a source into byte shards, resumable at every shard: the ingest phase of `rltok prepare`,
and the copy of staged documents into the train/val split (docs/DATA.md)."""


import hashlib
import multiprocessing
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from rltok.data.sources import (DOC_SEP, DataError, _open_decompressed, _READ_ERRORS, expand_paths,
                                hub_errors, iter_hub_texts, open_hub_dataset)
from rltok.data.shards import READ_BLOCK, ByteStream, ShardWriter, save_array

SEP = bytes([DOC_SEP])


def _log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


# ---- sources ------------------------------------------------------------------------------------

@dataclass
class Item:
    """One document of a source: a file or a record, as chunks of bytes (reading may raise)."""
    index: int
    name: str
    chunks: Iterator[bytes]


def _read_upto(f, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = f.read(n - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _file_chunks(path: Path) -> Iterator[bytes]:
    with _open_decompressed(path) as f:
        while block := _read_upto(f, READ_BLOCK):
            yield block


def _read_small(path: Path) -> tuple[str, bytes]:
    """In a worker: ("data", the file) when it holds at most READ_BLOCK bytes, ("big", b"") when
    it holds more (the main process streams it), ("error", message)."""
    try:
        with _open_decompressed(path) as f:
            data = _read_upto(f, READ_BLOCK + 1)
    except _READ_ERRORS as e:
        return "error", f"{type(e).__name__}: {e}".encode()
    return ("big", b"") if len(data) > READ_BLOCK else ("data", data)


def _worker_chunks(path: Path, result: tuple[str, bytes]) -> Iterator[bytes]:
    kind, data = result
    if kind == "error":
        raise OSError(data.decode(errors="replace"))
    if kind == "big":
        yield from _file_chunks(path)
    elif data:
        yield data


class FileSource:
    """Local files in rltok's order; with num_proc > 1, read and decompressed by worker processes
    (the order kept, a few files ahead at most)."""
    truncates = True  # a byte cap cuts the last file short, as rltok.data.corpus.read_documents does
    unit = "file"

    def __init__(self, spec: str, num_proc: int = 1):
        self.paths = expand_paths(spec)
        self.num_proc = num_proc

    def total(self) -> int | None:
        return len(self.paths)

    def position(self, item: int) -> None:
        return None  # files are counted from the start

    def items(self, start: int, position=None) -> Iterator[Item]:
        if self.num_proc <= 1 or len(self.paths) - start < 2:
            for i in range(start, len(self.paths)):
                yield Item(i, str(self.paths[i]), _file_chunks(self.paths[i]))
            return
        ahead = threading.Semaphore(4 * self.num_proc)
        stop = threading.Event()

        def feed():
            for path in self.paths[start:]:
                ahead.acquire()
                if stop.is_set():
                    return
                yield path

        # fork where there is one: the workers only read files, and a spawned worker would first
        # import rltok (and torch) again
        methods = multiprocessing.get_all_start_methods()
        pool = multiprocessing.get_context("fork" if "fork" in methods else "spawn").Pool(self.num_proc)
        try:
            for i, result in enumerate(pool.imap(_read_small, feed()), start):
                ahead.release()
                yield Item(i, str(self.paths[i]), _worker_chunks(self.paths[i], result))
        finally:
            stop.set()
            for _ in range(4 * self.num_proc + 1):  # let the feeding thread see `stop`
                ahead.release()
            pool.terminate()
            pool.join()


class HubSource:
    """Records of an `hf:` dataset, streamed (rltok.data.corpus.open_hub_dataset). A streamed dataset
    resumes from the `datasets` iteration state saved with the last shard (shard and record
    within it), not by reading every record before it again."""
    truncates = False  # a byte cap stops after the record that reaches it, as read_hub_dataset does
    unit = "doc"

    def __init__(self, spec: str, text_field: str):
        self.spec, self.text_field = spec, text_field
        with hub_errors(spec):
            self.ds = open_hub_dataset(spec[3:])
        self.stateful = hasattr(self.ds, "state_dict") and hasattr(self.ds, "load_state_dict")
        self._at: tuple[int, dict | None] = (0, None)  # (record, the iteration state before it)

    def total(self) -> int | None:
        try:
            return len(self.ds)
        except TypeError:  # streamed: unknown
            return None

    def position(self, item: int) -> dict | None:
        """What `items` needs to start again at record `item` (None: count records from the start)."""
        index, state = self._at
        return state if self.stateful and index == item else None

    def items(self, start: int, position: dict | None = None) -> Iterator[Item]:
        with hub_errors(self.spec):
            ds, texts_from = self.ds, start
            if self.stateful and position is not None:
                ds.load_state_dict(position)
                texts_from = 0
            before = position
            for i, text in enumerate(iter_hub_texts(ds, self.text_field, texts_from), start):
                self._at = (i, before)
                yield Item(i, f"{self.spec} record {i}", iter((text,)))
                before = ds.state_dict() if self.stateful else None


def open_source(spec: str, text_field: str = "text", num_proc: int = 1):
    return HubSource(spec, text_field) if spec.startswith("hf:") else FileSource(spec, num_proc)


# ---- phase 1: a source into a stream -------------------------------------------------------------

def _save_docs(path: Path, docs: list[tuple[int, int, int]]) -> None:
    """(start, length, key) rows as int64 (the unsigned key stored bit for bit)."""
    save_array(path, np.array(docs, dtype=np.uint64).reshape(-1, 3).view(np.int64))


class _SourceError(Exception):
    """Reading an item of the source failed (not writing the shards: that is never skipped)."""

    def __init__(self, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")


def _guarded(chunks: Iterator[bytes]) -> Iterator[bytes]:
    try:
        yield from chunks
    except _READ_ERRORS as e:
        raise _SourceError(e) from None


class Ingest:
    """One source into one stream, resumable at every shard. The saved position: `item` (the first
    source item not wholly in the stream), `offset` (how many of its bytes are) and `doc_start`
    (where its document starts, None if not begun)."""

    def __init__(self, source, writer: ShardWriter, state: dict, limit: int, keyed: bool, docs_path, save):
        self.source, self.writer, self.limit, self.keyed = source, writer, limit, keyed
        self.docs_path, self.save = docs_path, save  # docs_path(k): file of the k-th commit's documents
        self.item = state.get("item", 0)
        self.offset = state.get("offset", 0)
        self.doc_start = state.get("doc_start")
        self.doc_bytes = state.get("doc_bytes", 0)  # bytes of the documents before `item`
        self.commits = state.get("commits", 0)
        self.read = state.get("read", 0)  # items read (empty ones included)
        self.skipped = [tuple(s) for s in state.get("skipped", [])]
        self.empty = list(state.get("empty", []))
        self.position = state.get("position")  # the source's own resume state at `item`, if it has one
        self.new_docs: list[tuple[int, int, int]] = []
        self.hasher = None

    def state(self, done: bool = False) -> dict:
        return {"done": done, "item": self.item, "offset": self.offset, "doc_start": self.doc_start,
                "doc_bytes": self.doc_bytes, "commits": self.commits, "read": self.read,
                "skipped": self.skipped, "empty": self.empty, "writer": self.writer.state(),
                "position": self.source.position(self.item) if self.source is not None and not done else None}

    def commit(self, done: bool = False) -> None:
        self.writer.commit()
        _save_docs(self.docs_path(self.commits), self.new_docs)
        self.commits += 1
        self.new_docs = []
        self.save(self.state(done))

    def emit(self, data, advance: bool) -> None:
        self.writer.fill(data, self.commit, self._advance if advance else None)

    def _advance(self, n: int) -> None:
        self.offset += n

    def _hash(self, data) -> None:
        if self.hasher is not None:
            self.hasher.update(data)

    def _start_doc(self) -> None:
        sep = self.writer.pos > 0  # a document before this one: the separator goes first
        self.doc_start = self.writer.pos + sep
        self.hasher = hashlib.blake2b(digest_size=8) if self.keyed else None
        if sep:
            self.emit(SEP, advance=False)

    def run(self, bar) -> None:
        for item in self.source.items(self.item, self.position):
            if self.limit and self.doc_bytes >= self.limit:
                break
            self._read_item(item)
            bar.update(1)
            if item.index % 64 == 0:
                bar.set_postfix_str(f"{self.writer.pos / 1e6:,.1f} MB", refresh=False)
        self.commit(done=True)  # the last, shorter shard

    def _read_item(self, item: Item) -> None:
        cap = self.limit - self.doc_bytes if self.limit and self.source.truncates else 0
        skip = self.offset  # bytes of this item already in the stream (a resumed run)
        if self.doc_start is not None:  # resumed inside a document: hash its first bytes again
            self.hasher = hashlib.blake2b(digest_size=8) if self.keyed else None
        taken = 0
        try:
            for chunk in _guarded(item.chunks):
                if cap:
                    chunk = chunk[:cap - taken]
                taken += len(chunk)
                if skip:
                    k = min(skip, len(chunk))
                    self._hash(chunk[:k])
                    skip, chunk = skip - k, chunk[k:]
                if chunk:
                    if self.doc_start is None:
                        self._start_doc()
                    self._hash(chunk)
                    self.emit(chunk, advance=True)
                if cap and taken >= cap:
                    break
        except _SourceError as e:
            if self.doc_start is not None:  # part of it is in the stream already: it cannot be left out
                raise DataError(f"cannot read {item.name} after {self.offset:,} of its bytes were written "
                                f"({e}); fix or remove it, then prepare into an empty folder") from None
            self.skipped.append((item.name, str(e)))
            self.item, self.offset = self.item + 1, 0
            return
        if skip:
            raise DataError(f"{item.name} is shorter than when this preparation began (the source changed); "
                            "prepare it into an empty folder")
        if self.doc_start is None:
            self.empty.append(item.name)
        else:
            length = self.writer.pos - self.doc_start
            key = int.from_bytes(self.hasher.digest(), "big") if self.hasher is not None else 0
            self.new_docs.append((self.doc_start, length, key))
            self.doc_bytes += length
        self.read += 1
        self.item, self.offset, self.doc_start, self.hasher = self.item + 1, 0, None, None


# ---- phase 2: staging into train and val ---------------------------------------------------------

def copy_pieces(staging: ByteStream, starts: np.ndarray, lengths: np.ndarray, writer: ShardWriter, save, bar) -> None:
    """Write the pieces [start, start + length) of `staging`, DOC_SEP between two, continuing
    from what `writer` already holds. Pieces that follow one another in the staging stream
    (one separator apart) are copied as one range."""
    if len(starts) == 0:
        writer.commit()
        save(done=True)
        return
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] != starts[:-1] + lengths[:-1] + 1
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(starts)] - 1
    r_start = starts[first]
    r_len = starts[last] + lengths[last] - r_start
    r_out = np.cumsum(r_len + 1) - (r_len + 1)  # where each range starts in the output
    r0 = int(np.searchsorted(r_out, writer.pos, side="right")) - 1
    offset = writer.pos - int(r_out[r0])  # written bytes of range r0 (its separator included)
    bar.update(writer.pos)

    def full() -> None:
        writer.commit()
        save(done=False)

    def emit(data) -> None:
        writer.fill(data, full, bar.update)

    for r in range(r0, len(r_start)):
        if r > r0:
            emit(SEP)
        o = offset if r == r0 else 0
        while o < r_len[r]:
            k = int(min(READ_BLOCK, r_len[r] - o))
            emit(staging.read(int(r_start[r]) + o, k))
            o += k
    writer.commit()
    save(done=True)


# ---- the preparation ----------------------------------------------------------------------------
