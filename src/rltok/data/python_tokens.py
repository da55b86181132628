"""Code structure: do chunk ends fall where a Python lexical token ends? The units, the lexer and
the metrics: docs/ARCHITECTURE.md, "Python-token alignment"."""

from __future__ import annotations

import keyword
import re
import token as token_mod
import tokenize

import torch

from rltok.data.bytes_classes import PYTHON_BLANKS
from rltok.data.sources import DataError, expand_paths

# ---------------------------------------------------------------------------------------------
# the regex lexer

_NEWLINE = rb"\r\n|\r|\n"
_SPACE = rb"(?:[" + re.escape(bytes(sorted(PYTHON_BLANKS))) + rb"]|\\(?:\r\n|\r|\n))+"
_COMMENT = rb"#[^\r\n\xff]*"
# string prefixes: Python's, and t/tr/rt (template strings, Python 3.14)
_PREFIX = rb"(?:[bB][rR]|[rR][bB]|[fF][rR]|[rR][fF]|[tT][rR]|[rR][tT]|[rRbBuUfFtT])?"
_ESC = rb"\\(?:\r\n|[^\xff])"  # a backslash escapes any byte, a line end included


def _triple_body(q: bytes) -> bytes:
    # up to and including the closing quotes; unterminated: to the next 0xFF or the window's end
    return rb"(?:[^\\\xff]|" + _ESC + rb")*?(?:" + q * 3 + rb"|(?=\xff)|\Z)"


def _single_body(q: bytes) -> bytes:
    # up to and including the closing quote on the same (possibly backslash-continued) line
    return rb"(?:[^" + q + rb"\\\r\n\xff]|" + _ESC + rb")*" + q


_TRIPLE = _PREFIX + rb"(?:'''" + _triple_body(b"'") + rb'|"""' + _triple_body(b'"') + rb")"
_STRING = _PREFIX + rb"(?:'" + _single_body(b"'") + rb'|"' + _single_body(b'"') + rb")"
_NUMBER = re.sub(r"\((?!\?)", "(?:", tokenize.Number).encode()  # its groups made non-capturing
_UTF8 = rb"(?:[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3})"
_NAME = rb"(?:[A-Za-z_]|" + _UTF8 + rb")(?:[A-Za-z0-9_]|" + _UTF8 + rb")*"
_OPS = b"|".join(re.escape(op.encode()) for op in sorted(token_mod.EXACT_TOKEN_TYPES, key=len, reverse=True))

_UNIT = re.compile(b"|".join(b"(?P<%s>%s)" % (kind, p) for kind, p in (
    (b"newline", _NEWLINE), (b"space", _SPACE), (b"comment", _COMMENT), (b"string", _TRIPLE + b"|" + _STRING),
    (b"number", _NUMBER), (b"name", _NAME), (b"op", _OPS))), re.DOTALL)

# a window without triple quotes that is still this implausible as code (a plain name after a
# plain name every _PROSE_BYTES bytes or more often, from whichever starting state) is read as
# the inside of one docstring; on the standard library 0.1% of code windows score that high
_PROSE_BYTES = 32
_KEYWORDS = frozenset(w.encode() for w in keyword.kwlist + getattr(keyword, "softkwlist", []))

# starting states: the rest of a comment or string the window starts inside of
_STARTS = {
    "code": None,
    '"': re.compile(_single_body(b'"')),
    "'": re.compile(_single_body(b"'")),
    "#": re.compile(rb"[^\r\n\xff]*(?=[\r\n])"),
    '"""': re.compile(_triple_body(b'"'), re.DOTALL),
    "'''": re.compile(_triple_body(b"'"), re.DOTALL),
}


def _lex_from(data: bytes, pos: int, units: list[tuple[int, int, str]]) -> int:
    """Append the units of data[pos:] at code level. Returns how implausible they are as code:
    the error units, plus the names that follow another name across spaces where neither is a
    keyword ("the value": prose lexed as code is full of these, Python code has next to none)."""
    bad = 0
    n = len(data)
    match = _UNIT.match
    name_then_space = False  # the last units were a plain name and a space
    plain_name = False  # the last unit was a plain (non-keyword) name
    while pos < n:
        m = match(data, pos)
        if m is None or m.end() == pos:
            units.append((pos, pos + 1, "error"))
            bad += data[pos] < 0x80  # invalid UTF-8 is as stray inside a string: no evidence
            pos += 1
            name_then_space = plain_name = False
            continue
        kind = m.lastgroup
        units.append((pos, m.end(), kind))
        if kind == "name":
            plain = m.group() not in _KEYWORDS
            bad += plain and name_then_space
            plain_name, name_then_space = plain, False
        else:
            name_then_space, plain_name = kind == "space" and plain_name, False
        pos = m.end()
    return bad


