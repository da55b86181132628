"""Corpus streams: DOC_SEP between documents, and a validation split of whole documents."""

import random

import pytest
import torch

from rltok.data.sources import DOC_SEP, MIN_DOCS_FOR_DOC_SPLIT, DataError, doc_key, split_cuts, to_tensor
from rltok.data.corpus import load_corpus, load_eval_bytes


def as_bytes(t: torch.Tensor) -> bytes:
    assert t.dtype == torch.uint8
    return bytes(t.tolist())


def pieces(t: torch.Tensor) -> list[bytes]:
    """The documents of a stream whose documents hold no 0xFF themselves."""
    return as_bytes(t).split(bytes([DOC_SEP]))


def write_docs(folder, n: int, seed: int = 0) -> list[bytes]:
    """n small text files of different lengths; no 0xFF in them (valid UTF-8)."""
    rng = random.Random(seed)
    folder.mkdir()
    docs = []
    for i in range(n):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "é", "λx"]) for _ in range(rng.randint(20, 120)))
        doc = f"# file {i}\n{words}\n".encode()
        (folder / f"doc{i:03d}.txt").write_bytes(doc)
        docs.append(doc)
    return docs


def test_to_tensor_puts_one_separator_between_documents():
    t = to_tensor([b"ab", b"", b"c", b"de"])
    assert t.dtype == torch.uint8 and as_bytes(t) == b"ab\xffc\xffde"  # none at the ends, none for empty docs
    assert as_bytes(to_tensor([b"only"])) == b"only" and len(to_tensor([])) == 0
    assert DOC_SEP == 0xFF
    with pytest.raises(UnicodeDecodeError):  # why 0xFF: it is never part of valid UTF-8
        bytes([DOC_SEP]).decode("utf-8")


def test_val_holds_whole_documents_shared_with_no_train_document(tmp_path):
    docs = write_docs(tmp_path / "c", 60)
    corpus = load_corpus(str(tmp_path / "c"))
    tr, va = pieces(corpus.train), pieces(corpus.val)
    assert corpus.split == "documents" and "whole held-out documents" in corpus.describe()
    # separators exactly between documents: docs - 1 in each stream
    assert int((corpus.train == DOC_SEP).sum()) + int((corpus.val == DOC_SEP).sum()) == len(docs) - 2
    assert sorted(tr + va) == sorted(docs) and set(tr).isdisjoint(va)  # every piece is one whole document
    assert tr == [d for d in docs if d in tr] and va == [d for d in docs if d in va]  # file order kept
    share = sum(map(len, va)) / sum(map(len, docs))
    assert 0.02 <= share <= 0.04  # about val_fraction, never past twice it
    # the choice follows the documents' bytes, not the file names or their order
    for i, d in enumerate(reversed(docs)):
        (tmp_path / "c" / f"doc{i:03d}.txt").write_bytes(d)
    assert set(pieces(load_corpus(str(tmp_path / "c")).val)) == set(va)


def test_twenty_documents_and_a_larger_val_fraction(tmp_path):
    docs = write_docs(tmp_path / "c", MIN_DOCS_FOR_DOC_SPLIT, seed=1)
    corpus = load_corpus(str(tmp_path / "c"), val_fraction=0.1)
    tr, va = pieces(corpus.train), pieces(corpus.val)
    assert corpus.split == "documents" and len(va) >= 1 and set(tr).isdisjoint(va)
    assert sorted(tr + va) == sorted(docs)
    assert 0.1 <= sum(map(len, va)) / sum(map(len, docs)) <= 0.2


def split_documents(docs: list[bytes], val_fraction: float) -> tuple[list[bytes], list[bytes], str]:
    """(train parts, val parts, rule): split_cuts applied to the documents, as load_corpus does."""
    cuts, rule = split_cuts([doc_key(d) for d in docs], [len(d) for d in docs], val_fraction)
    parts = [(d[:c], d[c:]) for d, c in zip(docs, cuts.tolist())]
    return [t for t, _ in parts if t], [v for _, v in parts if v], rule


def test_identical_documents_stay_on_one_side():
    docs = [b"same text\n"] * 10 + [f"doc {i}\n".encode() * 3 for i in range(30)]
    train, val, rule = split_documents(docs, 0.1)
    assert rule == "documents" and set(train).isdisjoint(val)


def test_few_documents_fall_back_to_the_tail_of_each(tmp_path):
    docs = write_docs(tmp_path / "c", 5)
    corpus = load_corpus(str(tmp_path / "c"), val_fraction=0.1)
    tr, va = pieces(corpus.train), pieces(corpus.val)
    assert corpus.split == "tails" and "tail of every document" in corpus.describe()
    assert len(tr) == len(va) == 5
    assert all(t + v == d and len(v) == int(len(d) * 0.1) for t, v, d in zip(tr, va, docs))


def test_documents_too_large_for_the_share_fall_back_to_tails():
    docs = [bytes([65 + i % 26]) * 100 for i in range(25)]  # each is 4% of the bytes
    train, val, rule = split_documents(docs, 0.01)  # twice 1% holds no document
    assert rule == "tails" and len(train) == 25 and all(len(v) == 1 for v in val)


def test_single_file_is_split_head_and_tail(tmp_path):
    path = tmp_path / "one.txt"
    data = b"hello world, " * 100
    path.write_bytes(data)
    corpus = load_corpus(str(path), val_fraction=0.1)
    assert DOC_SEP not in corpus.train.tolist() + corpus.val.tolist()
    assert as_bytes(corpus.train) + as_bytes(corpus.val) == data and len(corpus.val) == len(data) // 10
    assert torch.equal(load_eval_bytes(str(path), "val", val_fraction=0.1), corpus.val)
    assert as_bytes(load_eval_bytes(str(path), "all")) == data


