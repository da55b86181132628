"""How well does a budget's machine time foretell the next one's? From a study's packed records, the
runs of one budget (`--to`) timed two ways from the runs of an earlier one (`--from`), per family:
its mean seconds per run times the budget ratio (what the status estimates for a budget's ladder
before its first run), and its seconds per training FLOP fitted as a power of N at its own size
(`scaling_status.per_flop_seconds`, what it estimates for a held-out run), each against the
measured sum. Trains nothing.

    python lab/scripts/time_estimate_backtest.py --study rivals --corpus docs-en --from 1e12 --to 3e12
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rltok_lab import records
from rltok_lab.scaling_status import run_seconds, per_flop_seconds, timed_runs
from rltok_lab.tables_file import commanded_table


def timed(rs: list[dict], budget: float) -> list[dict]:
    """The study's own scored runs at `budget` that have a time (`scaling_status.timed_runs`)."""
    return timed_runs([r for r in rs if float(r["budget_flops"]) == budget])


def backtest(rs: list[dict], before: float, after: float) -> dict:
    """{"runs", "measured", "mean_ratio", "per_flop"}: seconds at `after`, measured and estimated
    from `before`'s runs (families without runs at `before` left out of all three)."""
    old, new = timed(rs, before), timed(rs, after)
    out = {"runs": 0, "measured": 0.0, "mean_ratio": 0.0, "per_flop": 0.0}
    for fam in sorted({r["family"] for r in new}):
        mine_old = [r for r in old if r["family"] == fam]
        if not mine_old:
            continue
        mean = sum(map(run_seconds, mine_old)) / len(mine_old)
        fit = per_flop_seconds(mine_old, before)
        for r in (r for r in new if r["family"] == fam):
            out["runs"] += 1
            out["measured"] += run_seconds(r)
            out["mean_ratio"] += mean * after / before
            out["per_flop"] += fit(float(r["non_embedding_params"])) * after if fit else mean * after / before
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="rivals", help="a study folder under lab/results")
    ap.add_argument("--corpus", nargs="+", required=True)
    ap.add_argument("--from", dest="before", type=float, required=True)
    ap.add_argument("--to", dest="after", type=float, required=True)
    ap.add_argument("--root", type=Path, default=records.RESULTS, help="the results root holding the study")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    rows = ["| corpus | runs | measured h | mean x budget ratio h | per-FLOP fit on N h |", "|---|---:|---:|---:|---:|"]
    for corpus in args.corpus:
        b = backtest([r for _, r in records.entries(args.study, corpus, args.root)], args.before, args.after)
        if not b["runs"]:
            raise SystemExit(f"time_estimate_backtest: no timed run of {corpus} at both budgets in {args.study}")
        m = b["measured"]
        rows.append(f"| {corpus} | {b['runs']} | {m / 3600:.2f} | {b['mean_ratio'] / 3600:.2f} "
                    f"({b['mean_ratio'] / m - 1:+.0%}) | {b['per_flop'] / 3600:.2f} ({b['per_flop'] / m - 1:+.0%}) |")
    commanded_table("time_estimate_backtest.py", argv if argv is not None else sys.argv[1:], rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
