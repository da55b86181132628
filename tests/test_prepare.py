"""`rltok prepare`: the prepared splits are the bytes the in-memory loader makes of the same source
(whole held-out documents, document tails, the stream's tail, named split files, hub-style
datasets); a re-run is a no-op; a run killed with SIGKILL resumes to the same shards; training on
the shards matches training in memory step for step and resumes exactly; large sources go to a
cache folder on first use; prepared folders mix with weights."""

from __future__ import annotations

import json
import lzma
import random
import signal
import textwrap

import pytest
import torch

import rltok.data.ingest

from rltok.cli import main
from rltok.config import load_config
from rltok.data.sources import DOC_SEP, DataError
from rltok.data.windows import WindowSampler
from rltok.data.corpus import load_corpus, load_eval_bytes
from rltok.data.prepare import prepare
from rltok.data.shards import MANIFEST, WORK_DIR, open_prepared, verify_prepared
from rltok.training.trainer import TIMING_KEYS, Trainer


def write_docs(folder, n: int, seed: int = 0, lo: int = 10, hi: int = 90) -> list[bytes]:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs = []
    for i in range(n):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "é", "λx", "\t"]) for _ in range(rng.randint(lo, hi)))
        doc = f"# file {i}\n{words}\n".encode()
        (folder / f"doc{i:03d}.txt").write_bytes(doc)
        docs.append(doc)
    return docs


def as_bytes(t) -> bytes:
    return t.numpy().tobytes()


def assert_same_corpus(prepared_dir, spec, **kw):
    mem = load_corpus(str(spec), prepare_above=0, **kw)
    disk = load_corpus(str(prepared_dir))
    assert disk.split == mem.split
    assert as_bytes(disk.train) == as_bytes(mem.train) and as_bytes(disk.val) == as_bytes(mem.val)
    assert disk.fingerprint() == mem.fingerprint()  # a run can resume across the two
    return mem, disk


@pytest.mark.parametrize("n, rule", [(60, "documents"), (5, "tails")])
def test_prepared_splits_are_the_in_memory_splits(tmp_path, n, rule):
    docs = write_docs(tmp_path / "src", n, seed=n)
    out = tmp_path / "prep"
    prepare(str(tmp_path / "src"), out, shard_bytes=333, progress=False)
    mem, disk = assert_same_corpus(out, tmp_path / "src")
    assert disk.split == rule and disk.prepared == str(out)
    m = open_prepared(out).manifest
    assert m["split"]["rule"] == rule and m["split"]["val_fraction"] == 0.02 and m["source"]["train"] == str(tmp_path / "src")
    assert {s: m["splits"][s]["bytes"] for s in m["splits"]} == {"train": len(mem.train), "val": len(mem.val)}
    # the document index: every document of each stream, where it starts and how long it is
    p = open_prepared(out)
    for split, stream in (("train", disk.train), ("val", disk.val)):
        data = as_bytes(stream)
        idx = p.documents(split)
        assert [data[s:s + n] for s, n in idx.tolist()] == data.split(bytes([DOC_SEP]))
    if rule == "documents":
        pieces = as_bytes(disk.train).split(b"\xff") + as_bytes(disk.val).split(b"\xff")
        assert sorted(pieces) == sorted(docs)
    assert torch.equal(load_eval_bytes(str(out), "val")[:], mem.val)
    # a cap and an explicit val source apply on top of a prepared folder, as on any source
    capped = load_corpus(str(out), val=str(tmp_path / "src" / "doc000.txt"), max_bytes=100)
    assert capped.split == "given" and as_bytes(capped.val) == docs[0]
    assert as_bytes(capped.train) == as_bytes(mem.train)[:100]


