"""Byte classes shared by the measurements, rewards and diagnostics. Whitespace is what
bytes.isspace() says: nothing >= 0x80 (0x85 and 0xA0 are UTF-8 continuation bytes in a byte view)."""

from __future__ import annotations

import torch

ASCII_WHITESPACE = frozenset(b" \t\n\x0b\x0c\r")
# token_alignment's Python lexer: Python separates the tokens of a line with space, tab and form feed
PYTHON_BLANKS = ASCII_WHITESPACE - frozenset(b"\n\r\x0b")


def is_whitespace_byte(x: torch.Tensor) -> torch.Tensor:
    """Which entries of a tensor of byte ids (any integer dtype, any device) are ASCII
    whitespace: a bool tensor of x's shape."""
    out = torch.zeros_like(x, dtype=torch.bool)
    for c in sorted(ASCII_WHITESPACE):  # comparisons with Python ints: no host-to-device copy
        out |= x == c
    return out
