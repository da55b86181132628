"""What does the lexicon prior itself prefer? Fit the unigram lexicon (objective/lexicon.py) to a corpus
by EM (every possible unit counted by its posterior probability, `LabLexicon.update_posterior`)
with no policy involved, then read its most probable unit ends on held-out windows: the
segmentation the minimum-description-length objective favours, independent of what a policy
can learn or how its gradient is estimated.

    .venv/bin/python lab/scripts/lexicon_segmentation.py DATA_DIR [--steps N] [--concentration A] [--code] [--base bigram]

With --unit-price P ..., also the fitted lexicon's least-cost segmentation with P nats per unit
(Viterbi, `LabLexicon.best_segmentation`): a negative price buys more units, which shows where
the lexicon puts cuts when more of them are asked for than it wants. With --whole-blank-runs, each
price is also read with a prior that keeps runs of blanks whole (30 nats more for a unit that ends
inside one, so only runs longer than the longest unit get split): where the surplus goes when it
cannot go into indentation.

Reports the unit-end rate, the share of unit ends on whitespace (space_align), and with --code
the share on Python lexical-token ends (token_end_precision, chance beside it), plus a sample.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab")]

from rltok_lab.lexicon_instruments import is_blank_byte  # noqa: E402
from rltok.data.corpus import load_eval_bytes  # noqa: E402
from rltok.eval.evaluate import whitespace_alignment  # noqa: E402
from rltok_lab.lexicon_instruments import LabLexicon  # noqa: E402
from rltok.data.python_tokens import token_alignment  # noqa: E402


def piped(row: torch.Tensor, ends: torch.Tensor) -> str:
    """The bytes with a | after each unit end."""
    return "".join(chr(c) + ("|" if e else "") for c, e in zip(row.tolist(), ends.tolist()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", help="a folder with train.* and val.* files")
    ap.add_argument("--steps", type=int, default=100, help="EM steps, one batch of windows each")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--concentration", type=float, default=100.0)
    ap.add_argument("--mean-len", type=float, default=5.0, help="the base model's mean unit length (1 / rate)")
    ap.add_argument("--base", choices=["unigram", "bigram"], default="unigram",
                    help="how the base distribution spells a unit's bytes (bigram: each byte given the one before)")
    ap.add_argument("--code", action="store_true", help="also report Python token-end precision")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--unit-price", type=float, nargs="*", default=[],
                    help="also the least-cost segmentation with this price per unit in nats (Viterbi; negative: "
                         "more units), one row per price: what the fitted lexicon makes of a higher rate")
    ap.add_argument("--whole-blank-runs", action="store_true",
                    help="with --unit-price: also each price with ends inside a run of blanks priced 30 nats more")
    ap.add_argument("--out", help="write the result as JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    train = torch.as_tensor(load_eval_bytes(args.data, "train", 8_000_000), dtype=torch.long)
    val = torch.as_tensor(load_eval_bytes(args.data, "val", 32 * args.seq_len), dtype=torch.long)
    val = val[: len(val) // args.seq_len * args.seq_len].view(-1, args.seq_len)
    lex = LabLexicon(concentration=args.concentration, mean_len=args.mean_len, base=args.base)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    for _ in range(args.steps):
        off = torch.randint(0, len(train) - args.seq_len, (args.batch,), generator=gen).tolist()
        lex.update_posterior(torch.stack([train[o : o + args.seq_len] for o in off]))
    ends = lex.unit_posteriors(val).sum(-1) > 0.5  # P(a unit ends at byte e) > 1/2
    command = f"python lab/scripts/lexicon_segmentation.py DATA/{Path(args.data).name} --steps {args.steps}" + \
        (f" --concentration {args.concentration:g}" if args.concentration != 100.0 else "") + (" --code" if args.code else "") \
        + (f" --base {args.base}" if args.base != "unigram" else "") \
        + (" --unit-price " + " ".join(f"{p:g}" for p in args.unit_price) if args.unit_price else "") \
        + (" --whole-blank-runs" if args.whole_blank_runs else "")
    result = {"data": Path(args.data).name, "command": command, "steps": args.steps, "concentration": args.concentration,
              "base": args.base,
              "rate": ends.float().mean().item(), "space_align": whitespace_alignment(val, ends)["space_align"],
              "seconds": time.time() - t0}
    if args.code:
        result.update(token_alignment(val, ends))
    result["priced"] = []
    blank = is_blank_byte(val)
    inside_run = torch.zeros_like(blank)
    inside_run[:, :-1] = blank[:, :-1] & blank[:, 1:]  # a unit ending here would split a run of blanks
    for price in args.unit_price:
        for whole in (False, True) if args.whole_blank_runs else (False,):
            best = lex.best_segmentation(val, price, end_cost=30.0 * inside_run.float() if whole else None)
            row = {"unit_price": price, "whole_blank_runs": whole, "rate": best.float().mean().item(),
                   "space_align": whitespace_alignment(val, best)["space_align"]}
            if args.code:
                row.update(token_alignment(val, best))
            row["sample"] = piped(val[0, :160], best[0, :160])
            result["priced"].append(row)
    result["sample"] = piped(val[0, :240], ends[0, :240])
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
