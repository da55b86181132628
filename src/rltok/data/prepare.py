"""`rltok prepare SRC --out DIR`: a source written once as byte shards holding exactly the streams
load_corpus builds in memory; ingest, then split, each resumable (docs/DATA.md)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rltok.data.sources import (DOC_SEP, HUB_FILE_BUILDERS, DataError, ReadReport, corpus_cuts, expand_paths,
                                named_split)
from rltok.config.files import read_json, sha256_file, write_atomic
from rltok.data.shards import (FORMAT, FORMAT_VERSION, HEADER_BYTES, MANIFEST, SPLITS, WORK_DIR, ShardWriter,
                               is_prepared, open_prepared, read_manifest, save_array)
from rltok.data.ingest import Ingest, _log, copy_pieces, open_source
from rltok.version import __version__

DEFAULT_SHARD_BYTES = 256 << 20
STATE = "state.json"
STATE_VERSION = 1
LOCK = ".rltok-prepare.lock"
RULES = {
    "documents": "whole documents held out, chosen by a hash of their bytes until val_fraction of the bytes "
                 "(never past twice that): train and val share no document",
    "tails": "the last val_fraction of every document held out (fewer than 20 documents, or none small enough)",
    "stream": "the tail of the whole stream held out (a tiny corpus)",
    "given": "the source's own splits (train.*/val.*/test.* files, or an explicit val source)",
}


def _canonical(spec: str) -> str:
    if not spec or spec == "stdlib" or spec.startswith(("hf:", "mix:")):
        return spec
    return str(Path(spec).expanduser().resolve())


def _local_files(spec: str) -> list[Path]:
    """The local files a source reads (for its fingerprint); none for a remote dataset."""
    if spec.startswith("hf:"):
        name, _, rest = spec[3:].rsplit("@", 1)[0].partition(":")
        target = rest if name in HUB_FILE_BUILDERS else name
        try:
            return expand_paths(os.path.expanduser(target))
        except DataError:
            return []
    return expand_paths(spec)


def fingerprint(specs: list[str]) -> str:
    """Names, sizes and modification times of every local file of the sources."""
    h = hashlib.sha256()
    for spec in specs:
        h.update(f"{_canonical(spec)}\n".encode())
        for path in _local_files(spec):
            try:
                st = path.stat()
            except OSError:  # gone since it was listed: reading will leave it out too
                continue
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def plan(source: str, val: str = "", max_bytes: int = 0) -> tuple[list[tuple[str, str, int]], bool]:
    """([(part, spec, byte cap)], given): what to read into which stream, as load_corpus reads it.
    given=False: one staging part ("all") that the split rule divides."""
    named = named_split(source, "train")
    if named and not val:
        val = named_split(source, "val") or ""
    if not val:
        return [("all", source, max_bytes)], False
    parts = [("train", named or source, max_bytes), ("val", val, 0)]
    test = named_split(source, "test")
    if test:
        parts.append(("test", test, 0))
    return parts, True


def recipe(source: str, val: str = "", val_fraction: float = 0.02, max_bytes: int = 0, text_field: str = "text",
           shard_bytes: int = DEFAULT_SHARD_BYTES) -> dict:
    """What a prepared folder was made from and how: a re-run with the same recipe is a no-op."""
    parts, given = plan(source, val, max_bytes)
    return {"source": _canonical(source), "val": _canonical(val), "max_bytes": max_bytes,
            "val_fraction": None if given else val_fraction, "text_field": text_field, "shard_bytes": shard_bytes,
            "fingerprint": fingerprint([spec for _, spec, _ in parts])}


@contextmanager
def _locked(out: Path, log):
    """One preparation of a folder at a time (data-parallel ranks preparing the same cache
    folder: the first prepares, the others wait and find it done)."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: nothing to serialise against
        yield
        return
    with open(out / LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log(f"waiting for another rltok prepare of {out} to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _check_out(out: Path, source: str) -> None:
    """Write only into an empty folder or one of our own, and never inside the source."""
    if not source.startswith("hf:") and source != "stdlib":
        src = Path(source).expanduser().resolve()
        if src.is_dir() and out.resolve().is_relative_to(src):
            raise DataError(f"--out {out} is inside the source folder {source}; choose a folder outside it")
    ours = {MANIFEST, WORK_DIR, LOCK, *SPLITS}
    # a manifest's temporary file left by a process killed before its rename is ours too
    foreign = [p.name for p in (out.iterdir() if out.is_dir() else ())
               if p.name not in ours and not p.name.startswith(f".{MANIFEST}.tmp")]
    if foreign:
        raise DataError(f"{out} is not empty and holds no rltok prepared corpus (e.g. {foreign[0]}); "
                        "choose a new or empty folder for --out")


def _differs(out: Path, old: dict, new: dict) -> str:
    changed = [k for k in new if old.get(k) != new[k]]
    what = ("the source's files changed since" if changed == ["fingerprint"]
            else f"another source or settings ({', '.join(changed)}) than")
    return (f"{out} holds a corpus prepared from {what} this command; choose another --out, or delete "
            f"{out} to prepare it again")


def _bar(desc: str, progress: bool, **kw):
    return tqdm(desc=desc, disable=not progress, file=sys.stderr, dynamic_ncols=True, leave=False, **kw)


def prepare(source: str, out: str | Path, *, val: str = "", val_fraction: float = 0.02, max_bytes: int = 0,
            text_field: str = "text", shard_bytes: int = DEFAULT_SHARD_BYTES, num_proc: int = 1,
            progress: bool = True, log=_log) -> Path:
    """Write `source` (and `val`, or a folder's named splits) to `out` as byte shards with a
    manifest. Re-running it on a finished folder is a no-op; on an interrupted one it resumes.
    Returns `out`."""
    if shard_bytes < 1:
        raise DataError("the shard size must be at least 1 byte")
    if not 0 < val_fraction < 0.5:
        raise DataError("val_fraction must be in (0, 0.5)")
    if is_prepared(source):
        raise DataError(f"{source} is already a prepared corpus: train on it directly")
    out = Path(out).expanduser()
    parts, given = plan(source, val, max_bytes)
    want = recipe(source, val, val_fraction, max_bytes, text_field, shard_bytes)
    if not (out / MANIFEST).is_file():
        _check_out(out, source)  # a folder refused is left as it was: nothing made in it, no lock
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create {out}: {e.strerror}") from None
    try:
        return _prepare_locked(source, out, parts, given, want, val, val_fraction, text_field, shard_bytes,
                               num_proc, progress, log)
    except DataError:
        if created:  # a folder this call made, left empty (a refused source's work is removed): removed
            (out / LOCK).unlink(missing_ok=True)
            try:
                out.rmdir()
            except OSError:  # not empty: another preparation's, or an output error's, to resume
                pass
        raise


def _prepare_locked(source, out, parts, given, want, val, val_fraction, text_field, shard_bytes, num_proc,
                    progress, log) -> Path:
    with _locked(out, log):
        if (out / MANIFEST).is_file():
            manifest = read_manifest(out)
            if manifest.get("recipe") != want:
                raise DataError(_differs(out, manifest.get("recipe", {}), want))
            open_prepared(out)  # still intact?
            shutil.rmtree(out / WORK_DIR, ignore_errors=True)  # left by a run stopped after its manifest
            log(f"{out}: already prepared from {source} with these settings, nothing to do")
            return out
        _check_out(out, source)
        try:
            return _run(source, out, parts, given, want, val, val_fraction, text_field, shard_bytes, num_proc,
                        progress, log)
        except OSError as e:  # reading errors are handled per file: this is the output (a full disk...)
            raise DataError(f"cannot write the prepared corpus in {out}: {e}; run the same command again to "
                            "resume once that is fixed") from None


def _run(source, out, parts, given, want, val, val_fraction, text_field, shard_bytes, num_proc, progress, log) -> Path:
    work = out / WORK_DIR
    try:  # a damaged state (bounded read) starts the preparation over
        state = read_json(work / STATE, "preparation state", limit=256 << 20)
    except (OSError, ValueError):
        state = None
    if isinstance(state, dict) and state.get("version") == STATE_VERSION and state.get("recipe") == want:
        done = sum(len(p["writer"]["shards"]) for phase in ("parts", "split") for p in state[phase].values())
        log(f"resuming the preparation of {source} in {out} ({done} shard(s) already written)")
    else:
        if work.exists():
            log(f"{out}: discarding an unfinished preparation of another source or settings")
            shutil.rmtree(work)
        state = {"version": STATE_VERSION, "recipe": want, "id": os.urandom(16).hex(), "parts": {}, "split": {}}
    work.mkdir(exist_ok=True)

    def save() -> None:
        write_atomic(work / STATE, json.dumps(state))

    save()
    corpus_id = bytes.fromhex(state["id"])
    started = time.perf_counter()
    ingested = {}
    for name, spec, limit in parts:
        folder = name if given else f"{WORK_DIR}/{name}"
        part = state["parts"].get(name, {})
        writer = ShardWriter(out, folder, name, corpus_id, shard_bytes, part.get("writer"), checksums=given)
        ingest = Ingest(None, writer, part, limit, keyed=not given,
                        docs_path=lambda k, name=name: work / f"{name}.docs.{k:05d}.npy",
                        save=lambda st, name=name: (state["parts"].__setitem__(name, st), save()))
        if not part.get("done"):
            ingest.source = open_source(spec, text_field, num_proc)
            with _bar(f"read {name}", progress, total=ingest.source.total(), initial=ingest.item,
                      unit=ingest.source.unit) as bar:
                ingest.run(bar)
        try:
            _report_read(spec, ingest)
        except DataError:  # the source holds nothing: no work worth resuming
            shutil.rmtree(work, ignore_errors=True)
            raise
        docs = [np.load(work / f"{name}.docs.{k:05d}.npy") for k in range(ingest.commits)]
        ingested[name] = (writer, np.concatenate(docs) if docs else np.zeros((0, 3), dtype=np.int64), ingest)

    if given:
        outputs = {name: (w, d[:, 0], d[:, 1]) for name, (w, d, _) in ingested.items()}
        rule = "given"
    else:
        outputs, rule = _split(out, work, state, save, ingested["all"], val_fraction, corpus_id, shard_bytes, progress)
    if outputs["train"][0].pos < 2:  # the shards written are of no use: removed with the work
        for writer, _, _ in outputs.values():
            shutil.rmtree(out / writer.folder, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        raise DataError(f"data source {source!r} is too small to train on: "
                        f"{sum(w.pos for w, _, _ in outputs.values())} bytes read, {outputs['train'][0].pos} of them "
                        "in the train split (2 needed)")
    manifest = _finish(out, source, val, want, state["id"], shard_bytes, rule, val_fraction, outputs,
                       [i for _, _, i in ingested.values()])
    shutil.rmtree(work, ignore_errors=True)
    secs = time.perf_counter() - started
    total = sum(s["bytes"] for s in manifest["splits"].values())
    log(f"prepared {source} into {out}: " + ", ".join(
        f"{k} {s['bytes']:,} bytes / {s['docs']:,} docs / {len(s['shards'])} shard(s)"
        for k, s in manifest["splits"].items()) + f" ({rule} split; {total / 1e6 / max(secs, 1e-9):,.1f} MB/s)")
    return out


def _report_read(spec: str, ingest: Ingest) -> None:
    """As rltok.data.corpus.read_documents: nothing read is an error, left-out files a warning."""
    ReadReport(ingest.read, ingest.doc_bytes, ingest.skipped, ingest.empty).check(spec, "item(s)", stacklevel=4)


def _split(out, work, state, save, staged, val_fraction, corpus_id, shard_bytes, progress):
    """Phase 2: the staging stream into train and val by the rule of rltok.data.corpus.corpus_cuts."""
    writer, docs, _ = staged
    staging = writer.stream()
    starts, lengths, keys = docs[:, 0], docs[:, 1], docs[:, 2].view(np.uint64)
    cuts, rule = corpus_cuts(keys, lengths, val_fraction)
    pieces = {"train": (starts, cuts), "val": (starts + cuts, lengths - cuts)}
    outputs = {}
    with _bar("split", progress, total=int(lengths.sum()), unit="B", unit_scale=True) as bar:
        for name, (s, n) in pieces.items():
            keep = n > 0
            s, n = s[keep], n[keep]
            st = state["split"].get(name, {})
            w = ShardWriter(out, name, name, corpus_id, shard_bytes, st.get("writer"))

            def save_split(done: bool, name=name, w=w) -> None:
                state["split"][name] = {"done": done, "writer": w.state()}
                save()

            if not st.get("done"):
                copy_pieces(staging, s, n, w, save_split, bar)
            else:
                bar.update(w.pos)
            outputs[name] = (w, np.cumsum(n + 1) - (n + 1), n)
    return outputs, rule


def _finish(out, source, val, want, corpus_id, shard_bytes, rule, val_fraction, outputs, ingests) -> dict:
    splits = {}
    for name, (writer, starts, lengths) in outputs.items():
        index = out / name / "docs.npy"
        save_array(index, np.stack([np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)], axis=1))
        splits[name] = {"bytes": writer.pos, "docs": len(lengths), "crc32": writer.crc, "shards": writer.shards,
                        "index": {"file": f"{name}/docs.npy", "bytes": index.stat().st_size,
                                  "sha256": sha256_file(index)}}
        # shards of an abandoned earlier attempt beyond this split's end
        listed = {Path(s["file"]).name for s in writer.shards} | {"docs.npy"}
        for stray in (out / name).iterdir():
            if stray.name not in listed:
                stray.unlink()
    skipped = [s for i in ingests for s in i.skipped]
    empty = [e for i in ingests for e in i.empty]
    manifest = {
        "format": FORMAT, "version": FORMAT_VERSION, "id": corpus_id, "created_by": f"rltok {__version__}",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "doc_sep": DOC_SEP,
        "header_bytes": HEADER_BYTES, "shard_bytes": shard_bytes,
        "source": {"train": source, "val": val},
        "split": {"rule": rule, "val_fraction": None if rule == "given" else val_fraction, "description": RULES[rule]},
        "read": {"items": sum(i.read for i in ingests), "left_out": len(skipped) + len(empty),
                 "skipped": [list(s) for s in skipped[:100]], "empty": empty[:100]},
        "recipe": want,
        "splits": splits,
    }
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


# ---- on first use: a cache folder ---------------------------------------------------------------

def cache_root(cache_dir: str = "") -> Path:
    return Path(cache_dir or os.environ.get("RLTOK_CACHE") or "~/.cache/rltok").expanduser() / "prepared"


def is_large(spec: str, val: str, max_bytes: int, prepare_above: int) -> bool:
    """Whether load_corpus should prepare `spec` into the cache rather than read it into memory:
    more than `prepare_above` bytes on disk (a hub dataset: unless data.max_bytes caps it below)."""
    if prepare_above <= 0 or not spec or spec == "stdlib" or (max_bytes and max_bytes < prepare_above):
        return False
    if spec.startswith("hf:"):
        return True
    try:
        paths = expand_paths(spec) + (expand_paths(val) if val and not val.startswith("hf:") else [])
        return sum(p.stat().st_size for p in paths) >= prepare_above
    except (DataError, OSError):  # the in-memory loader reports it as it always has
        return False


def prepare_cached(spec: str, *, val: str = "", val_fraction: float = 0.02, max_bytes: int = 0,
                   text_field: str = "text", cache_dir: str = "") -> Path:
    """The cache folder holding `spec` prepared with these settings; prepared now if it is not
    there yet (with a message), reused as it is otherwise."""
    want = recipe(spec, val, val_fraction, max_bytes, text_field)
    key = hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(spec.rstrip("/")).name or "source")[:40]
    folder = cache_root(cache_dir) / f"{slug}-{key}"
    main_rank = os.environ.get("RANK", "0") == "0"
    say = _log if main_rank else (lambda msg: None)
    if (folder / MANIFEST).is_file():
        say(f"rltok: reading {spec} from its byte shards in {folder}")
        return prepare(spec, folder, val=val, val_fraction=val_fraction, max_bytes=max_bytes, text_field=text_field,
                       progress=False, log=lambda msg: None)  # checks the folder, prepares nothing
    say(f"rltok: {spec} is large; preparing it once into byte shards in {folder} (later runs read "
        "them directly; `rltok prepare SRC --out DIR` does this explicitly; delete the folder to free the space)")
    folder.mkdir(parents=True, exist_ok=True)
    return prepare(spec, folder, val=val, val_fraction=val_fraction, max_bytes=max_bytes, text_field=text_field,
                   progress=main_rank and sys.stderr.isatty(), log=say)


def summary(out: str | Path) -> dict:
    """What `rltok prepare` prints: the folder, its split rule and each split's size."""
    m = open_prepared(out).manifest
    return {"out": str(out), "source": m["source"]["train"], "rule": m["split"]["rule"],
            "splits": {k: {"bytes": s["bytes"], "docs": s["docs"], "shards": len(s["shards"])}
                       for k, s in m["splits"].items()}}
