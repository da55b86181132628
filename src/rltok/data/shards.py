"""Prepared corpora on disk: the shard format (docs/DATA.md), its writer and a reader that loads
nothing. Shard headers name the format, split, index, length and preparation id, so a foreign shard
is refused."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rltok.config.files import fsync_dir, read_json, sha256_file
from rltok.data.sources import DOC_SEP, Corpus, DataError

FORMAT = "rltok-shards"
FORMAT_VERSION = 1
MANIFEST = "rltok-shards.json"
WORK_DIR = ".rltok-prepare"  # a preparation in progress (rltok.data.prepare); gone once the manifest is written
MAGIC = b"RLTKSHRD"
# magic, format version, shard index, payload bytes, preparation id, split name, reserved
HEADER = struct.Struct("<8sIIQ16s16s8x")
HEADER_BYTES = HEADER.size  # 64
SPLITS = ("train", "val", "test")
READ_BLOCK = 16 << 20  # bytes per read of a stream or a source file; files up to this size are read whole


def is_prepared(spec: str) -> bool:
    """Whether `spec` names a folder that `rltok prepare` wrote (or started to write)."""
    if not spec or spec == "stdlib" or ":" in spec.split("/")[0]:  # stdlib, hf:, mix:
        return False
    path = Path(spec).expanduser()
    return (path / MANIFEST).is_file() or (path / WORK_DIR).is_dir()


# ---- reading ------------------------------------------------------------------------------------

class _File:
    """One shard's payload: positional reads from an open descriptor (thread-safe, no shared offset)."""

    def __init__(self, path: Path, base: int, length: int):
        self.path, self.base, self.length = path, base, length
        self._fd: int | None = None
        self._lock = threading.Lock()

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except OSError as e:
                raise DataError(f"cannot open shard {self.path}: {e.strerror}") from None
        return self._fd

    def read_into(self, out: np.ndarray, offset: int) -> None:
        view = memoryview(out).cast("B")
        fd, pos, done = self._open(), self.base + offset, 0
        while done < len(view):
            if hasattr(os, "preadv"):
                n = os.preadv(fd, [view[done:]], pos + done)
            else:  # no positional reads on this platform: seek + read under a lock
                with self._lock:
                    os.lseek(fd, pos + done, os.SEEK_SET)
                    chunk = os.read(fd, len(view) - done)
                n = len(chunk)
                view[done:done + n] = chunk
            if n <= 0:
                raise DataError(f"shard {self.path} ended early (truncated after it was opened?)")
            done += n

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __getstate__(self):  # a copy in another process opens its own descriptor
        return {"path": self.path, "base": self.base, "length": self.length}

    def __setstate__(self, state):
        self.__init__(state["path"], state["base"], state["length"])

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _Array:
    """Bytes held in memory (a separator between two streams)."""

    def __init__(self, data: np.ndarray):
        self.data, self.length = data, len(data)

    def read_into(self, out: np.ndarray, offset: int) -> None:
        out[:] = self.data[offset:offset + len(out)]


