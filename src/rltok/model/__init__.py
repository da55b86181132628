from rltok.model.chunkers import Boundaries, FixedChunker, RLPolicy, build_chunker
from rltok.model.flat import FlatByteLM
from rltok.model.hourglass import HourglassLM
from rltok.model.output import HourglassOutput, LMOutput, ModelOutput

__all__ = ["Boundaries", "FixedChunker", "RLPolicy", "build_chunker", "FlatByteLM", "HourglassLM", "HourglassOutput",
           "LMOutput", "ModelOutput"]
