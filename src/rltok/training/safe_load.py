"""Reading the pickled files of a run folder without running code from them (docs/ROBUSTNESS.md,
"Untrusted folders, full disks, closed pipes, hostile values")."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _numpy_array_globals() -> list:
    """What a pickled NumPy array names: its reconstructor, ndarray, dtype and the dtype's
    class. Under both module spellings: NumPy 1 wrote `numpy.core`, NumPy 2 writes `numpy._core`."""
    reconstruct = np.core.multiarray._reconstruct if not hasattr(np, "_core") else np._core.multiarray._reconstruct
    found: list = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), type(np.dtype(np.float64)),
                   (reconstruct, "numpy.core.multiarray._reconstruct"),
                   (reconstruct, "numpy._core.multiarray._reconstruct")]
    scalar = getattr(getattr(np, "_core", None), "multiarray", None)
    if scalar is not None and hasattr(scalar, "scalar"):  # a NumPy scalar (e.g. the cached gaussian)
        found += [(scalar.scalar, "numpy.core.multiarray.scalar"), (scalar.scalar, "numpy._core.multiarray.scalar")]
    return found


def load_tensors_only(path: Path) -> Any:
    """A torch.save'd object of tensors and plain Python values; anything else is refused by
    torch's weights-only unpickler (pickle.UnpicklingError)."""
    with torch.serialization.safe_globals(_numpy_array_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)


# ---- the sharded state's metadata ---------------------------------------------------------------
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("collections", "OrderedDict"),
    *((_DCP_METADATA, name) for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                         "TensorStorageMetadata", "BytesStorageMetadata",
                                         "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
}


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles the metadata torch.distributed.checkpoint writes, and nothing else: a global
    outside its classes (and torch's dtypes) is an error, never a call."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a checkpoint's sharded metadata")


def read_sharded_metadata(path: Path) -> Any:
    """The sharded state's `.metadata` via MetadataUnpickler (pickle.UnpicklingError for anything else)."""
    with open(Path(path) / ".metadata", "rb") as f:
        return MetadataUnpickler(f).load()


def safe_sharded_reader(path: Path):
    """A torch.distributed.checkpoint reader of `path` whose metadata goes through MetadataUnpickler."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            with open(Path(path) / name, "rb") as f:
                metadata = MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))
