"""load_corpus: the train and validation streams of any source, prepared, mixed, cached or read into
memory (docs/DATA.md)."""
from __future__ import annotations

from pathlib import Path

import torch

from rltok.config import DataConfig
from rltok.data.shards import is_prepared, open_mixture, open_prepared
from rltok.data.sources import Corpus, DataError, corpus_cuts, doc_key, named_split, read_documents, to_tensor


def _prepared_source(spec: str, val: str, val_fraction: float, max_bytes: int, text_field: str,
                     prepare_above: int | None, cache_dir: str) -> str | None:
    """The prepared folder to read `spec` from: the folder itself when `rltok prepare` wrote it,
    the cache folder when the source is large (prepared there on first use), else None."""
    if is_prepared(spec):
        return spec
    from rltok.data.prepare import is_large, prepare_cached

    limit = DataConfig.prepare_above if prepare_above is None else prepare_above
    if not is_large(spec, val, max_bytes, limit):
        return None
    return str(prepare_cached(spec, val=val, val_fraction=val_fraction, max_bytes=max_bytes,
                              text_field=text_field, cache_dir=cache_dir))


def load_corpus(train: str = "stdlib", val: str = "", val_fraction: float = 0.02, max_bytes: int = 0,
                text_field: str = "text", *, prepare_above: int | None = None, cache_dir: str = "") -> Corpus:
    """The train and val streams of a source (module docstring); a source larger than
    `prepare_above` bytes (default data.prepare_above; 0 = never) is prepared into `cache_dir` first."""
    if not isinstance(train, str) or not isinstance(val, str):
        raise TypeError(f"data sources are strings (a path, 'stdlib', hf:NAME, mix:...), got {train!r} and {val!r}")
    if not 0 < val_fraction < 0.5:  # as data.val_fraction (NaN fails too)
        raise DataError(f"val_fraction must be in (0, 0.5), got {val_fraction}")
    if max_bytes < 0:
        raise DataError(f"max_bytes must be >= 0 (0: no cap), got {max_bytes}")
    if train.startswith("mix:"):
        return open_mixture(train[4:])
    prepared = _prepared_source(train, val, val_fraction, max_bytes, text_field, prepare_above, cache_dir)
    if prepared is not None:
        corpus = open_prepared(prepared).corpus(source=train)
        if prepared == train:  # the user's own prepared folder: caps and a val source apply on top
            if max_bytes:
                corpus.train = corpus.train.prefix(max_bytes)
            if val:
                corpus.val, corpus.split = to_tensor(read_documents(val, 0, text_field)[0]), "given"
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
        raise DataError(f"data source {train!r} is too small to train on: {sum(map(len, docs))} bytes read, "
                        f"{len(corpus.train)} of them in the train split (2 needed)")
    return corpus


EVAL_SPLITS = ("train", "val", "test", "all")


def available_splits(spec: str) -> list[str]:
    """The splits `load_eval_bytes` can give for `spec`: a prepared folder's own; a split
    folder's `<split>.*` files; else train and val (the parts load_corpus makes) and all."""
    if spec.startswith("mix:"):
        return ["val"]
    if is_prepared(spec):
        return open_prepared(spec).splits
    return [s for s in EVAL_SPLITS if s != "test" or named_split(spec, s)]


def resolve_split(spec: str, split: str, fallback: bool = False) -> str:
    """The split to evaluate `spec` on: `split` itself when the source has it; with `fallback`,
    "val" in place of a split the source lacks; else a DataError listing the valid ones."""
    avail = available_splits(spec)
    if split not in EVAL_SPLITS:
        raise DataError(f"unknown split {split!r}; valid splits of {spec}: {', '.join(avail)}")
    if split in avail:
        return split
    if split == "all" and not spec.startswith("mix:") and "all" not in avail:  # a prepared folder
        raise DataError(f"{spec} is a prepared corpus: its splits are kept, not the whole source; "
                        f"evaluate on --split {', '.join(avail)}")
    if fallback and "val" in avail:
        return "val"
    raise DataError(f"{spec} has no {split!r} split (its splits: {', '.join(avail)}); choose one of them"
                    + (", or pass --fallback-to-val to evaluate on its val split" if "val" in avail else ""))


def _first(stream, n: int):
    """The first n bytes of a tensor or byte stream (all of it when n is 0 or past its end)."""
    if not n or n >= len(stream):
        return stream
    return stream.prefix(n) if hasattr(stream, "prefix") else stream[:n]


def load_eval_bytes(spec: str, split: str = "val", max_bytes: int = 0, val_fraction: float = 0.02,
                    *, val: str = "", source_max_bytes: int = 0, text_field: str = "text",
                    prepare_above: int | None = None, cache_dir: str = "", fallback: bool = False) -> torch.Tensor:
    """Bytes to evaluate on: the named split of a split or prepared folder, the whole source
    (split="all"), else exactly the part `load_corpus` gives when called with the same settings
    (`val`, `val_fraction`, `source_max_bytes` as its max_bytes, `text_field`, `prepare_above`,
    `cache_dir`: give a run's data.* to get the bytes it held out; `run_split_bytes` does). Of
    those, the first `max_bytes` (0: all). A cap on the source would move the documents the
    hash rule holds out, so `max_bytes` never caps the source. A split the source does not have
    is an error (`resolve_split`; with `fallback`, val instead)."""
    split = resolve_split(spec, split, fallback)
    if val and split == "val":  # a val source of its own, read as training read it
        return _first(to_tensor(read_documents(val, max_bytes, text_field)[0]), max_bytes)
    if spec.startswith("mix:"):  # (resolve_split leaves only its val split)
        return _first(load_corpus(spec, val_fraction=val_fraction).val, max_bytes)
    train_cap = source_max_bytes if split == "train" else 0  # training read only this much of its train part
    cap = min((c for c in (max_bytes, train_cap) if c), default=0)
    if is_prepared(spec):  # (resolve_split leaves only its own splits)
        return _first(open_prepared(spec).stream(split), cap)
    named = named_split(spec, split) or (spec if split == "all" else None)
    if named:  # its first `cap` bytes of documents are all that is read
        return _first(to_tensor(read_documents(named, cap, text_field)[0]), cap)
    corpus = load_corpus(spec, val, val_fraction, source_max_bytes, text_field, prepare_above=prepare_above,
                         cache_dir=cache_dir)
    return _first(corpus.train if split == "train" else corpus.val, max_bytes)


def _same_source(a: str, b: str) -> bool:
    """Two spellings of one source: equal, or local paths to the same file or folder."""
    if a == b:
        return True
    try:
        pa, pb = Path(a).expanduser(), Path(b).expanduser()
        return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()
    except (OSError, ValueError):
        return False


def run_split_bytes(data: DataConfig, split: str = "val", max_bytes: int = 0, *, source: str | None = None,
                    fallback: bool = False) -> torch.Tensor:
    """The bytes of `split` of the corpus a run with these data.* settings trained on, held out
    exactly as training held them out (its own val source, cap and split rule); the first
    `max_bytes` of them (0: all). `source`: another corpus instead, split by its own files or by
    the hash rule at data.val_fraction (None, or the run's own data.train: the run's corpus)."""
    if source is not None and not _same_source(source, data.train):
        return load_eval_bytes(source, split, max_bytes, data.val_fraction, fallback=fallback)
    return load_eval_bytes(data.train, split, max_bytes, data.val_fraction, val=data.val,
                           source_max_bytes=data.max_bytes, text_field=data.hf_text_field,
                           prepare_above=data.prepare_above, cache_dir=data.cache_dir, fallback=fallback)
