"""How far can a rule that sees only the bytes so far get on Python lexical-token alignment?

`rltok eval --code` reads a boundary rule's chunk ends against Python's lexical units
(`rltok.data.python_tokens`). This instrument scores simple causal rules on the same windows, so a
learned rule's numbers can be read against what is reachable at all:

* `iid`: boundaries drawn independently at rate 0.2 (precision = chance);
* `whitespace`: the comparison's whitespace rule (a chunk ends at a space-like byte after a
  word byte), exactly as `WhitespaceChunker` cuts;
* `low_pmi_k{1,2,3}`: cut where the byte just read is least predictable from the k bytes before
  it relative to its frequency (pointwise mutual information, counted on the train split), at
  the whitespace rule's rate and at 0.2 — the statistical signal a learned rule could pick up;
* `class_runs`: a hand-written lexer's first step: a chunk ends on the first byte of each run of
  name bytes (letters, digits, `_`, non-ASCII), of blanks, and on every other byte (newlines,
  operators, quotes);
* `class_runs_blanks_join_left`: the same, except that a run of blanks starts no chunk;
* `class_runs_code_only`: `class_runs`, but never inside a string or comment (it knows the unit
  kinds from the lexer itself): the gain a rule that tracks strings and comments could add;
* `bpe_gpt2`, `bpe_line`: the field's learned tokenizer for comparison, a byte-level BPE trained
  on the train split (GPT-2's pre-tokenisation, or tokens that may span words but not lines),
  sized to the whitespace rule's rate and to 0.2 on these windows. BPE is not causal (it sees the
  whole pre-token), so its token ends are read at the end.

    .venv/bin/python lab/scripts/token_alignment_rules.py DATA/code-py [--windows 64] [--out FILE]

Reports each rule's rate, its token_end/token_start precision (chance beside them) and the share
of its cuts inside string and comment units, and the share of bytes that lie inside them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]

from rltok.data.bpe import bpe_boundary_mask, fit_bpe_sized_on  # noqa: E402
from rltok_lab.lexicon_instruments import is_blank_byte  # noqa: E402
from rltok.data.corpus import load_eval_bytes  # noqa: E402
from rltok.model.chunkers import WhitespaceChunker, spacelike  # noqa: E402
from rltok.data.python_tokens import token_alignment, token_units  # noqa: E402


def context_keys(x: np.ndarray, k: int) -> np.ndarray:
    """Per position t >= k of a 1-d byte array: an integer naming bytes t-k..t-1 (exact, base 256)."""
    keys = np.zeros(len(x) - k, dtype=np.int64)
    for j in range(k):
        keys = keys * 256 + x[j : len(x) - k + j]
    return keys


class ContextCounts:
    """Counts of (k-byte context, next byte) on a training stream; `log_prob` smooths towards the
    unigram with one pseudo-count per byte value spread by frequency."""

    def __init__(self, train: np.ndarray, k: int):
        self.k = k
        self.unigram = (np.bincount(train, minlength=256) + 1.0) / (len(train) + 256.0)
        pair = context_keys(train, k) * 256 + train[k:]
        self.pairs, self.pair_counts = np.unique(pair, return_counts=True)
        self.ctx, self.ctx_counts = np.unique(pair // 256, return_counts=True)

    @staticmethod
    def _lookup(table: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(table, keys), 0, len(table) - 1)
        return np.where(table[i] == keys, counts[i], 0)

    def pmi(self, row: np.ndarray) -> np.ndarray:
        """log p(x_t | x_{t-k:t}) - log p(x_t) for t >= k (NaN before)."""
        ctx = context_keys(row, self.k)
        nxt = row[self.k :]
        n_pair = self._lookup(self.pairs, self.pair_counts, ctx * 256 + nxt)
        n_ctx = self._lookup(self.ctx, self.ctx_counts, ctx)
        p = (n_pair + 256.0 * self.unigram[nxt]) / (n_ctx + 256.0)
        out = np.full(len(row), np.nan)
        out[self.k :] = np.log(p) - np.log(self.unigram[nxt])
        return out


def class_runs(x: torch.Tensor, blanks_start: bool = True) -> torch.Tensor:
    """A chunk ends on byte t when t starts a run: name bytes and blanks form runs, every other
    byte (newline, operator, quote) is a run of its own. With blanks_start=False a run of blanks
    starts no chunk: it joins the unit before it (`x = ` cuts as `x |= `)."""
    name = ~spacelike(x) | (x == ord("_")) | (x >= 0x80)
    blank = is_blank_byte(x)
    cls = torch.where(name, 1, torch.where(blank, 2, 0))
    b = torch.zeros_like(x, dtype=torch.bool)
    b[:, 1:] = (cls[:, 1:] != cls[:, :-1]) | (cls[:, 1:] == 0)
    if not blanks_start:
        b &= ~blank
    return b


def whitespace_rule(x: torch.Tensor) -> torch.Tensor:
    """The comparison's whitespace rule, cut by its own chunker (no position forced)."""
    return WhitespaceChunker()(None, torch.zeros_like(x, dtype=torch.bool), idx=x).b


