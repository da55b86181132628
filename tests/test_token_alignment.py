"""Code-structure metric: chunk ends at Python token ends (rltok.data.python_tokens) and its hook
in the evaluation."""

import io
import tokenize
from pathlib import Path

import pytest
import torch

from rltok.cli import build_parser
from rltok.config import load_config
from rltok.eval.evaluate import evaluate, evaluate_sums
from rltok.model.factory import build_model
from rltok.data.python_tokens import (looks_like_python, token_alignment, token_alignment_counts, token_ends,
                                   token_units)


# the reference: Python's own tokenizer on a whole file
def tokenize_ends(source: bytes) -> torch.Tensor:
    """E for a whole, tokenizable source file, computed with `tokenize`: the last byte of every
    token with bytes and of every gap (whitespace, continuations) between tokens. An f-string is
    one unit (its FSTRING_START..FSTRING_END tokens merged, as the lexer reads it). Raises
    tokenize.TokenError / SyntaxError where `tokenize` does."""
    lines = io.BytesIO(source).readlines()
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    toks = list(tokenize.tokenize(io.BytesIO(source).readline))
    encoding = toks[0].string if toks and toks[0].type == tokenize.ENCODING else "utf-8"
    decoded: dict[int, str] = {}

    def offset(row: int, col: int) -> int:
        # tokenize counts columns in characters of the decoded line: convert through the encoding
        if row > len(lines):
            return len(source)
        if row not in decoded:
            decoded[row] = lines[row - 1].decode(encoding)
        return starts[row - 1] + len(decoded[row][:col].encode(encoding))

    fstring = {getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)}
    spans: list[tuple[int, int]] = []
    depth = 0
    for tok in toks:
        if tok.type in (tokenize.ENCODING, tokenize.ENDMARKER, tokenize.DEDENT):
            continue
        a, b = offset(*tok.start), offset(*tok.end)
        if fstring and tok.type == getattr(tokenize, "FSTRING_START", None):
            depth += 1
            if depth == 1:
                spans.append((a, b))
            continue
        if depth:
            if tok.type == getattr(tokenize, "FSTRING_END", None):
                depth -= 1
            spans[-1] = (spans[-1][0], b)
            continue
        if b > a:
            spans.append((a, b))
    mask = torch.zeros(len(source), dtype=torch.bool)
    pos = 0
    for a, b in spans:
        if a > pos:  # a gap between tokens: one whitespace unit
            mask[a - 1] = True
        mask[b - 1] = True
        pos = max(pos, b)
    if pos < len(source):
        mask[-1] = True
    return mask


SNIPPET = b"def forward(self, x):\n    return x + 1\n"
# last bytes of: def, ' ', forward, (, self, ',', ' ', x, ), :, \n, 4 spaces, return, ' ', x, ' ', +, ' ', 1, \n
SNIPPET_E = [2, 3, 10, 11, 15, 16, 17, 18, 19, 20, 21, 25, 31, 32, 33, 34, 35, 36, 37, 38]

SRC = Path(__file__).resolve().parents[1] / "src" / "rltok"

TRICKY = (
    "# -*- coding: utf-8 -*-\n"
    "import os, sys  # a comment, it's fine\n"
    "x: int = 1_000 + 0x_ff + 1.5e-3j + .5 + 1if 1 else 2\n"
    "y = rb'\\x00' + f\"{x!r:>10}\" + u'caf\u00e9' + B\"\"\n"
    "def f(a, *, b=...) -> None:\n"
    "\t'''doc, 'quoted' \"\"\"\n"
    "\tspanning lines'''\n"
    "\tif (n := len(a)) ** 2 >= 3 and a[1:] != b // 2:\n"
    "\t\tz = a @ b; z **= 2; z >>= 1\n"
    "\treturn n \\\n"
    "\t\t+ 1\n"
    "\u00fcber_name = '\u00fcnicode \u2192 arrow'  # \u00e9\u00e8\r\n"
    "class K:\r\n"
    "    pass\r\n"
    "\n"
    "\f\n"
    "w = [1,\n"
    "     2]  # trailing\n"
).encode()


def _free(t: int, rows: int = 1) -> torch.Tensor:
    free = torch.ones(rows, t, dtype=torch.bool)
    free[:, 0] = free[:, -1] = False
    return free


def test_snippet_e():
    assert token_ends(SNIPPET).nonzero().flatten().tolist() == SNIPPET_E
    assert tokenize_ends(SNIPPET).nonzero().flatten().tolist() == SNIPPET_E
    kinds = [k for *_, k in token_units(SNIPPET)]
    assert kinds[:4] == ["name", "space", "name", "op"] and kinds.count("newline") == 2


def test_precision_chance_recall_on_snippet():
    x = torch.tensor(list(SNIPPET)).unsqueeze(0)
    t = x.shape[1]
    e = torch.zeros(1, t, dtype=torch.bool)
    e[0, SNIPPET_E] = True
    free = _free(t)
    chance = (e & free).sum().item() / free.sum().item()
    m = token_alignment(x, e, free)
    assert m["token_end_precision"] == 1.0 and m["token_end_recall"] == 1.0
    assert m["token_end_chance"] == pytest.approx(chance)
    # chunk ends only off E: precision 0; half of E: recall about 1/2
    assert token_alignment(x, ~e, free)["token_end_precision"] == 0.0
    half = e.clone()
    half[0, SNIPPET_E[::2]] = False
    m = token_alignment(x, half, free)
    assert m["token_end_precision"] == 1.0
    assert m["token_end_recall"] == pytest.approx((half & free).sum().item() / (e & free).sum().item())
    # forced positions (first, last) never count, even when the rule's free mask says nothing
    counts = token_alignment_counts(x, torch.ones(1, t, dtype=torch.bool), None)
    after = torch.zeros_like(e)
    after[:, 1:] = e[:, :-1]
    n_e, n_after = (e & free).sum().item(), (after & free).sum().item()
    assert counts.tolist() == [n_e, t - 2, n_e, t - 2, n_after, n_after]
    # one byte late: chunk ends on the byte after each token end (token ends only where a unit is one byte)
    m = token_alignment(x, after, free)
    assert m["token_start_precision"] == 1.0 and m["token_start_recall"] == 1.0
    assert m["token_start_chance"] == pytest.approx(n_after / free.sum().item())
    assert m["token_end_precision"] == pytest.approx(((after & e & free).sum() / (after & free).sum()).item())
    # positions the rule did not decide are excluded
    free2 = free.clone()
    free2[0, :20] = False
    assert token_alignment_counts(x, e, free2)[3].item() == free2.sum().item()


