"""Show how a model chunks text: boundaries as `|` or as alternating colours."""

from __future__ import annotations

import torch

from rltok.model import HourglassLM


def segment_bytes(model: HourglassLM, data: bytes, mode: str = "greedy", seed: int = 0,
                  device: str | torch.device = "cpu") -> tuple[list[bytes], torch.Tensor]:
    """Split `data` into the model's chunks. Long inputs are processed in windows of
    model.cfg.max_seq_len bytes. Returns (chunks, per-byte boundary probabilities)."""
    b, probs = segment_boundaries(model, data, mode, seed, device)
    return split_chunks(data, b), probs


@torch.no_grad()
def segment_boundaries(model: HourglassLM, data: bytes, mode: str = "greedy", seed: int = 0,
                       device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-byte boundary decisions (bool) and boundary probabilities, in windows of
    model.cfg.max_seq_len bytes. Unlike the chunk list, this keeps apart a trailing chunk
    that is still open (its last byte is no boundary)."""
    if not data:
        return torch.zeros(0, dtype=torch.bool), torch.zeros(0)
    if getattr(model, "tokenizer", None) is not None and not hasattr(model, "chunker"):
        # the BPE-token model: its chunks are its tokenizer's tokens, decided without the network
        from rltok.data.bpe import bpe_boundary_mask

        b = torch.as_tensor(bpe_boundary_mask(model.tokenizer, torch.tensor(list(data)).unsqueeze(0))[0])
        return b, b.float()
    if not hasattr(model, "chunker"):
        raise ValueError(f"a {type(model).__name__} reads bytes one at a time: it draws no chunk boundaries to show")
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    step = model.cfg.max_seq_len
    all_b, all_p = [], []
    for start in range(0, len(data), step):
        piece = torch.tensor(list(data[start : start + step]), dtype=torch.long, device=device).unsqueeze(0)
        out = model(piece, mode=mode, generator=gen, force_last=False)
        all_b.append(out.boundaries.b[0].cpu())
        probs = out.boundaries.probs
        all_p.append(probs[0].float().cpu() if probs is not None else out.boundaries.b[0].float().cpu())
    return torch.cat(all_b), torch.cat(all_p)


def split_chunks(data: bytes, b: torch.Tensor) -> list[bytes]:
    chunks, begin = [], 0
    for t in torch.nonzero(b).flatten().tolist():
        chunks.append(data[begin : t + 1])
        begin = t + 1
    if begin < len(data):
        chunks.append(data[begin:])
    return chunks


def show(chunk: bytes) -> str:
    """A chunk as text for a terminal: invalid UTF-8 as \\xNN, and control characters other than
    newline and tab escaped too, so a chunk can never move the cursor or change colours."""
    text = chunk.decode("utf-8", errors="backslashreplace")
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def render_pipes(chunks: list[bytes], sep: str = "|") -> str:
    return sep.join(show(c) for c in chunks)


def print_colored(chunks: list[bytes]) -> None:
    from rich.console import Console
    from rich.text import Text

    text = Text()
    styles = ("black on bright_cyan", "black on bright_yellow")
    for i, chunk in enumerate(chunks):
        text.append(show(chunk), style=styles[i % 2])
    Console().print(text)
