"""Prepared shards read without loading them: byte streams give exactly the bytes (and the training
and evaluation windows) of the in-memory corpus, across shard boundaries; a damaged folder (a
truncated or missing shard, a shard of another preparation or format version, a manifest that
does not match, an unfinished preparation) is refused with a clear error, nothing read from it."""

from __future__ import annotations

import json
import random
import shutil
import struct

import numpy as np
import pytest
import torch

from rltok.cli import main
from rltok.data.sources import DOC_SEP, DataError
from rltok.data.windows import WindowSampler, eval_windows, rank_eval_windows
from rltok.data.corpus import load_corpus
from rltok.data.prepare import prepare
from rltok.data.shards import HEADER_BYTES, MANIFEST, WORK_DIR, ByteStream, is_prepared, open_prepared, verify_prepared


def write_docs(folder, n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    docs = []
    for i in range(n):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "é", "λx", "\t"]) for _ in range(rng.randint(10, 90)))
        doc = f"# file {i}\n{words}\n".encode()
        (folder / f"doc{i:03d}.txt").write_bytes(doc)
        docs.append(doc)
    return docs


@pytest.fixture()
def prepared(tmp_path):
    """A 40-document source prepared into shards of 300 bytes (so windows cross shards)."""
    src = tmp_path / "src"
    write_docs(src, 40)
    out = tmp_path / "prep"
    prepare(str(src), out, shard_bytes=300, progress=False)
    return src, out


def test_streams_read_the_bytes_of_the_in_memory_corpus_across_shards(prepared):
    src, out = prepared
    mem = load_corpus(str(src), prepare_above=0)
    stream = open_prepared(out).stream("train")
    data = mem.train.numpy().tobytes()
    assert isinstance(stream, ByteStream) and len(stream) == len(data) and len(stream.pieces) > 5
    assert stream.numpy().tobytes() == data
    rng = random.Random(0)
    for _ in range(200):
        a = rng.randrange(len(data))
        b = rng.randrange(a, len(data) + 1)
        assert stream[a:b].numpy().tobytes() == data[a:b]
    starts = np.array([0, 299, 300, 599, len(data) - 50])
    assert stream.gather(starts, 50).tobytes() == b"".join(data[s:s + 50] for s in starts.tolist())
    assert stream[-1] == data[-1] and stream.crc32() == mem.fingerprint()["crc32"]
    assert stream.prefix(1000).numpy().tobytes() == data[:1000]
    both = ByteStream.concat([stream.prefix(10), stream.prefix(5)])
    assert both.numpy().tobytes() == data[:10] + bytes([DOC_SEP]) + data[:5]


