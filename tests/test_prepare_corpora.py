"""`rltok prepare` on real corpora: the prepared train/val/test splits are byte for byte the
streams training reads into memory from the same source folder.

Runs only when RLTOK_TEST_DATA names a folder of corpus folders, each holding train.*, val.* (and
test.*) files, possibly compressed (e.g. RLTOK_TEST_DATA=/path/to/data with code-py/ and docs-en/
in it); skipped otherwise. The first two corpus folders (sorted by name) are tested, each with its
train split capped at TRAIN_CAP bytes: `--max-bytes` caps only the train files, both in
`rltok prepare` (rltok.data.prepare.plan) and in load_corpus (read_documents), so the capped streams are
still the same bytes; val and test are compared whole.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from test_prepare import as_bytes

from rltok.cli import main
from rltok.data.corpus import load_corpus, load_eval_bytes
from rltok.data.sources import named_split
from rltok.data.shards import open_prepared

ENV = "RLTOK_TEST_DATA"
TRAIN_CAP = 2 << 20  # bytes of each corpus's train split read (a prefix of its train files)
MAX_CORPORA = 2
SHARD_SIZE = "256k"  # small shards, so every split runs across shard boundaries


def _corpora() -> tuple[list[Path], str]:
    """The corpus folders to test, or none and why."""
    root = os.environ.get(ENV, "")
    if not root:
        return [], f"{ENV} is not set (set it to a folder of corpus folders with train.*/val.*/test.* files)"
    base = Path(root).expanduser()
    if not base.is_dir():
        return [], f"{ENV}={root} is not a folder"
    found = sorted(p for p in base.iterdir()
                   if p.is_dir() and named_split(str(p), "train") and named_split(str(p), "val"))
    if not found:
        return [], f"{ENV}={root} holds no corpus folder with train.* and val.* files"
    return found[:MAX_CORPORA], ""


CORPORA, SKIP_REASON = _corpora()
PARAMS = [pytest.param(p, id=p.name) for p in CORPORA] or \
    [pytest.param(None, id="no-corpora", marks=pytest.mark.skip(reason=SKIP_REASON))]


def _assert_same_bytes(what: str, got: bytes, want: bytes) -> None:
    """Exact equality, reported by length, SHA-256 and the first differing offset (not a diff of MBs)."""
    if got == want:
        return
    a, b = np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8)
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    first = int(diff[0]) if len(diff) else n
    pytest.fail(f"{what}: prepared {len(got):,} bytes (sha256 {hashlib.sha256(got).hexdigest()[:16]}) != "
                f"in memory {len(want):,} bytes (sha256 {hashlib.sha256(want).hexdigest()[:16]}); "
                f"first difference at byte {first:,}")


@pytest.mark.parametrize("corpus", PARAMS)
def test_prepared_real_corpus_is_the_in_memory_corpus(corpus, tmp_path, capsys):
    src, out = str(corpus), tmp_path / "prepared"
    assert main(["prepare", src, "--out", str(out), "--max-bytes", str(TRAIN_CAP), "--shard-size", SHARD_SIZE,
                 "--verify", "-q"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rule"] == "given"

    # what training reads: the source folder into memory (never via the prepare cache), and the
    # prepared folder from its shards
    mem = load_corpus(src, max_bytes=TRAIN_CAP, prepare_above=0)
    disk = load_corpus(str(out))
    assert mem.split == disk.split == "given"
    assert 0 < len(mem.train) <= TRAIN_CAP and len(mem.val) > 0

    # every split either side has: train and val, and test where the folder has test.* files
    expected = {"train", "val"} | ({"test"} if named_split(src, "test") else set())
    assert set(open_prepared(out).splits) == expected
    for split in sorted(expected):
        if split == "test":
            want, got = load_eval_bytes(src, "test"), load_eval_bytes(str(out), "test")
        else:
            want, got = getattr(mem, split), getattr(disk, split)
        want, got = as_bytes(want), got.numpy().tobytes()
        _assert_same_bytes(f"{corpus.name} {split}", got, want)
        assert summary["splits"][split]["bytes"] == len(want)
    assert disk.fingerprint() == mem.fingerprint()  # a run resumes across the two
