"""Show how a model chunks text: boundaries as `|` or as alternating colours."""

from __future__ import annotations

import torch

from rltok.model import HourglassLM


def segment_bytes(model: HourglassLM, data: bytes, mode: str = "greedy", seed: int = 0,
                  device: str | torch.device = "cpu") -> tuple[list[bytes], torch.Tensor]:
    """Split `data` into the model's chunks (long inputs in windows: see segment_boundaries).
    Returns (chunks, per-byte boundary probabilities)."""
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"segment_bytes reads bytes (text.encode()), got {type(data).__name__}")
    b, probs = segment_boundaries(model, data, mode, seed, device)
    return split_chunks(data, b), probs


# Long inputs are read in windows of at most this many bytes (or max_seq_len, if smaller): the
# forward pass holds about 1 KB of activations per byte, so one pass over a 16 MiB input would not fit.
SEGMENT_WINDOW = 8192


@torch.no_grad()
def segment_boundaries(model: HourglassLM, data: bytes, mode: str = "greedy", seed: int = 0,
                       device: str | torch.device = "cpu", window: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-byte boundary decisions (bool) and probabilities (float32), which tell a trailing open chunk.
    A long input is read in overlapping windows of W = min(max_seq_len, `window` or SEGMENT_WINDOW)
    bytes, each with W // 4 bytes of context before what it decides, so memory stays bounded and a
    rule reading only the encoder's sliding window decides as in one pass (a fixed stride restarts)."""
    if not data:
        return torch.zeros(0, dtype=torch.bool), torch.zeros(0)
    if model.reads_tokens:
        # the BPE-token model: its chunks are its tokenizer's tokens, decided without the network
        from rltok.data.bpe import bpe_boundary_mask

        b = torch.as_tensor(bpe_boundary_mask(model.tokenizer, torch.tensor(list(data)).unsqueeze(0))[0])
        return b, b.float()
    if not hasattr(model, "chunker"):
        raise ValueError(f"a {type(model).__name__} reads bytes one at a time: it draws no chunk boundaries to show")
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    n, w = len(data), max(1, min(model.cfg.max_seq_len, window or SEGMENT_WINDOW))
    context, margin = w // 4, w // 16
    # filled in place: results kept as small per-window tensors would pin freed activations
    all_b, all_p = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.float32)
    done = 0
    while done < n:
        lo = max(0, done - context)
        hi = min(lo + w, n)
        keep = hi if hi == n else hi - margin
        piece = torch.frombuffer(bytearray(data[lo:hi]), dtype=torch.uint8).long().to(device).unsqueeze(0)
        # encoder_only: the boundaries are decided before the chunk level and decoder run
        bd = model(piece, mode=mode, generator=gen, force_last=False, encoder_only=True).boundaries
        b = bd.b[0, done - lo : keep - lo]
        p = bd.probs[0, done - lo : keep - lo] if bd.probs is not None else b
        all_b[done:keep] = b.cpu()
        all_p[done:keep] = p.float().cpu()
        done = keep
    return all_b, all_p


def split_chunks(data: bytes, b: torch.Tensor) -> list[bytes]:
    cuts = [0] + [t + 1 for t in torch.nonzero(b).flatten().tolist()]
    if cuts[-1] < len(data):  # a trailing open chunk
        cuts.append(len(data))
    return [data[i:j] for i, j in zip(cuts, cuts[1:])]


def show(chunk: bytes) -> str:
    """A chunk as text for a terminal: invalid UTF-8 as \\xNN, and control characters other than
    newline and tab escaped too, so a chunk can never move the cursor or change colours."""
    text = chunk.decode("utf-8", errors="backslashreplace")
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def render_pipes(chunks: list[bytes], sep: str = "|") -> str:
    return sep.join(show(c) for c in chunks)


def print_colored(chunks: list[bytes]) -> None:
    """Alternate chunks in two background colours, also into a pipe or file (the caller decided
    colour is wanted: rich would otherwise drop it where stdout is not a terminal)."""
    from rich.console import Console
    from rich.text import Text

    text = Text()
    styles = ("black on bright_cyan", "black on bright_yellow")
    for i, chunk in enumerate(chunks):
        text.append(show(chunk), style=styles[i % 2])
    Console(force_terminal=True, soft_wrap=True).print(text)
