"""Fit the study's learning-rate rule from an LR sweep's records (lab/reports/SCALING.md, "Learning rate").

Each record's family is NAME_lr<rate> (lab/scripts/scaling_lr_grid_*.toml). Per family and size: the
rate with the lowest bpb and the parabola in log(lr) through the sweep's points (its minimum when
it lies inside the swept range); then one power law over every family and size,
log lr* = log lr_ref - exponent * log(N / n_ref), fitted by least squares on the parabola minima
(the measured best where the parabola has no interior minimum).

    python lab/scripts/scaling_lr_fit.py lab/results/scaling_lr/docs-en [--n-ref 5e4]
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

TAG = re.compile(r"^(?P<family>.+)_lr(?P<lr>[0-9.e+-]+)$")


def sweep_table(folder: Path) -> dict:
    """{(family, N): [(lr, bpb), ...]} from the records of a corpus folder."""
    points = defaultdict(list)
    for path in sorted(folder.glob("C*__*__N*__s*.json")):
        rec = json.loads(path.read_text())
        m = TAG.match(rec["family"])
        if m and rec.get("bpb") is not None:  # a diverged run has no loss (its file says why)
            points[(m["family"], rec["non_embedding_params"])].append((float(m["lr"]), rec["bpb"]))
    return {k: sorted(v) for k, v in points.items()}


def best_lr(pairs: list[tuple[float, float]]) -> tuple[float, bool]:
    """The parabola-in-log(lr) minimum when interior to the swept rates, else the best swept rate."""
    lrs, bpb = zip(*pairs)
    best = lrs[int(np.argmin(bpb))]
    if len(pairs) < 3:
        return best, False
    c2, c1, _ = np.polyfit(np.log(lrs), bpb, 2)
    if c2 <= 0:
        return best, False
    x = -c1 / (2 * c2)
    if not math.log(min(lrs)) < x < math.log(max(lrs)):
        return best, False
    return float(math.exp(x)), True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--n-ref", type=float, default=5e4)
    args = ap.parse_args()
    table = sweep_table(args.folder)
    xs, ys = [], []
    print("| family | N | bpb at each lr | best swept lr | fitted lr* | interior |")
    print("|---|---|---|---|---|---|")
    for (family, n), pairs in sorted(table.items()):
        lr, interior = best_lr(pairs)
        swept = min(pairs, key=lambda p: p[1])[0]
        cells = ", ".join(f"{b:.3f} @ {x:g}" for x, b in pairs)
        print(f"| {family} | {n:,} | {cells} | {swept:g} | {lr:.3g} | {'yes' if interior else 'no'} |")
        xs.append(math.log(n / args.n_ref))
        ys.append(math.log(lr))
    slope, intercept = np.polyfit(xs, ys, 1)
    resid = np.array(ys) - (slope * np.array(xs) + intercept)
    print(f"\nlr*(N) = {math.exp(intercept):.3g} * (N / {args.n_ref:g}) ** {-slope:.3f}  "
          f"(residual sd {resid.std(ddof=2):.2f} in log lr over {len(xs)} points)")


if __name__ == "__main__":
    main()
