from .chunkers import Boundaries, FixedChunker, RLPolicy, build_chunker
from .flat import FlatByteLM
from .hourglass import HourglassLM
from .output import ModelOutput

__all__ = ["Boundaries", "FixedChunker", "RLPolicy", "build_chunker", "FlatByteLM", "HourglassLM", "ModelOutput"]
