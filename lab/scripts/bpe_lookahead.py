"""How far ahead BPE-guided cuts read: for windows of a corpus's val split, change one byte at t + k
and count how often any cut at or before t moves. A causal rule gives 0 at every k; a rule that
reads one byte ahead gives 0 from k = 2 on. The tokenizer is fitted as the study's `bpe` family
fits it (`fit_bpe_to_rate` on the training split, at the target rate).

    python lab/scripts/bpe_lookahead.py data/docs-en data/code-py --out lab/results/rivals/bpe_lookahead.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from rltok.analysis.compare import git_commit
from rltok.data import load_corpus, load_eval_bytes
from rltok.data.bpe import bpe_boundary_mask, fit_bpe_to_rate


def moved_share(tok, x: torch.Tensor, t: int, k: int) -> float:
    """The share of rows of `x` where changing byte t + k moves a cut at or before t."""
    y = x.clone()
    y[:, t + k] = torch.where(y[:, t + k] == ord("q"), ord("z"), ord("q"))
    before = bpe_boundary_mask(tok, x)[:, : t + 1]
    return float((bpe_boundary_mask(tok, y)[:, : t + 1] != before).any(1).float().mean())


def measure(data: str, args) -> dict:
    corpus = load_corpus(data)
    fit = fit_bpe_to_rate(bytes(corpus.train.numpy()), args.rate, sample_bytes=args.sample_bytes)
    val = load_eval_bytes(data, "val").long()
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(val) - args.width, (args.windows,), generator=g)
    x = torch.stack([val[s:s + args.width] for s in starts.tolist()])
    t = args.width // 2 - 1
    return {"tokens_per_byte": fit.rate, "vocab": fit.vocab_size, "t": t,
            "moved_share": {k: moved_share(fit.tokenizer, x, t, k) for k in args.ks}}


def markdown(result: dict) -> str:
    names = list(result["corpora"])
    lines = ["# How far ahead BPE-guided cuts read", "",
             f"Command: `{result['command']}` (commit {result['commit']})", "",
             f"The tokenizer fitted as the study's `bpe` family fits it (target rate {result['rate']:g}, "
             f"{result['sample_bytes']:,} training bytes); {result['windows']:,} val windows of {result['width']} "
             "bytes, t their middle byte, one byte changed at t + k: the share of windows where any cut at or "
             "before t moves. A causal rule gives 0 at every k; a rule that reads one byte ahead, 0 from k = 2.", "",
             "| corpus | tokens per byte | vocabulary |", "|---|---:|---:|"]
    lines += [f"| {c} | {r['tokens_per_byte']:.3f} | {r['vocab']:,} |" for c, r in result["corpora"].items()]
    lines += ["", "| byte changed | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for k in result["ks"]:
        lines.append(f"| t + {k} | " + " | ".join(f"{result['corpora'][c]['moved_share'][k]:.1%}" for c in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+", help="corpus folders with train and val splits")
    ap.add_argument("--rate", type=float, default=0.2, help="the tokenizer's target tokens per byte (the study's 0.2)")
    ap.add_argument("--sample-bytes", type=int, default=4_000_000, help="training bytes the tokenizer is fitted on")
    ap.add_argument("--windows", type=int, default=2000)
    ap.add_argument("--width", type=int, default=32, help="bytes per window; t is its middle")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--out", help="also write the result here: a table (.md) or JSON (any other name)")
    args = ap.parse_args(argv)
    if max(args.ks) >= args.width - (args.width // 2 - 1) or min(args.ks) < 1:
        sys.exit(f"bpe_lookahead: k from 1 to {args.width - args.width // 2} fits a window of {args.width}")
    t0 = time.time()
    result = {"rate": args.rate, "sample_bytes": args.sample_bytes, "windows": args.windows, "width": args.width,
              "ks": args.ks, "corpora": {Path(d).name: measure(d, args) for d in args.data},
              "commit": git_commit(), "seconds": time.time() - t0,
              "command": " ".join(["python", "lab/scripts/bpe_lookahead.py", *(argv if argv is not None else sys.argv[1:])])}
    text = markdown(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text if out.suffix == ".md" else json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
