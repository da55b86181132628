"""A prediction's score in one table: over the scored cells of a score file (a forecast's
`prediction_C<B>_score.json` or the held-out `prediction_score.json`), the median |error| in L*,
the mean signed error (measured or fitted minus predicted) with how many cells fall on each
side, how many predicted intervals hold the result, the median interval width, the naive
two-point rival's median |error|, the cells where the fitted law is the closer of the two and
where the two agree within 0.02 bpb, and, for a forecast, how many predicted N* intervals hold the
fitted optimum's size (a held-out run is built at the predicted N* itself, so there it says
nothing and is left blank). A cell without an interval counts in neither "inside" nor the widths.
One row for every cell, then, with `--kind GROUP`, the members of one of the grid's groups and
the rest (e.g. the hierarchies against the flat and BPE-token models). A group's own rows (a
group scored as its best member) repeat a member's runs and are left out of every row.

    python lab/scripts/scaling_score_summary.py --grid lab/scripts/scaling_cpu_grid.toml \\
        --score lab/results/scaling/prediction_C3e12_score.json --kind hierarchy
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rltok.analysis.scaling import load_grid

AGREE = 0.02  # bpb: the fitted law and the two-point rival "agree" within this


def summary_row(name: str, rows: list[dict]) -> str:
    """One markdown row over `rows` (scored cells)."""
    if not rows:
        return f"| {name} (0) | – | – | – | – | – | – | – | – |"
    errors = [r["error"] for r in rows]
    bounds = [r["prediction"].get("l_star_interval") or (None, None) for r in rows]
    widths = [hi - lo for lo, hi in bounds if lo is not None and hi is not None]
    judged = [r["within"] for r in rows if r.get("within") is not None]
    rival = [(r["error"], r["baseline_error"]) for r in rows if r.get("baseline_error") is not None]
    sized = [r["size_within"] for r in rows if "measured" not in r and r.get("size_within") is not None]
    above, below = sum(e > 0 for e in errors), sum(e < 0 for e in errors)
    cells = [f"{statistics.median(abs(e) for e in errors):.3f}",
             f"{statistics.fmean(errors):+.3f} ({above} above, {below} below)",
             f"{sum(judged)} of {len(judged)}" if judged else "–",
             f"{statistics.median(widths):.3f}" if widths else "–",
             f"{statistics.median(abs(b) for _, b in rival):.3f}" if rival else "–",
             f"{sum(abs(e) < abs(b) for e, b in rival)} of {len(rival)}" if rival else "–",
             f"{sum(abs(e - b) <= AGREE for e, b in rival)} of {len(rival)}" if rival else "–",
             f"{sum(sized)} of {len(sized)}" if sized else "–"]
    return f"| {name} ({len(rows)}) | " + " | ".join(cells) + " |"


def summary_table(scores: list[dict], groups: dict[str, list[str]], kind: str | None = None) -> str:
    """Markdown: every scored cell of the families (groups' own rows left out), then, with `kind`,
    its members and the rest; the cells left unscored counted under it."""
    family_rows = [s for s in scores if s["family"] not in groups]
    scored = [s for s in family_rows if s.get("error") is not None]
    lines = ["| cells | median \\|error\\| | mean error | inside | median interval width | two-point rival's "
             f"median \\|error\\| | law closer | agree within {AGREE} | N* inside |",
             "|---|---|---|---|---|---|---|---|---|", summary_row("all", scored)]
    if kind is not None:
        members = set(groups[kind])
        lines += [summary_row(kind, [s for s in scored if s["family"] in members]),
                  summary_row(f"not {kind}", [s for s in scored if s["family"] not in members])]
    unscored = len(family_rows) - len(scored)
    if unscored:
        lines += ["", f"{unscored} cells unscored: no measured optimum (every seed diverged, or the budget's "
                      "parabola has no minimum)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True, help="the study's grid file (its groups)")
    ap.add_argument("--score", required=True, type=Path, help="a score file written by rltok scaling --holdout")
    ap.add_argument("--kind", help="one of the grid's groups: its members and the rest get a row each")
    args = ap.parse_args(argv)
    groups = {g: list(m) for g, m in load_grid(args.grid).groups.items()}
    if args.kind is not None and args.kind not in groups:
        raise SystemExit(f"error: --kind {args.kind}: the grid's groups are {', '.join(groups) or 'none'}")
    if not args.score.is_file():
        raise SystemExit(f"error: {args.score}: no such score file (rltok scaling --holdout writes it)")
    scores = json.loads(args.score.read_text())["scores"]
    print(summary_table(scores, groups, args.kind))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
