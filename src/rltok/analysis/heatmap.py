"""Boundary heat maps: per-byte boundary probability as background colour, boundaries marked. A cell
is a character (the highest probability of its bytes; marked when any closes a chunk), an invalid
byte a cell of its own, shown as \\xNN."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Cell:
    text: str
    prob: float
    boundary: bool
    probs: list[float]  # per byte


def cells(data: bytes, probs: torch.Tensor | list[float], boundaries: list[bool]) -> list[Cell]:
    probs = [float(p) for p in probs]
    out, i = [], 0
    while i < len(data):
        n = next((k for k in range(1, 5) if _decodes(data[i:i + k])), 0)
        text = data[i:i + n].decode("utf-8") if n else f"\\x{data[i]:02x}"
        n = n or 1
        out.append(Cell(text, max(probs[i:i + n]), any(boundaries[i:i + n]), probs[i:i + n]))
        i += n
    return out


def _decodes(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _rgb(p: float) -> tuple[int, int, int]:
    """White (p=0) to orange-red (p=1)."""
    return 255, round(255 - 145 * p), round(255 - 215 * p)


_SHOWN = {"\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}


def write_html(path: str | Path, data: bytes, probs, boundaries: list[bool], title: str = "rltok boundaries") -> None:
    spans = []
    for c in cells(data, probs, boundaries):
        r, g, b = _rgb(c.prob)
        shown = html.escape(_SHOWN.get(c.text, c.text))
        tip = "p=" + ", ".join(f"{p:.3f}" for p in c.probs) + (" | boundary" if c.boundary else "")
        cls = ' class="b"' if c.boundary else ""
        spans.append(f'<span{cls} style="background:rgb({r},{g},{b})" title="{tip}">{shown}</span>')
        if c.text == "\n":
            spans.append("\n")
    n_b = sum(boundaries)
    doc = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; }}
pre {{ font-family: monospace; font-size: 15px; line-height: 1.7; white-space: pre-wrap; }}
span.b {{ border-right: 2px solid #1f3fbf; }}
</style></head><body>
<h3>{html.escape(title)}</h3>
<p>Background: probability that the byte closes a chunk (white 0 &rarr; red 1). Blue bar: a
chunk ends there. {n_b} boundaries over {len(data)} bytes. Hover a character for its per-byte
probabilities.</p>
<pre>{''.join(spans)}</pre>
</body></html>
"""
    Path(path).write_text(doc, encoding="utf-8")


def write_png(path: str | Path, data: bytes, probs, boundaries: list[bool], columns: int = 64,
              title: str = "rltok boundaries") -> None:
    """A grid of character cells (new row at a newline or after `columns` cells)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    grid, row, col = [], 0, 0
    for c in cells(data, probs, boundaries):
        if col >= columns:
            row, col = row + 1, 0
        grid.append((row, col, c))
        col += 1
        if c.text == "\n":
            row, col = row + 1, 0
    n_rows = row + 1
    fig, ax = plt.subplots(figsize=(max(4.0, columns * 0.22), max(1.2, n_rows * 0.32 + 0.8)))
    cmap = plt.get_cmap("OrRd")
    for r, k, c in grid:
        ax.add_patch(Rectangle((k, r), 1, 1, facecolor=cmap(c.prob), edgecolor="none"))
        shown = _SHOWN.get(c.text, "\u00b7" if c.text == " " else c.text)
        ax.text(k + 0.5, r + 0.55, shown, ha="center", va="center", fontsize=7, family="monospace")
        if c.boundary:
            ax.plot([k + 1, k + 1], [r + 0.05, r + 0.95], color="#1f3fbf", linewidth=1.5)
    ax.set_xlim(0, columns)
    ax.set_ylim(n_rows, 0)
    ax.set_axis_off()
    ax.set_title(f"{title}: {sum(boundaries)} boundaries / {len(data)} bytes (colour: P(boundary), bar: boundary)",
                 fontsize=9)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, 1))
    fig.colorbar(sm, ax=ax, fraction=0.02, pad=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # missing glyphs for exotic characters are not an error
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