def test_tiny_sources_capped_sources_and_binary_documents(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for i, r in enumerate([b"ab", b"cd", b"e"]):
        (tiny / f"f{i}").write_bytes(r)
    prepare(str(tiny), tmp_path / "p1", progress=False)
    mem, _ = assert_same_corpus(tmp_path / "p1", tiny)
    assert mem.split == "stream"
    # 0xFF inside documents, a cap that cuts the last file read short
    binary = tmp_path / "bin"
    binary.mkdir()
    for i in range(25):
        (binary / f"b{i:02d}").write_bytes(bytes(random.Random(i).randrange(256) for _ in range(200 + i)))
    prepare(str(binary), tmp_path / "p2", max_bytes=3000, shard_bytes=128, progress=False)
    mem, disk = assert_same_corpus(tmp_path / "p2", binary, max_bytes=3000)
    assert sum(open_prepared(tmp_path / "p2").documents("train")[:, 1]) + \
        sum(open_prepared(tmp_path / "p2").documents("val")[:, 1]) == 3000
    with pytest.raises(DataError, match="too small to train on: 1 bytes read, 1 of them in the train split"):
        prepare(str(tiny / "f2"), tmp_path / "p3", progress=False)
    assert not (tmp_path / "p3").exists()  # a refused source leaves no folder behind


def test_a_refused_source_leaves_nothing_to_resume(tmp_path):
    """An empty or too-small source is final, not an interruption: the folder made for it goes, and
    in a folder that was there the preparation's own files go (the lock stays)."""
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "small.txt").write_bytes(b"abc")
    for name, message in (("empty.txt", "holds no bytes"), ("small.txt", "too small")):
        with pytest.raises(DataError, match=message):
            prepare(str(tmp_path / name), tmp_path / "new" / name, progress=False)
        assert not (tmp_path / "new" / name).exists()
        there = tmp_path / f"there-{name}"
        there.mkdir()
        with pytest.raises(DataError, match=message):
            prepare(str(tmp_path / name), there, progress=False)
        assert [f.name for f in there.iterdir()] == [".rltok-prepare.lock"]


def test_a_folder_of_named_splits_maps_to_the_prepared_splits(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    texts = {name: b"".join(f"{name} line {i}\n".encode() for i in range(300)) for name in ("train", "val", "test")}
    for name, text in texts.items():
        (src / f"{name}.txt.xz").write_bytes(lzma.compress(text))
    (src / "train.extra.txt").write_bytes(b"second train document")
    out = tmp_path / "prep"
    assert main(["prepare", str(src), "--out", str(out), "--shard-size", "1k", "-q"]) == 0
    mem, disk = assert_same_corpus(out, src)
    assert disk.split == "given" and as_bytes(disk.val) == texts["val"]
    assert as_bytes(disk.train) == b"second train document" + b"\xff" + texts["train"]  # file name order
    assert as_bytes(load_eval_bytes(str(out), "test")) == texts["test"] == as_bytes(load_eval_bytes(str(src), "test"))
    assert as_bytes(load_eval_bytes(str(out), "test", max_bytes=10)) == texts["test"][:10]
    assert open_prepared(out).manifest["splits"]["test"]["docs"] == 1
    with pytest.raises(DataError, match="splits are kept"):
        load_eval_bytes(str(out), "all")


def test_rerunning_is_a_noop_and_a_different_source_is_refused(tmp_path, capsys):
    src = tmp_path / "src"
    write_docs(src, 30)
    out = tmp_path / "prep"
    args = ["prepare", str(src), "--out", str(out), "--shard-size", "2k", "-q"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rule"] == "documents" and summary["splits"]["train"]["shards"] >= 2
    files = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    assert main(args) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()} == files
    assert main([*args, "--val-fraction", "0.1"]) == 2
    assert "another source or settings (val_fraction)" in capsys.readouterr().err
    (src / "doc000.txt").write_bytes(b"changed")
    assert main(args) == 2
    assert "source's files changed" in capsys.readouterr().err
    # never into a foreign folder, nor inside the source
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty"):
        prepare(str(src), tmp_path / "busy", progress=False)
    with pytest.raises(DataError, match="inside the source"):
        prepare(str(src), src / "prepared", progress=False)
    # a refused folder is left as it was: no lock file in it, nothing made inside the source
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["notes.txt"] and not (src / "prepared").exists()
    # the flag's range is prepare's: (0, 0.5)
    assert main(["prepare", str(src), "--out", str(tmp_path / "half"), "--val-fraction", "0.5"]) == 2
    assert "must be in (0, 0.5), got 0.5" in capsys.readouterr().err
    with pytest.raises(DataError, match="already a prepared corpus"):
        prepare(str(out), tmp_path / "again", progress=False)
    # a manifest's temporary file, left by a process killed before its rename, is ours: not foreign
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / f".{MANIFEST}.tmp4242").write_text("{")
    prepare(str(src), killed, progress=False)
    verify_prepared(killed)


