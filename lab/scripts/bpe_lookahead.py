"""How far ahead BPE-guided cuts read: for windows of a corpus's val split, change one byte at t + k
and count how often any cut at or before t moves. A causal rule gives 0 at every k; a rule that
reads one byte ahead gives 0 from k = 2 on. The tokenizer is fitted as the study's `bpe` family
fits it (`fit_bpe_to_rate` on the training split, at the target rate).

    python lab/scripts/bpe_lookahead.py data/docs-en --out lab/results/rivals/bpe_lookahead.json
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a corpus folder with train and val splits")
    ap.add_argument("--rate", type=float, default=0.2, help="the tokenizer's target tokens per byte (the study's 0.2)")
    ap.add_argument("--sample-bytes", type=int, default=4_000_000, help="training bytes the tokenizer is fitted on")
    ap.add_argument("--windows", type=int, default=2000)
    ap.add_argument("--width", type=int, default=32, help="bytes per window; t is its middle")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--out", help="also write the result here (JSON, keyed by the corpus folder's name)")
    args = ap.parse_args(argv)
    t0 = time.time()
    corpus = load_corpus(args.data)
    fit = fit_bpe_to_rate(bytes(corpus.train.numpy()), args.rate, sample_bytes=args.sample_bytes)
    val = load_eval_bytes(args.data, "val").long()
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(val) - args.width, (args.windows,), generator=g)
    x = torch.stack([val[s:s + args.width] for s in starts.tolist()])
    t = args.width // 2 - 1
    if max(args.ks) >= args.width - t:
        sys.exit(f"bpe_lookahead: k up to {args.width - t - 1} fits a window of {args.width}")
    shares = {k: moved_share(fit.tokenizer, x, t, k) for k in args.ks}
    result = {"data": args.data, "rate": args.rate, "tokens_per_byte": fit.rate, "vocab": fit.vocab_size,
              "windows": args.windows, "width": args.width, "t": t, "moved_share": shares,
              "commit": git_commit(), "seconds": time.time() - t0,
              "command": " ".join(["python", "lab/scripts/bpe_lookahead.py", *(argv if argv is not None else sys.argv[1:])])}
    print("| byte changed | windows where a cut at or before t moves |\n|---|---:|")
    for k, share in shares.items():
        print(f"| t + {k} | {share:.1%} |")
    if args.out:  # one file for every corpus measured: this corpus's entry replaced
        out = Path(args.out)
        every = json.loads(out.read_text()) if out.is_file() else {}
        every[Path(args.data).name] = result
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(every, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
