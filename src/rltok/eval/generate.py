"""Kept for existing imports: the generation loop lives in rltok.model.generate (model.generate)."""

from rltok.model.generate import (EMPTY_PROMPT, Generation, GenerationError, Utf8Streamer, check_args,
                                  context_length, generate, make_state, prepare_prompt, sample_bytes, slide_start)

__all__ = ["EMPTY_PROMPT", "Generation", "GenerationError", "Utf8Streamer", "check_args", "context_length",
           "generate", "make_state", "prepare_prompt", "sample_bytes", "slide_start"]
