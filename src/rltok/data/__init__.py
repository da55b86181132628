"""Bytes in: sources (files, folders, the standard library, Hub datasets), prepared byte shards,
and the train/validation split of a corpus. `load_corpus` sits on top of the rest."""

from rltok.data.sources import Corpus, DataError
from rltok.data.corpus import load_corpus, load_eval_bytes

__all__ = ["Corpus", "DataError", "load_corpus", "load_eval_bytes"]
