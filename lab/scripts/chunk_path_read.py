"""R53's prediction read from the instrument's sections (lab/results/rivals/chunk_path_use_3e12.md,
one section per corpus and session): per family, the seed-0 cells measured on one corpus and how many
raise val bpb by at least the threshold when every free cut is taken away, and which; beside them the
planned cells (every finished seed-0 ladder and extension run of the family at the budget, from the
packed records) that were never measured.

    python lab/scripts/chunk_path_read.py --corpus docs-en --families uniform rl rl_detach rl_w8 entropy gumbel \\
        uniform_ngram whitespace_ngram rl_ngram hnet --threshold 0.05 --threshold-for hnet=0.30
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rltok_lab import records
from rltok_lab.tables_file import commanded_table, sections

TABLE = Path("lab/results/rivals/chunk_path_use_3e12.md")


def measured(text: str, corpus: str) -> dict[str, float]:
    """{run name: the rise in val bpb with no free cut} over every section of `corpus`."""
    out = {}
    for name, body in sections(text).items():
        if name.split(",")[0].strip() != corpus:
            continue
        for line in body.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 6 and cells[0].startswith("C") and "__" in cells[0]:
                out[cells[0]] = float(cells[5])
    return out


def planned(entries: list[tuple[str, dict]], budget: float, families: list[str], seed: int = 0) -> list[str]:
    """The run names (their record files' stems) of the finished seed-`seed` ladder and extension
    runs of `families` at `budget`, from a study's (file, record) entries."""
    return sorted(Path(f).stem for f, r in entries if float(r["budget_flops"]) == budget and r["family"] in families
                  and int(r["seed"]) == seed and r.get("point_kind") in ("ladder", "extension") and r.get("bpb") is not None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--families", nargs="+", required=True)
    ap.add_argument("--budget", type=float, default=3e12)
    ap.add_argument("--threshold", type=float, default=0.05)
    ap.add_argument("--threshold-for", nargs="*", default=[], metavar="FAMILY=X", help="a family's own threshold")
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--study", default="rivals")
    ap.add_argument("--root", type=Path, default=records.RESULTS)
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    own = {}
    for item in args.threshold_for:
        family, _, x = item.partition("=")
        own[family] = float(x)
    got = measured(args.table.read_text(), args.corpus)
    plan = planned(records.entries(args.study, args.corpus, args.root), args.budget, args.families)
    rows = ["| family | threshold | cells measured | at or above | which (rise) | planned, not measured |",
            "|---|---:|---:|---:|---|---:|"]
    total = above_total = lost_total = 0
    for family in args.families:
        mine = {run: x for run, x in got.items() if run.split("__")[1] == family and run in plan}
        bar = own.get(family, args.threshold)
        above = {run: x for run, x in mine.items() if x >= bar}
        lost = sum(1 for run in plan if run.split("__")[1] == family and run not in got)
        which = ", ".join(f"N{run.split('__N')[1].split('__')[0]} {x:+.3f}" for run, x in sorted(above.items())) or "—"
        rows.append(f"| {family} | {bar:g} | {len(mine)} | {len(above)} | {which} | {lost} |")
        total, above_total, lost_total = total + len(mine), above_total + len(above), lost_total + lost
    rows += ["", f"{args.corpus}: {above_total} of {total} cells measured at or above their threshold; "
                 f"{lost_total} planned cells not measured."]
    commanded_table("chunk_path_read.py", argv if argv is not None else sys.argv[1:], rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
