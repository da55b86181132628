"""Held-out measurements: bpb (nats over the scored bytes / (bytes * ln 2)), boundary rate, bytes per
chunk, alignment. With `context` c every family scores exactly w[c:] of each window w; None is what
training validates with, each model's training forward."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from rltok.data.bytes_classes import is_whitespace_byte
from rltok.data.python_tokens import COUNT_NAMES as TOKEN_COUNTS
from rltok.data.python_tokens import summarize_counts, token_alignment_counts


def whitespace_alignment(x: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Share of whitespace bytes that close a chunk (space_end: "word |"), that open one
    (space_start: "word| next"), or either (space_align)."""
    ws = is_whitespace_byte(x)
    prev = torch.zeros_like(b)
    prev[:, 1:] = b[:, :-1]
    n = ws.sum().clamp(min=1).item()
    return {
        "space_end": (b & ws).sum().item() / n,
        "space_start": (prev & ws).sum().item() / n,
        "space_align": ((b | prev) & ws).sum().item() / n,
    }


def chunk_lengths(b: torch.Tensor) -> torch.Tensor:
    """Lengths of all complete chunks (bytes between consecutive boundaries) in a (B, T) mask."""
    lengths = []
    for row in b:
        ends = torch.nonzero(row).flatten()
        if len(ends):
            lengths.append(torch.diff(ends, prepend=torch.tensor([-1], device=row.device)))
    return torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.long)


@torch.no_grad()
def evaluate(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 8, mode: str = "sample",
             seed: int = 1234, device: str | torch.device = "cpu", autocast_dtype=None,
             code_metrics: bool = False, context: int | None = 1, forced_split: bool = True) -> dict[str, float]:
    """Evaluate on fixed windows (N, T), sampling boundaries from a seeded generator of its own.
    code_metrics: also the Python-token alignment (rltok.data.python_tokens). context: score the
    bytes w[context:] of every window w. forced_split=False: a model that
    tokenises reads each window whole and scores from its first token boundary at or after it."""
    return summarize(evaluate_sums(model, x, y, batch_size, mode, seed, device, autocast_dtype, code_metrics,
                                   context, forced_split))


@torch.no_grad()
def evaluate_sums(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 8, mode: str = "sample",
                  seed: int = 1234, device: str | torch.device = "cpu", autocast_dtype=None,
                  code_metrics: bool = False, context: int | None = 1,
                  forced_split: bool = True) -> dict[str, torch.Tensor]:
    """The additive counts behind `evaluate` (nats, bytes, boundaries, positions, whitespace,
    chunk-length histogram) as one float64 vector per key, so that shards of an evaluation
    (data-parallel ranks) can be summed before `summarize`."""
    _check_context(context, x.shape[1])
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    batches = ((x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size))
    return batch_sums(model, batches, mode, seed, device, autocast_dtype, code_metrics, context, forced_split)


def _check_context(context: int | None, length: int) -> None:
    if context is not None and not 1 <= context <= length:
        raise ValueError(f"context must be 1..{length} for windows of {length + 1} bytes, got {context}")


_SCALARS = ("nats", "bytes", "boundaries", "positions", "space_end", "space_start", "space_align", "ws",
            "free_boundaries", "free")


@torch.no_grad()
def batch_sums(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], mode: str = "sample",
               seed: int = 1234, device: str | torch.device = "cpu", autocast_dtype=None,
               code_metrics: bool = False, context: int | None = 1,
               forced_split: bool = True) -> dict[str, torch.Tensor]:
    """`evaluate_sums` over batches of windows (x, y) handed one at a time (e.g.
    rltok.data.windows.EvalWindows.batches), so that only one batch is in memory: the same sums
    as `evaluate_sums` of the windows they add up to, in batches of the same size."""
    was_training = model.training
    model.eval()
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    scalars = torch.zeros(len(_SCALARS), dtype=torch.float64)  # summed in float64, batch by batch
    hist = torch.zeros(65, dtype=torch.long)
    token_align = torch.zeros(len(TOKEN_COUNTS), dtype=torch.float64)  # code_metrics: rltok.data.python_tokens counts
    for xb, yb in batches:
        _check_context(context, xb.shape[1])
        xb, yb = xb.to(device), yb.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out, nll, mask = scored_bytes(model, xb, yb, context, mode, gen, forced_split)
        row = {"nats": nll[mask].sum().item(), "bytes": int(mask.sum())}
        if out.boundaries is not None:
            b, free = out.boundaries.b, out.boundaries.free
            w = int(is_whitespace_byte(xb).sum())
            share = whitespace_alignment(xb, b)
            row.update({k: share[k] * w for k in ("space_end", "space_start", "space_align")},
                       boundaries=int(b.sum()), positions=b.numel(), ws=w,
                       free_boundaries=int((b & free).sum()), free=int(free.sum()))
            hist += torch.bincount(chunk_lengths(b).clamp(max=64).cpu(), minlength=65)[:65]
            if code_metrics:
                token_align += token_alignment_counts(xb, b, free)
        scalars += torch.tensor([row.get(k, 0) for k in _SCALARS], dtype=torch.float64)
    model.train(was_training)
    sums = {"scalars": scalars, "hist": hist.to(torch.float64)}
    if code_metrics:
        sums["token_align"] = token_align
    return sums


def scored_bytes(model, xb: torch.Tensor, yb: torch.Tensor, context: int | None, mode: str, generator,
                 forced_split: bool = True):
    """The model's output on windows (xb, yb), its loss attributed to the targets and the mask of
    the targets scored: yb[:, context-1:] (every byte of w[context:]), or with context None the
    bytes its training forward scores."""
    score_window = getattr(model, "score_window", None)
    if context is not None and score_window is not None:  # it tokenises the whole window itself
        out = score_window(torch.cat([xb, yb[:, -1:]], 1), context, split=forced_split)
        nll, mask = out.per_byte_nll(yb)
        return out, nll, mask
    out = model(xb, mode=mode, generator=generator)
    nll, mask = out.per_byte_nll(yb)
    if context is not None and context > 1:
        mask = mask & (torch.arange(yb.shape[1], device=mask.device) >= context - 1)
    return out, nll, mask


def summarize(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    s = dict(zip(_SCALARS, sums["scalars"].tolist()))
    # no byte scored (a BPE-token model whose windows hold no token start after the context): no
    # number, rather than a perfect 0.0
    bpb = s["nats"] / s["bytes"] / math.log(2) if s["bytes"] else float("nan")
    result: dict[str, float] = {"bpb": bpb, "bytes": int(s["bytes"])}
    if s["positions"]:
        # rate: boundaries per byte over free positions (as in training); chunks per byte and
        # bytes per chunk count every chunk, forced ones included (what the compute sees)
        cpb = s["boundaries"] / s["positions"]
        result.update(rate=s["free_boundaries"] / max(1, s["free"]), chunks_per_byte=cpb,
                      bytes_per_chunk=1 / cpb if cpb else float("inf"))
        result.update({k: s[k] / max(1, s["ws"]) for k in ("space_end", "space_start", "space_align")})
        result["chunk_length_hist"] = [int(v) for v in sums["hist"][1:].tolist()]  # lengths 1..64 (64 = 64+)
    if "token_align" in sums and sums["token_align"][3] > 0:
        result.update(summarize_counts(sums["token_align"]))
    return result