class ByteStream:
    """A read-only uint8 sequence made of pieces (shard payloads), read on demand: it stands in for
    an in-memory corpus's tensor (len(), `gather`, slices, numpy(), `crc32()`)."""

    def __init__(self, pieces: list, name: str = "", crc: int | None = None):
        self.pieces = [p for p in pieces if p.length > 0]
        self.name = name
        self._crc = crc
        ends = list(itertools.accumulate(p.length for p in self.pieces))
        self._starts, self._len = [0, *ends[:-1]], ends[-1] if ends else 0

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"ByteStream({self.name!r}, {self._len:,} bytes in {len(self.pieces)} piece(s))"

    def read_into(self, out: np.ndarray, start: int) -> None:
        """Fill `out` (contiguous uint8) with the bytes from `start` on."""
        n = len(out)
        if start < 0 or start + n > self._len:
            raise IndexError(f"bytes {start}..{start + n} outside a stream of {self._len}")
        i = bisect.bisect_right(self._starts, start) - 1
        done = 0
        while done < n:
            piece, offset = self.pieces[i], start + done - self._starts[i]
            k = min(n - done, piece.length - offset)
            piece.read_into(out[done:done + k], offset)
            done += k
            i += 1

    def read(self, start: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.uint8)
        self.read_into(out, start)
        return out

    def gather(self, starts: np.ndarray, length: int) -> np.ndarray:
        """(len(starts), length) uint8: the window at each start, read straight into the batch."""
        out = np.empty((len(starts), length), dtype=np.uint8)
        for row, start in zip(out, np.asarray(starts).tolist()):
            self.read_into(row, start)
        return out

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self._len)
            if step != 1:
                raise IndexError("a byte stream takes slices with step 1")
            return torch.from_numpy(self.read(start, max(0, stop - start)))
        if isinstance(key, int):
            if key < 0:
                key += self._len
            return int(self.read(key, 1)[0])
        raise TypeError(f"a byte stream is indexed by int or slice, not {type(key).__name__}")

    def numpy(self) -> np.ndarray:
        """All of it, in memory."""
        return self.read(0, self._len)

    def crc32(self) -> int:
        """CRC-32 of the whole stream (from the manifest when known, else read)."""
        if self._crc is None:
            crc = 0
            for start in range(0, self._len, READ_BLOCK):
                crc = zlib.crc32(self.read(start, min(READ_BLOCK, self._len - start)), crc)
            self._crc = crc
        return self._crc

    def prefix(self, n: int) -> "ByteStream":
        """The first n bytes (all of them when n >= len)."""
        if n >= self._len:
            return self
        pieces, left = [], n
        for p in self.pieces:
            if left <= 0:
                break
            k = min(left, p.length)
            pieces.append(p if k == p.length else _File(p.path, p.base, k) if isinstance(p, _File)
                          else _Array(p.data[:k]))
            left -= k
        return ByteStream(pieces, f"{self.name}[:{n}]")

    @classmethod
    def concat(cls, streams: list["ByteStream"], name: str = "") -> "ByteStream":
        """The streams one after the other, DOC_SEP between two of them (as between documents)."""
        pieces = []
        for i, s in enumerate(streams):
            if i and len(s):
                pieces.append(_Array(np.array([DOC_SEP], dtype=np.uint8)))
            pieces.extend(s.pieces)
        return cls(pieces, name)


class Mixture(ByteStream):
    """Several training streams drawn with fixed weights, a window from one source (docs/DATA.md,
    "Mixing"); the sampler asks it for window starts."""

    def __init__(self, streams: list[ByteStream], weights: list[float], name: str = ""):
        super().__init__([p for s in streams for p in s.pieces], name)
        self.streams = streams
        self.weights = torch.tensor(weights, dtype=torch.float64) / sum(weights)
        self.offsets = torch.tensor(np.cumsum([0] + [len(s) for s in streams[:-1]]), dtype=torch.int64)
        self.lengths = torch.tensor([len(s) for s in streams], dtype=torch.int64)
        self.window_limit = min(len(s) for s in streams)  # the longest window every source holds

    def draw_starts(self, gen: torch.Generator, n: int, length: int) -> torch.Tensor:
        source = torch.multinomial(self.weights, n, replacement=True, generator=gen)
        # 62 random bits modulo the range: a bias below range / 2^62, nothing at any corpus size
        u = torch.randint(0, 1 << 62, (n,), generator=gen, dtype=torch.int64)
        return self.offsets[source] + u % (self.lengths[source] - length + 1)

    def crc32(self) -> int:
        parts = [(s.crc32(), len(s), float(w)) for s, w in zip(self.streams, self.weights.tolist())]
        return zlib.crc32(json.dumps(parts).encode())


# ---- the prepared folder ------------------------------------------------------------------------

def _fail(path: Path, msg: str) -> DataError:
    return DataError(f"{path}: {msg}; prepare it again with `rltok prepare` (into an empty folder)")


