"""Rendering a vocabulary report (rltok_lab.vocab.vocab_report): the terminal table, Markdown and JSON."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from rltok_lab.vocab import HIST_MAX


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def metric_rows(result: dict) -> list[tuple[str, str, str]]:
    """(metric, learned, bpe) rows shared by the text and markdown reports."""
    lr, bp = result["learned"], result.get("bpe")
    rows = [
        ("chunks", lambda s: f"{s['chunks']:,}"),
        ("distinct chunks", lambda s: f"{s['distinct']:,}"),
        ("rate (chunks/byte)", lambda s: _num(s["rate"], ".4f")),
        ("bytes per chunk", lambda s: _num(s["bytes_per_chunk"], ".2f")),
        ("multi-word chunks", lambda s: _pct(s["multi_word"])),
        ("whole-word chunks", lambda s: _pct(s["whole_word"])),
        ("whitespace-only chunks", lambda s: _pct(s["whitespace_only"])),
        ("top-1k coverage", lambda s: _pct(s["coverage_top_1k"])),
        ("top-10k coverage", lambda s: _pct(s["coverage_top_10k"])),
    ]
    out = [(name, f(lr), f(bp) if bp else "") for name, f in rows]
    if bp:
        out.append(("vocabulary size", "", f"{bp['vocab_size']:,}"))
    return out


OVERLAP_LABELS = {
    "in_bpe_vocab": "learned chunks that are BPE tokens (occurrences)",
    "in_bpe_vocab_distinct": "learned chunks that are BPE tokens (distinct)",
    "same_span": "learned chunks = a BPE token at the same place",
    "boundary_recall": "learned boundaries that are BPE boundaries",
    "bpe_boundary_recall": "BPE boundaries that are learned boundaries",
    "boundary_recall_chance": "learned boundaries that are BPE boundaries, by chance",
}


def _visible(s: str) -> str:
    """A chunk's display string with whitespace and control characters made visible."""
    out = []
    for ch in s:
        if ch == " ":
            out.append("\u2423")  # ␣
        elif ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def _md_code(s: str) -> str:
    s = _visible(s).replace("|", "\\|")  # a pipe would end the table cell, even in a code span
    # a code span's fence must be longer than any run of backticks inside it
    run = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (run + 1)
    return f"{fence} {s} {fence}" if run else f"`{s}`"


def _header(result: dict) -> str:
    src = f"{result.get('data', '?')} ({result.get('split', '?')} split)"
    return (f"{result['bytes']:,} bytes of {src}, checkpoint {result.get('checkpoint', '?')}, "
            f"chunker {result['chunker']}, mode {result['mode']} (seed {result['seed']}), windows of {result['seq_len']}")


def _hist_bins(hist: list[int]) -> list[tuple[str, int]]:
    return [(str(i + 1) if i + 1 < HIST_MAX else f"{HIST_MAX}+", v) for i, v in enumerate(hist)]


def format_text(result: dict) -> str:
    """The plain-text report."""
    bp = result.get("bpe")
    bpe_head = f"bpe ({bp['pretokenize']})" if bp else ""
    lines = ["rltok vocab: " + _header(result), "", f"{'':<26}{'learned':>12}{bpe_head:>16}".rstrip()]
    lines += [f"{name:<26}{a:>12}{b:>16}".rstrip() for name, a, b in metric_rows(result)]
    if bp:
        lines += ["", "overlap"] + [f"  {OVERLAP_LABELS[k]:<52}{_pct(v):>8}" for k, v in result["overlap"].items()]
        if bp["note"]:
            lines.append(f"  note: {bp['note']}")
    lines += ["", "chunk lengths (share of chunks)"]
    n_l = max(1, result["learned"]["chunks"])
    n_b = max(1, bp["chunks"]) if bp else 1
    for i, (label, v) in enumerate(_hist_bins(result["learned"]["length_hist"])):
        vb = bp["length_hist"][i] if bp else 0
        if v or vb:
            lines.append(f"  {label:>4}  {_pct(v / n_l):>7}" + (f"  {_pct(vb / n_b):>7}" if bp else ""))
    lines += ["", "top chunks"]
    lt, bt = result["learned"]["top"], bp["top"] if bp else []
    for i in range(max(len(lt), len(bt))):
        left = f"{_visible(lt[i]['chunk'])[:24]:<24} {lt[i]['count']:>7,} {_pct(lt[i]['share']):>6}" if i < len(lt) else " " * 39
        right = f"   {_visible(bt[i]['chunk'])[:24]:<24} {bt[i]['count']:>7,} {_pct(bt[i]['share']):>6}" if i < len(bt) else ""
        lines.append(f"  {i + 1:>3}  {left}{right}")
    return "\n".join(lines)