def test_hub_style_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    rng = random.Random(1)
    texts = [f"record {i}: " + " ".join(rng.choice(["ünïcode", "data", "set", "\n"]) for _ in range(rng.randint(5, 60)))
             for i in range(40)]
    ds = datasets.Dataset.from_dict({"text": texts, "id": list(range(40))})
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    with open(tmp_path / "records.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    ds.to_parquet(str(tmp_path / "records.parquet"))
    encoded = [t.encode() for t in texts]
    specs = [f"hf:{tmp_path / 'saved'}", f"hf:{tmp_path / 'saved_dict'}@train", f"hf:json:{tmp_path / 'records.jsonl'}",
             f"hf:parquet:{tmp_path / 'records.parquet'}"]
    for i, spec in enumerate(specs):
        out = tmp_path / f"prep{i}"
        prepare(spec, out, shard_bytes=500, progress=False)
        mem, disk = assert_same_corpus(out, spec)
        assert disk.split == "documents"
        assert sorted(as_bytes(disk.train).split(b"\xff") + as_bytes(disk.val).split(b"\xff")) == sorted(encoded)
    # a cap stops after the record that reaches it (as the in-memory reader does)
    prepare(specs[2], tmp_path / "capped", max_bytes=700, progress=False)
    mem, disk = assert_same_corpus(tmp_path / "capped", specs[2], max_bytes=700)
    with pytest.raises(DataError, match="no field 'body'"):
        prepare(specs[0], tmp_path / "nofield", text_field="body", progress=False)
    with pytest.raises(DataError, match="no split 'test'"):
        prepare(f"hf:{tmp_path / 'saved_dict'}@test", tmp_path / "nosplit", progress=False)


def _commits(src, shard_bytes) -> int:
    """Shards an uninterrupted preparation commits while reading (the staging stream)."""
    return -(-sum(p.stat().st_size + 1 for p in src.iterdir()) // shard_bytes)


@pytest.fixture(scope="module")
def kill_sources(tmp_path_factory):
    """Sources with one large document among small ones (read in one chunk, written across many
    shards: a kill lands inside it), each with its uninterrupted preparation."""
    root = tmp_path_factory.mktemp("kill")
    src = root / "src"
    write_docs(src, 40, seed=3)
    big = b"".join(b"big line %d of the first document\n" % i for i in range(3000))
    (src / "a_big.txt").write_bytes(big)
    with open(root / "records.jsonl", "w") as f:  # the large record after 20 small ones
        for i in range(41):
            f.write(json.dumps({"text": big.decode() if i == 20 else f"record {i} " * (i + 3)}) + "\n")
    specs = {"files": str(src), "hub": f"hf:json:{root / 'records.jsonl'}"}
    return root, specs


@pytest.mark.parametrize("kind, phase", [("files", "read"), ("files", "split"), ("hub", "read")])
def test_a_killed_preparation_resumes_to_the_same_shards(kill_sources, tmp_path, kind, phase, capsys, forks):
    root, specs = kill_sources
    if kind == "hub":
        pytest.importorskip("datasets")
    spec = specs[kind]
    reference = root / f"reference_{kind}"
    if not reference.exists():
        prepare(spec, reference, shard_bytes=8192, progress=False)
    kill_at = 3 if phase == "read" else _commits(root / "src", 8192) + 2
    out = tmp_path / "prep"
    script = textwrap.dedent(f"""
        import os, signal
        from rltok.data.prepare import prepare
        from rltok.data.shards import ShardWriter
        n = 0
        commit = ShardWriter.commit
        def killing_commit(self):
            global n
            record = commit(self)
            n += record is not None
            if n == {kill_at}:  # the shard is in place, the progress not yet saved: the worst moment
                os.kill(os.getpid(), signal.SIGKILL)
            return record
        ShardWriter.commit = killing_commit
        try:
            prepare({spec!r}, {str(out)!r}, shard_bytes=8192, progress=False)
        except BaseException:
            import traceback
            open({str(tmp_path / "child_error.txt")!r}, "w").write(traceback.format_exc())
            raise
    """)
    # a process of its own, forked from one that imported rltok (a fresh interpreter costs seconds)
    proc = forks.Process(target=exec, args=(script, {}))
    proc.start()
    proc.join(120)
    code = proc.exitcode  # None: still running after 120 s
    if code is None:
        proc.kill()
        proc.join()
    error = tmp_path / "child_error.txt"
    assert code == -signal.SIGKILL, error.read_text()[-2000:] if error.exists() else code
    assert (out / WORK_DIR).is_dir() and not (out / MANIFEST).exists()
    if kind == "hub":  # a streamed dataset resumes from its own iteration state, not by counting records
        assert json.loads((out / WORK_DIR / "state.json").read_text())["parts"]["all"]["position"]
    with pytest.raises(DataError, match="did not finish"):
        load_corpus(str(out))
    assert main(["prepare", spec, "--out", str(out), "--shard-size", "8192", "-q"]) == 0
    assert "resuming the preparation" in capsys.readouterr().err
    ref, got = open_prepared(reference).manifest, open_prepared(out).manifest
    for split in ("train", "val"):
        for key in ("bytes", "docs", "crc32"):
            assert got["splits"][split][key] == ref["splits"][split][key], (split, key)
        assert [s["sha256"] for s in got["splits"][split]["shards"]] == [s["sha256"] for s in ref["splits"][split]["shards"]]
        assert got["splits"][split]["index"]["sha256"] == ref["splits"][split]["index"]["sha256"]
    verify_prepared(out)
    assert not (out / WORK_DIR).exists() and not list(out.rglob("*.tmp*"))
    assert_same_corpus(out, spec)


def _train_cfg(out, data, *extra):
    return load_config("test", overrides=[f"data.train={data}", f"train.out_dir={out}", "train.device=cpu",
                                          "train.threads=1", "train.log_every=1", "train.eval_every=2",
                                          "train.checkpoint_every=2", "model.dropout=0.1", *extra])


def _trajectory(history):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in history]


def test_training_on_shards_matches_training_in_memory_and_resumes_exactly(tmp_path):
    src = tmp_path / "src"
    write_docs(src, 60, seed=7, lo=40, hi=200)
    prepare(str(src), tmp_path / "prep", shard_bytes=700, progress=False)  # windows cross shards
    steps = "train.max_steps=4"
    mem = Trainer(_train_cfg(tmp_path / "mem", src, steps, "data.prepare_above=0"), quiet=True)
    a = mem.fit()  # each run seeds the global RNG when it is made: one after the other
    disk = Trainer(_train_cfg(tmp_path / "disk", tmp_path / "prep", steps), quiet=True)
    b = disk.fit()
    assert mem.data_id == disk.data_id and disk.corpus.prepared and not mem.corpus.prepared
    assert _trajectory(a.history) == _trajectory(b.history)
    # stopped at step 2 and resumed: the same trajectory as the uninterrupted run
    Trainer(_train_cfg(tmp_path / "resumed", tmp_path / "prep", steps), quiet=True).fit(stop_at=2)
    resumed = Trainer(_train_cfg(tmp_path / "resumed", tmp_path / "prep", steps), resume=True, quiet=True)
    assert resumed.step == 2
    assert _trajectory(resumed.fit().history) == _trajectory(b.history)


def test_large_sources_are_prepared_into_the_cache_on_first_use(tmp_path, capsys):
    src = tmp_path / "src"
    write_docs(src, 30)
    cache = tmp_path / "cache"
    corpus = load_corpus(str(src), prepare_above=2000, cache_dir=str(cache))
    err = capsys.readouterr().err
    assert "is large; preparing it once into byte shards" in err and str(cache) in err
    assert corpus.prepared.startswith(str(cache)) and corpus.source == str(src)
    assert f"(byte shards in {cache}" in corpus.describe()
    again = load_corpus(str(src), prepare_above=2000, cache_dir=str(cache))
    assert "reading" in capsys.readouterr().err and again.prepared == corpus.prepared
    mem = load_corpus(str(src), prepare_above=0)
    assert as_bytes(again.train) == as_bytes(mem.train) and as_bytes(again.val) == as_bytes(mem.val)
    val = load_eval_bytes(str(src), "val", prepare_above=2000, cache_dir=str(cache))
    assert as_bytes(val) == as_bytes(mem.val) and len(list((cache / "prepared").iterdir())) == 1
    # below the threshold, or the default corpus: read into memory as always
    small = load_corpus(str(src), prepare_above=10 ** 9, cache_dir=str(cache))
    assert isinstance(small.train, torch.Tensor) and not small.prepared


def test_prepared_folders_mix_with_weights(tmp_path):
    for name, letter in (("a", b"a"), ("b", b"b")):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(25):
            (folder / f"{i:02d}").write_bytes(letter * (50 + i))
        prepare(str(folder), tmp_path / f"p{name}", shard_bytes=256, progress=False)
    corpus = load_corpus(f"mix:{tmp_path / 'pa'}=3,{tmp_path / 'pb'}=1")
    sampler = WindowSampler(corpus.train, 50, 20, seed=0)
    rows = torch.cat([sampler.next()[0] for _ in range(40)])
    from_a = (rows == ord("a")) | (rows == DOC_SEP)
    from_b = (rows == ord("b")) | (rows == DOC_SEP)
    assert bool((from_a.all(1) | from_b.all(1)).all())  # no window runs from one source into the other
    share = from_a.all(1).float().mean().item()
    assert 0.7 < share < 0.8, share  # weight 3:1
    state = sampler.state_dict()
    nxt = sampler.next()
    sampler.load_state_dict(state)
    assert torch.equal(sampler.next()[0], nxt[0])
    assert set(as_bytes(corpus.val)) <= {ord("a"), ord("b"), DOC_SEP} and len(corpus.val) > 2
    for bad in ("mix:", f"mix:{tmp_path / 'pa'}", f"mix:{tmp_path / 'pa'}=0", f"mix:{tmp_path / 'a'}=1"):
        with pytest.raises(DataError):
            load_corpus(bad)


def test_parallel_reading_gives_the_same_shards(tmp_path):
    src = tmp_path / "src"
    write_docs(src, 30, seed=9)
    (src / "doc005.txt").write_bytes(lzma.compress((src / "doc005.txt").read_bytes()))
    prepare(str(src), tmp_path / "one", shard_bytes=1000, progress=False)
    prepare(str(src), tmp_path / "two", shard_bytes=1000, num_proc=2, progress=False)
    a, b = (open_prepared(tmp_path / n).manifest["splits"] for n in ("one", "two"))
    assert {k: [s["sha256"] for s in v["shards"]] for k, v in a.items()} == \
        {k: [s["sha256"] for s in v["shards"]] for k, v in b.items()}


def test_unreadable_files_are_left_out_as_in_memory(tmp_path, monkeypatch):
    src = tmp_path / "src"
    write_docs(src, 25)
    (src / "broken.xz").write_bytes(b"not xz at all")
    (src / "empty.txt").write_bytes(b"")
    with pytest.warns(UserWarning, match="1 unreadable.*1 empty"):
        prepare(str(src), tmp_path / "prep", progress=False)
    with pytest.warns(UserWarning):
        assert_same_corpus(tmp_path / "prep", src)
    assert load_corpus(str(tmp_path / "prep")).skipped_files == 2
    # a file that breaks after part of it is in the shards cannot be left out: an error
    monkeypatch.setattr(rltok.data.ingest, "READ_BLOCK", 1000)
    (src / "broken.xz").write_bytes(lzma.compress(bytes(range(256)) * 40)[:-30])
    with pytest.raises(DataError, match="broken.xz after .* bytes were written"):
        prepare(str(src), tmp_path / "prep2", progress=False)