@pytest.mark.parametrize("world", [1, 2])
def test_samplers_draw_the_same_windows_from_shards_as_from_memory(prepared, world):
    src, out = prepared
    mem, disk = load_corpus(str(src), prepare_above=0), load_corpus(str(out))
    for rank in range(world):
        a = WindowSampler(mem.train, 3, 100, seed=5, rank=rank, world_size=world)
        b = WindowSampler(disk.train, 3, 100, seed=5, rank=rank, world_size=world)
        for _ in range(5):
            (xa, ya), (xb, yb) = a.next(), b.next()
            assert torch.equal(xa, xb) and torch.equal(ya, yb) and xb.dtype == torch.long
        state = b.state_dict()  # the generator state is the data position: a resume continues exactly
        after = b.next()
        b.load_state_dict(state)
        assert all(torch.equal(p, q) for p, q in zip(after, b.next()))
    for n in (0, 7):
        assert all(torch.equal(p, q) for p, q in zip(eval_windows(mem.val, 64, n), eval_windows(disk.val, 64, n)))
    # each rank reads its own block of the evaluation windows; together they are the whole set
    x, _ = eval_windows(disk.val, 16, 8)
    parts = [rank_eval_windows(disk.val, 16, 8, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and not parts[0][2]
    assert rank_eval_windows(disk.val, 16, 1, 1, 2)[2]  # fewer windows than ranks: shared


def _manifest(out):
    return json.loads((out / MANIFEST).read_text())


def _write_manifest(out, m):
    (out / MANIFEST).write_text(json.dumps(m))


def test_truncated_and_missing_shards_are_refused(prepared, tmp_path):
    _, out = prepared
    first = out / _manifest(out)["splits"]["train"]["shards"][0]["file"]
    raw = first.read_bytes()
    first.write_bytes(raw[:-7])
    with pytest.raises(DataError, match="truncated"):
        open_prepared(out)
    with pytest.raises(DataError, match="truncated"):
        load_corpus(str(out))
    first.write_bytes(raw[:20])
    with pytest.raises(DataError, match="not even its 64-byte header"):
        open_prepared(out)
    first.unlink()
    with pytest.raises(DataError, match="missing"):
        open_prepared(out)
    first.write_bytes(raw + b"x")
    with pytest.raises(DataError, match="longer"):
        open_prepared(out)
    first.write_bytes(raw)
    open_prepared(out)


def test_shards_of_another_preparation_or_version_are_refused(prepared, tmp_path):
    src, out = prepared
    other = tmp_path / "other"
    prepare(str(src), other, shard_bytes=300, progress=False)  # same bytes, another preparation
    first = _manifest(out)["splits"]["train"]["shards"][0]["file"]
    mine = (out / first).read_bytes()
    shutil.copy(other / first, out / first)
    with pytest.raises(DataError, match="another prepared corpus"):
        open_prepared(out)
    # a shard written by another format version
    header = bytearray(mine[:HEADER_BYTES])
    struct.pack_into("<I", header, 8, 99)
    (out / first).write_bytes(bytes(header) + mine[HEADER_BYTES:])
    with pytest.raises(DataError, match="another version of rltok"):
        open_prepared(out)
    (out / first).write_bytes(b"NOTSHARD" + mine[8:])
    with pytest.raises(DataError, match="not an rltok shard"):
        open_prepared(out)
    (out / first).write_bytes(mine)
    m = _manifest(out)
    _write_manifest(out, {**m, "version": 2})
    with pytest.raises(DataError, match="another version of rltok"):
        open_prepared(out)


def test_a_manifest_that_does_not_match_is_refused(prepared):
    _, out = prepared
    good = _manifest(out)
    bad = json.loads(json.dumps(good))
    bad["splits"]["train"]["bytes"] += 1
    _write_manifest(out, bad)
    with pytest.raises(DataError, match="do not add up"):
        open_prepared(out)
    bad = json.loads(json.dumps(good))
    bad["splits"]["train"]["shards"][0]["bytes"] -= 1
    bad["splits"]["train"]["bytes"] -= 1
    _write_manifest(out, bad)
    with pytest.raises(DataError):
        open_prepared(out)
    bad = json.loads(json.dumps(good))
    bad["splits"]["train"]["shards"][0], bad["splits"]["train"]["shards"][1] = \
        bad["splits"]["train"]["shards"][1], bad["splits"]["train"]["shards"][0]
    _write_manifest(out, bad)
    with pytest.raises(DataError, match="manifest lists it as train shard 0"):
        open_prepared(out)
    bad = json.loads(json.dumps(good))
    del bad["splits"]["val"]["index"]
    _write_manifest(out, bad)
    with pytest.raises(DataError, match="incomplete or malformed"):
        open_prepared(out)
    (out / MANIFEST).write_text("{not json")
    with pytest.raises(DataError, match="cannot read"):
        open_prepared(out)
    _write_manifest(out, {"hello": 1})
    with pytest.raises(DataError, match="does not describe an rltok prepared corpus"):
        open_prepared(out)
    _write_manifest(out, good)
    (out / good["splits"]["val"]["index"]["file"]).write_bytes(b"")
    with pytest.raises(DataError, match="document index"):
        open_prepared(out)


def test_verify_reads_every_byte_and_finds_damage(prepared, capsys):
    _, out = prepared
    assert verify_prepared(out)["bytes"] == sum(s["bytes"] for s in _manifest(out)["splits"].values())
    assert main(["prepare", "--verify", str(out)]) == 0
    shard = out / _manifest(out)["splits"]["val"]["shards"][-1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[HEADER_BYTES + 3] ^= 1  # same size, one bit flipped: only the checksum can tell
    shard.write_bytes(bytes(raw))
    open_prepared(out)
    with pytest.raises(DataError, match="does not match its checksum"):
        verify_prepared(out)
    capsys.readouterr()
    assert main(["prepare", "--verify", str(out)]) == 2
    assert "error:" in capsys.readouterr().err


def test_an_unfinished_preparation_is_not_read(tmp_path, capsys):
    out = tmp_path / "half"
    (out / WORK_DIR).mkdir(parents=True)
    assert is_prepared(str(out))
    with pytest.raises(DataError, match="did not finish.*resume"):
        load_corpus(str(out))
    assert main(["train", "--data", str(out), "--out", str(tmp_path / "run"), "--steps", "1"]) == 2
    assert "did not finish" in capsys.readouterr().err
    assert not is_prepared(str(tmp_path)) and not is_prepared("stdlib") and not is_prepared("hf:x/y")
