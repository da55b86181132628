"""One family against others, each at its size chosen on the selection split, paired by seed, at
each budget, from a study's packed records: the verdicts the study's own tables do not make (its
crossovers fix which pairs they read), with Holm's correction over this table's rows. The sizes
chosen and the cells are the audit's (rltok_lab.audit), so a pair read here and there agree.

    python lab/scripts/paired_chosen.py --study rivals --corpus docs-en --family dpool --against gumbel uniform --budgets 3e11 6e11 1e12
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rltok_lab import audit, records
from rltok_lab.tables_file import commanded_table


def study_runs(study: str, corpus: str, root: Path) -> list[dict]:
    """The records a reading uses (`audit.is_read`)."""
    return [r for _, r in records.entries(study, corpus, root) if audit.is_read(r)]


def verdicts(runs: list[dict], corpus: str, family: str, against: list[str], budgets: list[float]) -> list[audit.Verdict]:
    out = []
    for budget in budgets:
        cells = audit.chosen_cells(runs, budget)
        for other in against:
            a, b = cells.get(family), cells.get(other)
            r = audit.paired(a.test, b.test) if a is not None and b is not None else None
            if r is None:
                out.append(audit.Verdict(corpus, budget, family, other, 0, float("nan"), float("nan"), float("nan"),
                                         1.0, flops="charged", note="no shared seeds at the chosen sizes"))
                continue
            note = f"N {int(a.size):,} vs {int(b.size):,}"
            out.append(audit.Verdict(corpus, budget, family, other, *r, flops="charged", note=note))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="rivals", help="a study folder under lab/results")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--against", nargs="+", required=True)
    ap.add_argument("--budgets", type=float, nargs="+", required=True)
    ap.add_argument("--root", type=Path, default=records.RESULTS, help="the results root holding the study")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    runs = study_runs(args.study, args.corpus, args.root)
    if not runs:
        raise SystemExit(f"paired_chosen: no scored record of {args.corpus} in {args.study}")
    table = audit.verdicts_table(verdicts(runs, args.corpus, args.family, args.against, args.budgets))
    commanded_table("paired_chosen.py", argv if argv is not None else sys.argv[1:], [table], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