def inside_text_units(x: torch.Tensor) -> torch.Tensor:
    """True on the bytes of a string or comment unit other than its first byte."""
    out = torch.zeros_like(x, dtype=torch.bool)
    for i, row in enumerate(x):
        for s, e, kind in token_units(bytes(row.tolist())):
            if kind in ("string", "comment"):
                out[i, s + 1 : e] = True
    return out


def bpe_rule(train_blocks: list[bytes], x: torch.Tensor, rate: float, pretokenize: str):
    """Cuts at the last byte of each token of a BPE trained on `train_blocks` and sized to `rate`
    on the windows `x` (each window tokenised on its own). Returns the mask and the fit."""
    fit = fit_bpe_sized_on(train_blocks, [row.numpy().astype(np.uint8).tobytes() for row in x], rate, pretokenize)
    return bpe_boundary_mask(fit.tokenizer, x), fit


def at_rate(score: np.ndarray, rate: float) -> torch.Tensor:
    """The highest-scoring share `rate` of positions (NaN never)."""
    finite = score[np.isfinite(score)]
    return torch.from_numpy(np.nan_to_num(score, nan=-np.inf) >= np.quantile(finite, 1 - rate))


def score(x: torch.Tensor, b: torch.Tensor, inside: torch.Tensor) -> dict[str, float]:
    """Rate, both precisions with their chance, and the share of the cuts that fall inside a
    string or comment unit (each one a miss: such a unit is one token however long)."""
    m = token_alignment(x, b)
    cuts = b[:, 1:-1]
    return {"rate": cuts.float().mean().item(), **{k: round(v, 4) for k, v in m.items() if "recall" not in k},
            "cuts_inside_text": round((cuts & inside[:, 1:-1]).sum().item() / max(1, cuts.sum().item()), 4)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", help="a folder with train.* and val.* files of Python sources")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--train-bytes", type=int, default=8_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bpe-bytes", type=int, default=4_000_000, help="train bytes for the BPE rules (0: none)")
    ap.add_argument("--out", help="write the result as JSON")
    args = ap.parse_args()
    train = np.asarray(load_eval_bytes(args.data, "train", args.train_bytes), dtype=np.int64)
    val = torch.as_tensor(load_eval_bytes(args.data, "val", args.windows * args.seq_len), dtype=torch.long)
    x = val[: len(val) // args.seq_len * args.seq_len].view(-1, args.seq_len)
    rules: dict[str, dict[str, float]] = {}
    gen = torch.Generator().manual_seed(args.seed)
    inside = inside_text_units(x)
    rules["iid@0.2"] = score(x, torch.rand(x.shape, generator=gen) < 0.2, inside)
    ws = whitespace_rule(x)
    rules["whitespace"] = score(x, ws, inside)
    ws_rate = rules["whitespace"]["rate"]
    for k in (1, 2, 3):
        counts = ContextCounts(train, k)
        low = -np.stack([counts.pmi(row.numpy()) for row in x])
        for rate in (ws_rate, 0.2):
            rules[f"low_pmi_k{k}@{rate:.3g}"] = score(x, at_rate(low, rate), inside)
    runs = class_runs(x)
    rules["class_runs"] = score(x, runs, inside)
    rules["class_runs_blanks_join_left"] = score(x, class_runs(x, blanks_start=False), inside)
    rules["class_runs_code_only"] = score(x, runs & ~inside, inside)
    if args.bpe_bytes:
        step = 1 << 16
        blocks = [train[i : i + step].astype(np.uint8).tobytes() for i in range(0, min(len(train), args.bpe_bytes), step)]
        for pretokenize in ("gpt2", "line"):
            for rate in (ws_rate, 0.2):
                b, fit = bpe_rule(blocks, x, rate, pretokenize)
                # an unreachable rate gives the lowest reachable one: two asks can name one rule
                name = f"bpe_{pretokenize}@{fit.rate:.3g}"
                rules[name] = {**score(x, b, inside), "vocab": fit.vocab_size, "asked_rate": round(rate, 4)}
    result = {"data": Path(args.data).name, "windows": len(x), "seq_len": args.seq_len,
              "command": f"python lab/scripts/token_alignment_rules.py DATA/{Path(args.data).name} --windows {args.windows}",
              "inside_string_or_comment": inside.float().mean().item(), "rules": rules}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