@pytest.mark.parametrize("n", [3, 40])
def test_eval_bytes_are_exactly_the_val_split(tmp_path, n):
    docs = write_docs(tmp_path / "c", n, seed=n)
    spec = str(tmp_path / "c")
    corpus = load_corpus(spec)
    assert torch.equal(load_eval_bytes(spec, "val"), corpus.val)
    assert torch.equal(load_eval_bytes(spec, "val", max_bytes=3000), corpus.val[:3000])  # the split's start
    capped = load_corpus(spec, max_bytes=3000)  # a run that read at most 3000 bytes of the source
    assert torch.equal(load_eval_bytes(spec, "val", source_max_bytes=3000), capped.val)
    assert as_bytes(load_eval_bytes(spec, "all")) == bytes([DOC_SEP]).join(docs)


def test_split_folders_are_used_as_given_with_separators(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    for name in ("train.0.txt", "train.1.txt", "val.0.txt", "val.1.txt", "val.2.txt", "test.txt"):
        (d / name).write_bytes(name.encode() * 3)
    corpus = load_corpus(str(d))
    assert corpus.split == "given"
    assert pieces(corpus.train) == [b"train.0.txt" * 3, b"train.1.txt" * 3]
    assert pieces(corpus.val) == [f"val.{i}.txt".encode() * 3 for i in range(3)]
    assert torch.equal(load_eval_bytes(str(d), "val"), corpus.val)
    assert as_bytes(load_eval_bytes(str(d), "test")) == b"test.txt" * 3


def test_invalid_utf8_and_binary_documents_still_load(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    raw = [b"\xff\xfe\x00\x80 not utf-8 " * 5, b"\xc3\x28 bad continuation " * 4, bytes(range(256))]
    for i, r in enumerate(raw):
        (d / f"f{i}.bin").write_bytes(r)
    corpus = load_corpus(str(d), val_fraction=0.1)
    assert corpus.split == "tails"
    total = sum(map(len, raw))
    # documents that hold 0xFF themselves keep it; the separators are 2 per stream (3 documents)
    assert len(corpus.train) + len(corpus.val) == total + 4
    assert as_bytes(corpus.train).startswith(raw[0][: len(raw[0]) - int(len(raw[0]) * 0.1)] + b"\xff\xc3\x28")
    single = tmp_path / "bad.bin"
    single.write_bytes(raw[0])
    c1 = load_corpus(str(single))
    assert as_bytes(c1.train) + as_bytes(c1.val) == raw[0]


def test_tiny_corpus_falls_back_to_the_tail_of_the_stream(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    for i, r in enumerate([b"ab", b"cd", b"e"]):
        (d / f"f{i}").write_bytes(r)
    corpus = load_corpus(str(d))  # every document's 2% tail is empty
    assert corpus.split == "stream"
    assert as_bytes(corpus.train) == b"ab\xffc" and as_bytes(corpus.val) == b"d\xffe"
    (d / "f1").unlink()
    (d / "f2").unlink()
    (d / "f0").write_bytes(b"abc")
    with pytest.raises(DataError, match="too small"):
        load_corpus(str(d))


def test_a_runs_own_split_is_the_one_its_training_held_out(tmp_path):
    """Its own val source, its cap on the source (which moves the documents the hash rule holds
    out) and its split rule: the bytes evaluated are exactly the ones training never saw."""
    from rltok.config import DataConfig
    from rltok.data.corpus import run_split_bytes

    write_docs(tmp_path / "c", 60, seed=4)
    spec = str(tmp_path / "c")
    for cap in (0, 2500, 7000):
        cfg = DataConfig(train=spec, max_bytes=cap)
        corpus = load_corpus(spec, max_bytes=cap)
        assert torch.equal(run_split_bytes(cfg, "val"), corpus.val)
        assert torch.equal(run_split_bytes(cfg, "train"), corpus.train)
        assert torch.equal(run_split_bytes(cfg, "val", max_bytes=100), corpus.val[:100])
        trained = set(pieces(corpus.train))
        assert not trained & set(pieces(run_split_bytes(cfg, "val")))
    (tmp_path / "held.txt").write_bytes(b"held out on its own\n" * 40)
    given = DataConfig(train=spec, val=str(tmp_path / "held.txt"))
    assert as_bytes(run_split_bytes(given, "val")) == b"held out on its own\n" * 40
    assert as_bytes(run_split_bytes(given, "val", max_bytes=7)) == b"held ou"
    assert torch.equal(run_split_bytes(given, "train"), load_corpus(spec, str(tmp_path / "held.txt")).train)
    # the run's own corpus spelled another way is still the run's own: its val file, not a carve-out
    assert as_bytes(run_split_bytes(given, "val", source=spec + "/")) == b"held out on its own\n" * 40
    other = run_split_bytes(given, "val", source=str(tmp_path / "held.txt"))  # another corpus: its own rule
    assert len(other) < 40 * 20


def test_a_cap_on_the_evaluated_bytes_is_a_prefix_of_every_kind_of_split(tmp_path):
    d = tmp_path / "split"
    d.mkdir()
    (d / "train.txt").write_bytes(b"t" * 500)
    (d / "val.0.txt").write_bytes(b"a" * 300)
    (d / "val.1.txt").write_bytes(b"b" * 300)
    whole = load_eval_bytes(str(d), "val")
    for k in (1, 299, 300, 301, 450, 10_000):
        assert torch.equal(load_eval_bytes(str(d), "val", max_bytes=k), whole[:k])
    write_docs(tmp_path / "rule", 30, seed=2)
    whole = load_eval_bytes(str(tmp_path / "rule"), "val")
    assert torch.equal(load_eval_bytes(str(tmp_path / "rule"), "val", max_bytes=50), whole[:50])