def read_manifest(path: str | Path) -> dict:
    """The manifest of a prepared folder, its format and version checked."""
    path = Path(path).expanduser()
    file = path / MANIFEST
    if not file.is_file():
        if (path / WORK_DIR).is_dir():
            raise DataError(f"{path}: its preparation did not finish (interrupted?); run the same "
                            "`rltok prepare SRC --out DIR` again to resume it")
        raise DataError(f"{path} is not a prepared corpus (no {MANIFEST})")
    try:  # bounded: a manifest nested thousands deep or holding a huge number is one error
        manifest = read_json(file, MANIFEST, limit=256 << 20)
    except ValueError as e:
        raise _fail(path, f"cannot read {MANIFEST} ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _fail(path, f"{MANIFEST} does not describe an rltok prepared corpus")
    if manifest.get("version") != FORMAT_VERSION:
        raise DataError(f"{path} was written by another version of rltok (shard format version "
                        f"{manifest.get('version')}; this rltok reads version {FORMAT_VERSION}); "
                        "prepare it again with this version")
    return manifest


def check_shard(path: Path, split: str, index: int, length: int, corpus_id: bytes) -> None:
    """Refuse a shard that is not the one the manifest lists: missing, truncated or longer,
    another format version, another split or position, or another preparation's."""
    try:
        size = path.stat().st_size
    except OSError:
        raise DataError(f"shard {path} is missing; the prepared corpus is incomplete") from None
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise DataError(f"shard {path} is truncated: {len(raw)} bytes, not even its {HEADER_BYTES}-byte header")
    magic, version, idx, n, cid, sp = HEADER.unpack(raw)
    sp = sp.rstrip(b"\0").decode("ascii", errors="replace")
    if magic != MAGIC:
        raise DataError(f"{path} is not an rltok shard (bad magic bytes)")
    if version != FORMAT_VERSION:
        raise DataError(f"shard {path} was written by another version of rltok (shard format version "
                        f"{version}; this rltok reads version {FORMAT_VERSION}); prepare the corpus again")
    if cid != corpus_id:
        raise DataError(f"shard {path} belongs to another prepared corpus than its manifest "
                        "(mixed folders?); prepare the corpus again")
    if (sp, idx) != (split, index):
        raise DataError(f"shard {path} holds {sp} shard {idx}, but the manifest lists it as {split} shard {index}")
    if n != length:
        raise DataError(f"shard {path} holds {n:,} bytes, the manifest says {length:,}: the manifest does not match")
    if size != HEADER_BYTES + length:
        what = "truncated" if size < HEADER_BYTES + length else "longer than its header says"
        raise DataError(f"shard {path} is {what}: {size - HEADER_BYTES:,} of {length:,} bytes")


@dataclass
class Prepared:
    """An opened prepared folder: its manifest, checked against every shard's header and size."""
    path: Path
    manifest: dict

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def stream(self, split: str) -> ByteStream:
        if split not in self.manifest["splits"]:
            raise DataError(f"{self.path} has no {split!r} split (it has {', '.join(self.splits)})")
        info = self.manifest["splits"][split]
        pieces = [_File(self.path / s["file"], HEADER_BYTES, s["bytes"]) for s in info["shards"]]
        return ByteStream(pieces, f"{self.path}:{split}", crc=info["crc32"])

    def documents(self, split: str) -> np.ndarray:
        """int64 (documents, 2): start and length of each document of the split's stream."""
        return np.load(self.path / self.manifest["splits"][split]["index"]["file"], mmap_mode="r")

    def corpus(self, source: str = "") -> Corpus:
        m = self.manifest
        return Corpus(self.stream("train"), self.stream("val") if "val" in m["splits"] else ByteStream([]),
                      source or str(self.path), m.get("read", {}).get("left_out", 0), m["split"]["rule"],
                      prepared=str(self.path))


def open_prepared(path: str | Path) -> Prepared:
    """Open a prepared folder, checking the manifest and every shard's header and size (milliseconds);
    bytes are read only when asked for. `verify_prepared` also checks their checksums."""
    path = Path(path).expanduser()
    manifest = read_manifest(path)
    try:  # the manifest's structure; a hand-edited or damaged one fails here, not later
        corpus_id = bytes.fromhex(manifest["id"])
        shard_bytes = int(manifest["shard_bytes"])
        rule = manifest["split"]["rule"]
        splits = {name: (int(info["bytes"]), [(s["file"], int(s["bytes"])) for s in info["shards"]],
                         info["index"]["file"], int(info["index"]["bytes"]), int(info["crc32"]))
                  for name, info in manifest["splits"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _fail(path, f"{MANIFEST} is incomplete or malformed ({type(e).__name__}: {e})") from None
    if not isinstance(rule, str) or "train" not in splits:
        raise _fail(path, f"{MANIFEST} names no split rule or no train split")
    for split, (total, shards, index, index_bytes, _) in splits.items():
        sizes = [n for _, n in shards]
        if sum(sizes) != total or any(n != shard_bytes for n in sizes[:-1]):
            raise _fail(path, f"the {split} split's shard sizes do not add up to its {total:,} bytes")
        for i, (file, n) in enumerate(shards):
            check_shard(path / file, split, i, n, corpus_id)
        index_path = path / index
        if not index_path.is_file() or index_path.stat().st_size != index_bytes:
            raise _fail(path, f"the {split} document index {index} is missing or does not match the manifest")
    return Prepared(path, manifest)


def verify_prepared(path: str | Path, log=None) -> dict:
    """Read every shard and index of a prepared folder and check them against the manifest's
    SHA-256 and CRC-32; DataError on the first mismatch. Returns bytes and shards checked."""
    prepared = open_prepared(path)
    checked = {"bytes": 0, "shards": 0}
    for split, info in prepared.manifest["splits"].items():
        crc = 0
        for s in info["shards"]:
            file = prepared.path / s["file"]
            h = hashlib.sha256()
            with open(file, "rb") as f:
                f.seek(HEADER_BYTES)
                while block := f.read(READ_BLOCK):
                    h.update(block)
                    crc = zlib.crc32(block, crc)
            if h.hexdigest() != s["sha256"]:
                raise DataError(f"shard {file} does not match its checksum in the manifest (damaged?)")
            checked["bytes"] += s["bytes"]
            checked["shards"] += 1
        if crc != info["crc32"]:
            raise DataError(f"the {split} stream of {prepared.path} does not match its CRC-32 in the manifest")
        index = prepared.path / info["index"]["file"]
        if sha256_file(index) != info["index"]["sha256"]:
            raise DataError(f"document index {index} does not match its checksum in the manifest")
        if log:
            log(f"{split}: {info['bytes']:,} bytes in {len(info['shards'])} shard(s) verified")
    return checked


def open_mixture(spec: str) -> Corpus:
    """`DIR=W,DIR=W,...` (the part after `mix:`): prepared folders drawn with weights W. Their val
    splits, one after the other, are the validation data."""
    streams, vals, weights = [], [], []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        folder, sep, w = part.rpartition("=")
        try:
            weight = float(w) if sep else float("nan")
        except ValueError:
            weight = float("nan")
        if not sep or not weight > 0:
            raise DataError(f"mix: expects DIR=WEIGHT pairs with positive weights, got {part!r}")
        if not is_prepared(folder):
            raise DataError(f"mix: {folder} is not a prepared corpus; run `rltok prepare SRC --out {folder}` first")
        corpus = open_prepared(folder).corpus()
        streams.append(corpus.train)
        vals.append(corpus.val)
        weights.append(weight)
    if not streams:
        raise DataError("mix: names no prepared folders (expected mix:DIR=W,DIR=W)")
    if min(len(s) for s in streams) < 2:
        raise DataError("mix: every source needs at least 2 training bytes")
    return Corpus(Mixture(streams, weights, f"mix:{spec}"), ByteStream.concat(vals, "mix val"), f"mix:{spec}",
                  split="given", prepared=f"mix:{spec}")


# ---- writing ------------------------------------------------------------------------------------

def save_array(path: Path, array: np.ndarray) -> None:
    """`array` as the .npy file `path`, whole or not at all: written beside it, synced, renamed."""
    tmp = path.with_name(path.stem + ".tmp.npy")
    with open(tmp, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class ShardWriter:
    """Appends one split's stream as shards of exactly `shard_bytes` (the last one shorter). The
    shard being filled is a temporary file, renamed into place with its header when full, so a
    shard under its final name is complete. The caller writes at most `room()` bytes at a time and
    saves `state()` after each `commit()`: a writer made from that state continues exactly there."""

    def __init__(self, root: Path, folder: str, split: str, corpus_id: bytes, shard_bytes: int,
                 state: dict | None = None, checksums: bool = True):
        self.root, self.folder, self.split = root, folder, split
        self.corpus_id, self.shard_bytes, self.checksums = corpus_id, shard_bytes, checksums
        (root / folder).mkdir(parents=True, exist_ok=True)
        state = state or {}
        self.shards: list[dict] = [dict(s) for s in state.get("shards", [])]
        self.crc = state.get("crc32", 0)  # of the whole stream so far
        self.pos = sum(s["bytes"] for s in self.shards)
        self._file, self._hash, self._fill = None, None, 0  # the shard being filled

    def room(self) -> int:
        return self.shard_bytes - self._fill

    def _path(self, index: int) -> Path:
        return self.root / self.folder / f"{index:05d}.bin"

    def write(self, data) -> None:
        n = len(data)
        if n > self.room():
            raise ValueError("write past the end of the shard")
        if self._file is None:
            tmp = self._path(len(self.shards)).with_suffix(".bin.tmp")
            self._file = open(tmp, "wb")
            self._file.write(bytes(HEADER_BYTES))  # the header, written for real at commit
            self._hash = hashlib.sha256() if self.checksums else None
        self._file.write(data)
        if self._hash is not None:
            self._hash.update(data)
        self.crc = zlib.crc32(data, self.crc)
        self._fill += n
        self.pos += n

    def fill(self, data, on_full, wrote=None) -> None:
        """Write `data` in pieces that fit, calling `wrote(n)` after each and `on_full()` whenever a
        shard is full (it commits and saves the state)."""
        view = memoryview(data)
        while len(view):
            k = min(self.room(), len(view))
            self.write(view[:k])
            if wrote is not None:
                wrote(k)
            view = view[k:]
            if self.room() == 0:
                on_full()

    def commit(self) -> dict | None:
        """Close the shard being filled (if it holds any bytes) and move it into place."""
        if self._file is None or self._fill == 0:
            return None
        index = len(self.shards)
        self._file.seek(0)
        self._file.write(HEADER.pack(MAGIC, FORMAT_VERSION, index, self._fill, self.corpus_id,
                                     self.split.encode("ascii")))
        self._file.flush()
        os.fsync(self._file.fileno())  # the state saved after this commit names the shard: it must be on disk
        self._file.close()
        path = self._path(index)
        os.replace(path.with_suffix(".bin.tmp"), path)
        fsync_dir(path.parent)
        record = {"file": f"{self.folder}/{path.name}", "bytes": self._fill,
                  "sha256": self._hash.hexdigest() if self._hash is not None else ""}
        self.shards.append(record)
        self._file, self._hash, self._fill = None, None, 0
        return record

    def state(self) -> dict:
        return {"shards": self.shards, "crc32": self.crc}

    def stream(self) -> ByteStream:
        """The committed shards as a stream."""
        return ByteStream([_File(self.root / s["file"], HEADER_BYTES, s["bytes"]) for s in self.shards],
                          f"{self.root}:{self.split}", crc=self.crc if self._fill == 0 else None)