def print_report(result: dict, file=None) -> None:
    """Rich tables on a terminal, the plain-text report otherwise (pipes, files, tests)."""
    file = file or sys.stdout
    if not file.isatty():
        print(format_text(result), file=file)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file)
    console.print(Text("rltok vocab: " + _header(result), style="bold"))
    bp = result.get("bpe")
    t = Table(show_header=True)
    t.add_column("metric")
    t.add_column("learned", justify="right")
    if bp:
        t.add_column(f"bpe ({bp['pretokenize']})", justify="right")
    for name, a, b in metric_rows(result):
        t.add_row(name, a, *([b] if bp else []))
    console.print(t)
    if bp:
        o = Table(show_header=False)
        o.add_column("overlap")
        o.add_column("", justify="right")
        for k, v in result["overlap"].items():
            o.add_row(OVERLAP_LABELS[k], _pct(v))
        console.print(o)
        if bp["note"]:
            console.print(Text(f"note: {bp['note']}", style="yellow"))
    tt = Table(title="top chunks")
    tt.add_column("#", justify="right")
    for side in ("learned", "bpe") if bp else ("learned",):
        tt.add_column(side)
        tt.add_column("count", justify="right")
        tt.add_column("share", justify="right")
    lt, bt = result["learned"]["top"], bp["top"] if bp else []
    for i in range(max(len(lt), len(bt))):
        cells = [str(i + 1)]
        for tops in (lt, bt) if bp else (lt,):
            e = tops[i] if i < len(tops) else None
            # Text(), not markup: chunks can hold "[" and other rich markup characters
            cells += [Text(_visible(e["chunk"])), f"{e['count']:,}", _pct(e["share"])] if e else ["", "", ""]
        tt.add_row(*cells)
    console.print(tt)


def markdown(result: dict, top: int = 30) -> str:
    """A markdown report: learned vs BPE side by side, overlap, lengths, top chunks of each."""
    bp = result.get("bpe")
    cols = "| metric | learned | BPE |" if bp else "| metric | learned |"
    lines = ["# Learned vocabulary", "", _header(result) + ".", ""]
    if bp:
        lines += [f"BPE: pretokenize `{bp['pretokenize']}`, vocabulary {bp['vocab_size']:,}, trained on "
                  f"{bp['train_bytes']:,} bytes of {bp['fitted_on']}, sized to the learned rate "
                  f"{bp['target_rate']:.4f} on the analysed text.", ""]
        if bp["note"]:
            lines += [f"Note: {bp['note']}.", ""]
    lines += [cols, "|---|---:|---:|" if bp else "|---|---:|"]
    lines += [f"| {name} | {a} | {b} |" if bp else f"| {name} | {a} |" for name, a, b in metric_rows(result)]
    if bp:
        lines += ["", "| overlap | share |", "|---|---:|"]
        lines += [f"| {OVERLAP_LABELS[k]} | {_pct(v)} |" for k, v in result["overlap"].items()]
    lines += ["", "## Chunk lengths", "", "| bytes | learned | BPE |" if bp else "| bytes | learned |",
              "|---:|---:|---:|" if bp else "|---:|---:|"]
    n_l = max(1, result["learned"]["chunks"])
    for i, (label, v) in enumerate(_hist_bins(result["learned"]["length_hist"])):
        vb = bp["length_hist"][i] if bp else 0
        if v or vb:
            lines.append(f"| {label} | {_pct(v / n_l)} | {_pct(vb / max(1, bp['chunks']))} |" if bp
                         else f"| {label} | {_pct(v / n_l)} |")
    lt, bt = result["learned"]["top"][:top], bp["top"][:top] if bp else []
    lines += ["", f"## Top {max(len(lt), len(bt))} chunks", "",
              "Spaces show as \u2423; newlines, tabs and undecodable bytes as escapes.", ""]
    if bp:
        lines += ["| # | learned | count | share | BPE | count | share |", "|---:|---|---:|---:|---|---:|---:|"]
    else:
        lines += ["| # | learned | count | share |", "|---:|---|---:|---:|"]
    for i in range(max(len(lt), len(bt))):
        cells = [str(i + 1)]
        for tops in (lt, bt) if bp else (lt,):
            e = tops[i] if i < len(tops) else None
            cells += [_md_code(e["chunk"]), f"{e['count']:,}", _pct(e["share"])] if e else ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_json(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def write_markdown(result: dict, path: str | Path, top: int = 30) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(result, top), encoding="utf-8")
    return path


__all__ = ["format_text", "markdown", "metric_rows", "print_report", "write_json", "write_markdown"]
