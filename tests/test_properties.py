"""Property-based tests (hypothesis): the model on arbitrary byte strings and lengths (1 byte,
the attention window, the maximum length), and the data loader on arbitrary file contents."""

from __future__ import annotations

import gzip
import lzma
import tempfile
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rltok.config import VOCAB_SIZE, load_config
from rltok.data.sources import DOC_SEP, DataError, read_documents
from rltok.data.windows import WindowSampler, eval_windows
from rltok.data.corpus import load_corpus
from rltok.model import HourglassLM
from rltok.objective.loss import compute_loss

MAX_LEN = 64
WINDOW = 8
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODEL_SETTINGS = settings(SETTINGS, max_examples=20)


def tiny_model(**overrides) -> HourglassLM:
    cfg = load_config("test", overrides=[f"model.max_seq_len={MAX_LEN}", f"model.window={WINDOW}",
                                         "train.seq_len=64", *(f"model.{k}={v}" for k, v in overrides.items())])
    torch.manual_seed(0)
    return HourglassLM(cfg.model), cfg


MODELS = {
    "rl_w1": tiny_model(),
    "rl_w4": tiny_model(**{"chunker.window": 4}),
    "fixed": tiny_model(chunker="fixed", **{"chunker.stride": 3}),
}


def batch_of(data: bytes, batch: int) -> torch.Tensor:
    """`batch` different rows of the same length: the bytes, rotated."""
    x = torch.tensor(list(data), dtype=torch.long)
    return torch.stack([x.roll(i) for i in range(batch)])


@MODEL_SETTINGS
@given(data=st.binary(min_size=1, max_size=MAX_LEN), batch=st.integers(1, 3), name=st.sampled_from(sorted(MODELS)),
       mode=st.sampled_from(["sample", "greedy"]), force_last=st.booleans(), seed=st.integers(0, 2**31 - 1))
@example(data=b"\x00", batch=1, name="rl_w4", mode="sample", force_last=True, seed=0)  # one byte
@example(data=b"\xff" * WINDOW, batch=2, name="rl_w1", mode="sample", force_last=True, seed=0)  # exactly the window
@example(data=bytes(range(256))[:MAX_LEN], batch=3, name="rl_w4", mode="greedy", force_last=False, seed=1)  # max
@example(data=b" " * MAX_LEN, batch=2, name="fixed", mode="sample", force_last=True, seed=0)
def test_model_on_arbitrary_bytes(data, batch, name, mode, force_last, seed):
    model, cfg = MODELS[name]
    x = batch_of(data, batch)
    T = x.shape[1]
    gen = torch.Generator().manual_seed(seed)
    model.train()
    out = model(x, mode=mode, generator=gen, force_last=force_last)
    assert out.logits.shape == out.early_logits.shape == (batch, T, VOCAB_SIZE)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.early_logits).all()
    b = out.boundaries.b
    assert b.shape == (batch, T) and b.dtype == torch.bool
    assert b[:, 0].all()  # every byte has a chunk ending at or before it
    if force_last:
        assert b[:, -1].all()
    assert torch.equal(out.n_chunks, b.sum(1)) and (out.n_chunks >= 1).all() and (out.n_chunks <= T).all()
    assert not out.boundaries.free[:, 0].any()
    if out.boundaries.logp is not None:
        assert torch.isfinite(out.boundaries.logp).all() and (out.boundaries.logp <= 0).all()
    # the objective is finite on any input too, and so are its gradients
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # std() of a single element warns
        loss, metrics = compute_loss(out, x.roll(-1, 1), cfg.objective, cfg.model.target_rate)
    if batch * T == 1:  # the sample std of one return is undefined (a logged metric, not the loss)
        metrics.pop("return_std", None)
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values()), metrics
    model.zero_grad()
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_model_refuses_sequences_longer_than_max_seq_len():
    model, _ = MODELS["rl_w1"]
    with pytest.raises(ValueError, match="exceeds model.max_seq_len"):
        model(torch.zeros(1, MAX_LEN + 1, dtype=torch.long))