def token_units(data: bytes, start: str | None = None) -> list[tuple[int, int, str]]:
    """The lexical units tiling `data`: (start, end, kind) with kind one of newline, space,
    comment, string, number, name, op, error (a one-byte unit). `start` fixes the starting
    state, one of "code", "#" (inside a comment), '"', "'", '\"\"\"', "'''" (inside such a
    string); by default the most plausible one (docs/ARCHITECTURE.md, "Python-token alignment")."""
    data = bytes(data)
    best: tuple[int, list] | None = None
    for name, pattern in _STARTS.items():
        if start is not None and name != start:
            continue
        units: list[tuple[int, int, str]] = []
        pos = 0
        if pattern is not None:
            m = pattern.match(data)
            if m is None or m.end() == 0 or m.end() == len(data):
                continue  # the state must end inside the window (a quote or line end closes it)
            units.append((0, m.end(), "comment" if name == "#" else "string"))
            pos = m.end()
        bad = _lex_from(data, pos, units)
        if best is None or bad < best[0]:
            best = (bad, units)
        if bad == 0:
            break
    if best is None:  # a forced state that cannot close inside the window: code level
        units = []
        _lex_from(data, 0, units)
        return units
    if (start is None and best[0] * _PROSE_BYTES >= max(len(data), 4 * _PROSE_BYTES)
            and b'"""' not in data and b"'''" not in data and b"\xff" not in data):
        return [(0, len(data), "string")]  # prose throughout: inside a docstring that spans the window
    return best[1]


def token_ends(data: bytes, start: str | None = None) -> torch.Tensor:
    """E as a (len(data),) bool tensor: True where the byte is the last byte of a lexical unit."""
    mask = torch.zeros(len(data), dtype=torch.bool)
    mask[torch.tensor([e - 1 for _, e, _ in token_units(data, start)], dtype=torch.long)] = True
    return mask


# ---------------------------------------------------------------------------------------------
# the metric

COUNT_NAMES = ("ends_in_e", "ends", "e", "positions", "ends_after_e", "after_e")


def _window_bytes(row: torch.Tensor) -> bytes:
    # byte ids outside 0..255 (none in byte data) read as the separator 0xFF
    return bytes(v if 0 <= v < 256 else 0xFF for v in row.tolist())


def token_alignment_counts(x: torch.Tensor, b: torch.Tensor, free: torch.Tensor | None = None) -> torch.Tensor:
    """The additive counts (float64, COUNT_NAMES) of (B, T) byte ids `x` with boundary mask `b` (b[t]:
    byte t closes a chunk), over the rule's `free` positions (None: all) but each window's first and last."""
    x, b = x.detach().cpu(), b.detach().cpu().bool()
    keep = torch.ones_like(b) if free is None else free.detach().cpu().bool().clone()
    keep[:, 0] = False
    keep[:, -1] = False
    e = torch.stack([token_ends(_window_bytes(row)) for row in x]) if len(x) else torch.zeros_like(b)
    after = torch.zeros_like(e)
    after[:, 1:] = e[:, :-1]  # byte t starts a unit: t - 1 ends one
    bk = b & keep
    return torch.tensor([(bk & e).sum().item(), bk.sum().item(), (e & keep).sum().item(), keep.sum().item(),
                         (bk & after).sum().item(), (after & keep).sum().item()], dtype=torch.float64)


def summarize_counts(counts: torch.Tensor) -> dict[str, float]:
    """The ratios from (summed) `token_alignment_counts`: at the token's end and one byte late."""
    hits, ends, e, n, late_hits, after = counts.tolist()
    return {"token_end_precision": hits / max(1.0, ends), "token_end_chance": e / max(1.0, n),
            "token_end_recall": hits / max(1.0, e),
            "token_start_precision": late_hits / max(1.0, ends), "token_start_chance": after / max(1.0, n),
            "token_start_recall": late_hits / max(1.0, after)}


def token_alignment(x: torch.Tensor, b: torch.Tensor, free: torch.Tensor | None = None) -> dict[str, float]:
    """token_end_* and token_start_* precision, chance and recall of one batch of windows."""
    return summarize_counts(token_alignment_counts(x, b, free))


def looks_like_python(spec: str) -> bool:
    """Whether a data spec names Python sources: 'stdlib', a .py file, or a folder or glob whose
    files all end in .py (compressed copies such as .py.gz included)."""
    if spec == "stdlib":
        return True
    if spec.startswith("hf:") or not spec.strip():
        return False
    if re.search(r"\.py(\.\w+)?$", spec):
        return True
    try:
        files = expand_paths(spec)
    except (DataError, OSError):
        return False
    return bool(files) and all(re.search(r"\.py(\.\w+)?$", p.name) for p in files)