def test_lexer_matches_tokenize_on_whole_files():
    assert torch.equal(token_ends(TRICKY, "code"), tokenize_ends(TRICKY))
    files = sorted(SRC.rglob("*.py"))
    assert files
    for f in files:
        src = f.read_bytes()
        assert torch.equal(token_ends(src, "code"), tokenize_ends(src)), f.name


def test_windows_close_to_tokenize():
    """Arbitrary 512-byte slices (starting mid-token, mid-line, inside strings and docstrings)
    read by the window lexer against tokenize on the whole file: interior disagreement small."""
    wrong = total = 0
    for f in sorted(SRC.rglob("*.py"))[:8]:
        src = f.read_bytes()
        ref = tokenize_ends(src)
        for s in range(0, len(src) - 512, 389):
            w = token_ends(src[s : s + 512])
            wrong += (w[1:511] != ref[s + 1 : s + 511]).sum().item()
            total += 510
    assert total > 10_000
    assert wrong / total < 0.03


def _tiles(units, n):
    return [u[0] for u in units] == [0] + [u[1] for u in units[:-1]] and units[-1][1] == n


def test_window_starting_inside_a_string_or_docstring():
    w = b'ello world", x)\n    y = foo(1)\n'
    units = token_units(w)
    assert units[0] == (0, 11, "string") and _tiles(units, len(w))
    w = b"the value of x\n    returned by the call.\n    \"\"\"\n    return x + 1\n"
    units = token_units(w)
    assert units[0][2] == "string" and w[: units[0][1]].endswith(b'"""')
    assert [w[a:b] for a, b, _ in units[1:4]] == [b"\n", b"    ", b"return"]
    w = b"rest of a comment that explains things\n    x = 1\n"
    assert token_units(w)[0] == (0, w.index(b"\n"), "comment")
    # code level is kept when it is plausible
    assert token_units(SNIPPET[5:])[0] == (0, 6, "name")


def test_robust_to_bad_bytes():
    w = b'\x80\xbfname = "caf\xc3\xa9" \xff\xfe x = 1 \xe2\x82 $ ? `\n"""never closed \xc3'
    units = token_units(w)
    assert _tiles(units, len(w))
    by_start = {a: (b, k) for a, b, k in units}
    assert by_start[0] == (1, "error") and by_start[1] == (2, "error")  # stray continuation bytes
    assert w[2:6] == b"name" and by_start[2] == (6, "name")
    i = w.index(b"\xff")
    assert by_start[i] == (i + 1, "error") and by_start[i + 1] == (i + 2, "error")
    assert units[-1][2] == "string"  # an unterminated docstring runs to the window's end
    for k in range(0, len(w)):  # any cut does not crash
        token_ends(w[k:])
        token_ends(w[:k])
    rng = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 300), generator=rng)
    b = torch.rand(3, 300, generator=rng) < 0.2
    m = token_alignment(x, b)
    assert all(0.0 <= v <= 1.0 for v in m.values())


def test_looks_like_python(tmp_path):
    assert looks_like_python("stdlib")
    assert looks_like_python("some/where/module.py") and looks_like_python("x.py.gz")
    assert not looks_like_python("hf:wikitext") and not looks_like_python("notes.txt")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    assert looks_like_python(str(tmp_path)) and looks_like_python(str(tmp_path / "*.py"))
    (tmp_path / "c.txt").write_text("text\n")
    assert not looks_like_python(str(tmp_path))
    assert not looks_like_python(str(tmp_path / "missing"))
    p = build_parser()
    assert p.parse_args(["eval", "-c", "ck"]).code is None
    assert p.parse_args(["eval", "-c", "ck", "--code"]).code is True
    assert p.parse_args(["eval", "-c", "ck", "--no-code"]).code is False


def test_eval_hook_adds_the_keys():
    torch.manual_seed(0)
    model = build_model(load_config("test").model)
    data = torch.tensor(list((SNIPPET * 8)[: 4 * 64 + 1]))
    x, y = data[:-1].view(4, 64), data[1:].view(4, 64)
    keys = ("token_end_precision", "token_end_chance", "token_end_recall",
            "token_start_precision", "token_start_chance", "token_start_recall")
    plain = evaluate(model, x, y, batch_size=2)
    assert not any(k in plain for k in keys)
    with_code = evaluate(model, x, y, batch_size=2, code_metrics=True)
    assert all(0.0 <= with_code[k] <= 1.0 for k in keys)
    assert with_code["bpb"] == plain["bpb"] and with_code["rate"] == plain["rate"]
    assert 0.3 < with_code["token_end_chance"] < 0.8
    sums = evaluate_sums(model, x, y, batch_size=2, code_metrics=True)
    assert sums["token_align"].shape == (6,) and sums["token_align"][3] > 0
    assert "token_align" not in evaluate_sums(model, x, y, batch_size=2)