@SETTINGS
@given(data=st.binary(min_size=2, max_size=300), seq_len=st.integers(1, 80), batch=st.integers(1, 4))
@example(data=b"ab", seq_len=64, batch=1)
def test_windows_stay_inside_the_data(data, seq_len, batch):
    t = torch.tensor(list(data), dtype=torch.uint8)
    x, y = WindowSampler(t, batch, seq_len, seed=0).next()
    n = min(seq_len, len(data) - 1)
    assert x.shape == y.shape == (batch, n) and torch.equal(x[:, 1:], y[:, :-1])
    vx, vy = eval_windows(t, seq_len)
    assert torch.equal(vx[:, 1:], vy[:, :-1])
    assert bytes(vx.flatten().tolist()) == data[: vx.numel()]  # non-overlapping, in order


# ---- the data loader ---------------------------------------------------------------------------

def _encode(kind: str, content: bytes) -> bytes:
    """How a file of this kind is written: compressed, or raw bytes posing as an archive."""
    if kind == ".gz":
        return gzip.compress(content)
    if kind == ".xz":
        return lzma.compress(content)
    return content


def _expected(kind: str, raw: bytes) -> bytes | None:
    """What reading a file should yield: its (decompressed) bytes, or None if it is unreadable."""
    try:
        if kind in (".gz", ".raw.gz"):
            return gzip.decompress(raw)
        if kind in (".xz", ".raw.xz"):
            return lzma.decompress(raw)
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return None
    return raw


KINDS = ["", ".txt", ".bin", ".gz", ".xz", ".raw.gz", ".raw.xz"]
FILES = st.lists(st.tuples(st.sampled_from(KINDS), st.binary(max_size=200)), max_size=5)


@SETTINGS
@given(files=FILES)
@example(files=[])
@example(files=[("", b"")])
@example(files=[(".raw.gz", b"\x1f\x8b\x08\x00garbage")])
@example(files=[(".txt", b"\xff\xfe\x00\x80 not utf-8"), (".gz", b""), (".raw.xz", b"")])
def test_loader_on_arbitrary_files(files):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "corpus"
        root.mkdir()
        expected = []
        for i, (kind, content) in enumerate(files):
            raw = content if kind.startswith(".raw") else _encode(kind, content)
            name = f"f{i}{kind.replace('.raw', '')}"
            (root / name).write_bytes(raw)
            expected.append((name, _expected(kind, raw)))
        expected.sort()
        good = [e for _, e in expected if e]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                docs, report = read_documents(str(root))
            except DataError:
                assert not good  # an error only when nothing usable was there
            else:
                assert docs == good
                assert len(report.skipped) == sum(e is None for _, e in expected)
                assert len(report.empty) == sum(e == b"" for _, e in expected)
            try:
                corpus = load_corpus(str(root))
            except DataError:
                assert sum(map(len, good)) < 4  # nothing usable, or too small to split off a val part
            else:
                # every readable byte once, plus DOC_SEP between documents on each side of the split
                seps = len(corpus.train) + len(corpus.val) - sum(map(len, good))
                assert 0 <= seps <= 2 * (len(good) - 1)
                joined = torch.cat([corpus.train, corpus.val]).long()
                counts = torch.bincount(torch.tensor(list(b"".join(good)), dtype=torch.long), minlength=256)
                counts[DOC_SEP] += seps
                assert torch.equal(torch.bincount(joined, minlength=256), counts)
                if len(good) == 1:  # one document: train then val is the file, byte for byte
                    assert bytes(torch.cat([corpus.train, corpus.val]).tolist()) == good[0]
                assert len(corpus.val) >= 2 and len(corpus.train) >= 2


@SETTINGS
@given(content=st.binary(max_size=500))
def test_single_file_roundtrip(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.bin"
        path.write_bytes(content)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                corpus = load_corpus(str(path))
            except DataError as e:
                assert len(content) < 4, e
                return
        assert bytes(torch.cat([corpus.train, corpus.val]).tolist()) == content
