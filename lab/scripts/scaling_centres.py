"""Where each family's size window should sit at a budget not yet run: per family and corpus its
optimal size at the finished budgets (the val parabola's N* where its optimum is interior, else the
best measured size), a straight line in log N against log C through them, and that line at the new
budget; the family's suggested centre is the geometric mean over the corpora (the corpora share one
ladder). Printed beside the grid rule's centre, with the `centres` lines to paste into the grid's
families (a decision to record in the lab notebook before the budget's first run).

    python lab/scripts/scaling_centres.py --grid lab/scripts/scaling_cpu_grid.toml --out lab/results/scaling \\
        --from 3e11 1e12 --at 3e12
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from rltok.analysis.scaling import load_grid, read_records
from rltok.analysis.scaling_fit import best_size_index, choice_records, fit_isoflop, profiles_from_records


def optimum(profile) -> tuple[float, str]:
    """(N*, how it was read): the parabola's where interior, else the best measured size."""
    if len(profile.sizes) >= 3:
        iso = fit_isoflop(profile, n_boot=0)
        if iso.interior and math.isfinite(iso.n_star):
            return float(iso.n_star), "fit"
    return float(profile.sizes[best_size_index(profile)]), "edge"


def extrapolate(points: list[tuple[float, float]], at: float) -> float:
    """The line through (log C, log N*) (least squares; one point: N* as C^0.5) at `at`."""
    c = np.log([p[0] for p in points])
    n = np.log([p[1] for p in points])
    slope, icpt = np.polyfit(c, n, 1) if len(points) > 1 else (0.5, n[0] - 0.5 * c[0])
    return float(np.exp(icpt + slope * math.log(at)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True)
    ap.add_argument("--out", required=True, help="the study's results folder")
    ap.add_argument("--from", dest="budgets", type=float, nargs="+", required=True, help="finished budgets")
    ap.add_argument("--at", type=float, required=True, help="the budget to centre")
    args = ap.parse_args(argv)
    grid = load_grid(args.grid)
    print("| family | corpus | N* at " + " | N* at ".join(f"{b:.3g}" for b in args.budgets)
          + f" | line at {args.at:.3g} |\n|---|---|" + "---|" * (len(args.budgets) + 1))
    snippet = []
    for fam in grid.families:
        lines = []
        for corpus in grid.corpora:
            folder = Path(args.out) / corpus
            profiles = profiles_from_records(choice_records(read_records(folder))).get(fam.name, {}) \
                if folder.is_dir() else {}
            found = [(b, *optimum(profiles[b])) for b in args.budgets if b in profiles]
            if not found:
                continue
            line = extrapolate([(b, n) for b, n, _ in found], args.at)
            lines.append(line)
            cells = {b: f"{n:,.0f} ({how})" for b, n, how in found}
            print(f"| {fam.name} | {corpus} | " + " | ".join(cells.get(b, "–") for b in args.budgets)
                  + f" | {line:,.0f} |")
        if lines and not fam.sizes:
            centre = float(np.exp(np.mean(np.log(lines))))
            rule = grid.size_rule.centre(args.at, fam.size_coef)
            print(f"| **{fam.name}** | centre | rule's {rule:,.0f} | suggested {centre:,.0f} "
                  f"({centre / rule:.2f}x) |" + " |" * (len(args.budgets) - 1))
            snippet.append(f'{fam.name}: centres = {{"{args.at:g}" = {centre:.3g}}}')
    print("\n" + "\n".join(snippet))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
