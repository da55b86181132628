"""Does cutting at words cost? At one budget, the runs of some families at each family's size chosen
on the selection split (the audit's cells), split by their whitespace alignment: those at or above
`--high` against those below `--low`, with each group's mean scored bpb. Runs between the two
thresholds belong to neither group. Nothing is read where every run falls on one side.

    python lab/scripts/alignment_groups.py --corpus docs-en --budget 3e12 --families rl rl_detach --high 0.85 --low 0.6
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from rltok.analysis.scaling_fit import record_family, record_size
from rltok_lab import audit, records
from rltok_lab.tables_file import commanded_table


def chosen_runs(runs: list[dict], budget: float, families: list[str]) -> list[dict]:
    """The records of `families` at their val-chosen sizes at `budget`, every seed. Raises SystemExit
    naming a family with no record there."""
    mine = [r for r in runs if float(r["budget_flops"]) == budget and record_family(r) in families]
    cells = audit.chosen_cells(mine, budget)
    if missing := [f for f in families if f not in cells]:
        raise SystemExit(f"alignment_groups: no scored record of {', '.join(missing)} at {budget:.0e}")
    return [r for r in mine if record_size(r) == cells[record_family(r)].size]


def groups(runs: list[dict], high: float, low: float) -> dict[str, list[dict]]:
    """{"high": alignment >= high, "low": alignment < low} of the runs that report an alignment."""
    aligned = [r for r in runs if r.get("space_align") is not None]
    return {"high": [r for r in aligned if r["space_align"] >= high], "low": [r for r in aligned if r["space_align"] < low]}


def table(runs: list[dict], high: float, low: float) -> list[str]:
    rows = ["| family | N | seed | whitespace alignment | rate | test bpb | group |", "|---|---:|---:|---:|---:|---:|---|"]
    split = groups(runs, high, low)
    member = {id(r): g for g, rs in split.items() for r in rs}
    for r in sorted(runs, key=lambda r: (record_family(r), int(r["seed"]))):
        rate = f"{r['rate']:.3f}" if r.get("rate") is not None else "—"
        align = f"{r['space_align']:.2f}" if r.get("space_align") is not None else "—"
        rows.append(f"| {record_family(r)} | {record_size(r):,.0f} | {r['seed']} | {align} | {rate} | {r['bpb']:.4f} | "
                    f"{member.get(id(r), 'neither')} |")
    out = ["\n".join(rows), ""]
    if split["high"] and split["low"]:
        hi, lo = (float(np.mean([r["bpb"] for r in split[g]])) for g in ("high", "low"))
        out.append(f"Alignment ≥ {high}: {len(split['high'])} runs, mean test bpb {hi:.4f}; below {low}: "
                   f"{len(split['low'])} runs, mean {lo:.4f}; high − low {hi - lo:+.4f}.")
    else:
        out.append(f"Every run with an alignment falls on one side (≥ {high}: {len(split['high'])}, "
                   f"< {low}: {len(split['low'])}): nothing is read.")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="rivals", help="a study folder under lab/results")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--budget", type=float, required=True)
    ap.add_argument("--families", nargs="+", required=True)
    ap.add_argument("--high", type=float, default=0.85)
    ap.add_argument("--low", type=float, default=0.6)
    ap.add_argument("--root", type=Path, default=records.RESULTS, help="the results root holding the study")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    if args.low > args.high:
        raise SystemExit(f"alignment_groups: --low {args.low} is above --high {args.high}")
    runs = [r for _, r in records.entries(args.study, args.corpus, args.root) if audit.is_read(r)]
    picked = chosen_runs(runs, args.budget, args.families)
    commanded_table("alignment_groups.py", argv if argv is not None else sys.argv[1:],
                    table(picked, args.high, args.low), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
