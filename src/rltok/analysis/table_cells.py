"""Cells of the study's markdown tables: one way to print a number that may be missing, and a table."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

MISSING = "–"


def number(x: float | None, fmt: str = ".3g") -> str:
    """`x` formatted, or an en dash where there is no number (None, NaN or infinite)."""
    return MISSING if x is None or not math.isfinite(x) else format(x, fmt)


def interval(lo_hi: Sequence[float | None], fmt: str = ".3g") -> str:
    """`[lo, hi]` with each end formatted as `number` does."""
    lo, hi = lo_hi
    return f"[{number(lo, fmt)}, {number(hi, fmt)}]"


def table(header: Sequence[str], rows: Iterable[str]) -> str:
    """A markdown table: the header's cells, its rule, then the rows (each a whole `| ... |` line)."""
    return "\n".join([f"| {' | '.join(header)} |", "|---" * len(header) + "|", *rows])
