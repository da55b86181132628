"""Did a boundary rule learn where to cut? From a study's packed records: each ladder run of one
family with its achieved test rate and whitespace alignment, against the mean alignment of another
family's ladder runs at the same budget (e.g. a rule whose cuts are known to be random), and how
many of the runs beat that mean by more than a margin and hold their rate near the target.

    python lab/scripts/rule_alignment.py --study rivals --family dpool --against gumbel --corpus docs-en --budgets 3e11 6e11 1e12
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from rltok_lab import records
from rltok_lab.tables_file import commanded_table


def ladder(study: str, corpus: str, family: str, budgets: list[float] | None, root: Path) -> dict[float, list[dict]]:
    """{budget: [ladder records of `family`, by size then seed]}, of the `budgets` given (default all)."""
    out: dict[float, list[dict]] = defaultdict(list)
    for _, rec in records.entries(study, corpus, root):
        if rec.get("family") == family and rec.get("point_kind") == "ladder" and not rec.get("excluded") and (
                budgets is None or float(rec["budget_flops"]) in budgets):
            out[float(rec["budget_flops"])].append(rec)
    return {b: sorted(rs, key=lambda r: (r["target_size"], r["seed"])) for b, rs in sorted(out.items())}


def rows(study: str, corpus: str, family: str, against: str, margin: float, target: float, rate_tol: float,
         budgets: list[float] | None = None, root: Path = records.RESULTS) -> tuple[list[str], list[str]]:
    """The per-budget summary and the per-run table, as markdown lines."""
    mine, theirs = ladder(study, corpus, family, budgets, root), ladder(study, corpus, against, budgets, root)
    if not mine:
        raise SystemExit(f"rule_alignment: no ladder record of family {family!r} on {corpus} in {study}")
    runs = ["| budget | N (target) | seed | test rate | whitespace alignment | − mean of " + against + " |",
            "|---|---:|---:|---:|---:|---:|"]
    summary = [f"| budget | runs | mean alignment of {against} | above it by > {margin} | rate within {rate_tol} of {target} |",
               "|---|---:|---:|---:|---:|"]
    for budget, recs in mine.items():
        ref = [r["space_align"] for r in theirs.get(budget, [])]
        base = sum(ref) / len(ref) if ref else float("nan")
        for r in recs:
            runs.append(f"| {budget:.0e} | {int(r['target_size']):,} | {r['seed']} | {r['rate']:.3f} | "
                        f"{r['space_align']:.3f} | {r['space_align'] - base:+.3f} |")
        above = sum(r["space_align"] - base > margin for r in recs)
        held = sum(abs(r["rate"] - target) <= rate_tol for r in recs)
        summary.append(f"| {budget:.0e} | {len(recs)} | {base:.3f} ({len(ref)} runs) | {above} | {held} |")
    return runs, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="rivals", help="a study folder under lab/results")
    ap.add_argument("--family", required=True)
    ap.add_argument("--against", required=True, help="the family whose mean alignment is the bar")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--budgets", type=float, nargs="+", help="only these budgets (default: every one recorded)")
    ap.add_argument("--root", type=Path, default=records.RESULTS, help="the results root holding the study")
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--target-rate", type=float, default=0.2)
    ap.add_argument("--rate-tol", type=float, default=0.03)
    ap.add_argument("--out", help="also write the tables here")
    args = ap.parse_args(argv)
    runs, summary = rows(args.study, args.corpus, args.family, args.against, args.margin, args.target_rate,
                         args.rate_tol, args.budgets, args.root)
    commanded_table("rule_alignment.py", argv if argv is not None else sys.argv[1:], summary + [""] + runs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
