"""How often the study's bootstrap intervals hold the truth: synthetic isoFLOP studies drawn from a
known law at a given design (budgets x sizes x seeds, noise), each fitted as the real study will be
(rltok.analysis.scaling_fit.fit_study), and the share of studies whose 95% interval contains the true
E, alpha, a, the per-budget optimal loss L* (at the middle budget) and the loss predicted at a
budget 10x past the largest fitted one.

    python scripts/scaling_fit_coverage.py --repeats 20 --seeds 2
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from rltok.analysis.scaling_fit import fit_study, predict

# the law: L*(C) = E + A C^-alpha, N*(C) = k C^a; runs at sizes N* e^f cost width * f^2 more
LAW = {"E": 1.5, "A": 80.0, "alpha": 0.15, "k": 0.05, "a": 0.5}


def loss_at(c: float) -> float:
    return LAW["E"] + LAW["A"] * c ** -LAW["alpha"]


def synthetic_runs(budgets, sizes: int, seeds: int, noise: float, width: float, rng) -> list[dict]:
    runs = []
    for c in budgets:
        n_star = LAW["k"] * c ** LAW["a"]
        for f in np.linspace(-1.2, 1.2, sizes):
            for s in range(seeds):
                runs.append({"family": "x", "non_embedding_params": n_star * math.exp(f), "budget_flops": c,
                             "seed": s, "split": "test", "bpb": loss_at(c) + width * f * f + noise * rng.standard_normal()})
    return runs


def covers(interval, value: float) -> bool:
    return interval[0] <= value <= interval[1]


def coverage(budgets, sizes: int, seeds: int, noise: float, width: float, repeats: int, n_boot: int) -> dict:
    """The share of `repeats` synthetic studies whose intervals hold each true value."""
    held_out = 10 * max(budgets)
    middle = budgets[len(budgets) // 2]
    hits = {"E": 0, "alpha": 0, "a": 0, "L*(middle budget)": 0, "prediction at 10x": 0}
    for t in range(repeats):
        runs = synthetic_runs(budgets, sizes, seeds, noise, width, np.random.default_rng(t))
        fit = fit_study(runs, n_boot=n_boot, seed=t)["x"]
        env = fit.envelope
        hits["E"] += covers(env.intervals["E"], LAW["E"])
        hits["alpha"] += covers(env.intervals["alpha"], LAW["alpha"])
        hits["a"] += covers(env.intervals["a"], LAW["a"])
        hits["L*(middle budget)"] += covers(fit.isofits[middle].l_star_interval, loss_at(middle))
        hits["prediction at 10x"] += covers(predict(env, held_out).l_star_interval, loss_at(held_out))
    return {k: v / repeats for k, v in hits.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[1e11, 3e11, 1e12, 3e12, 1e13])
    ap.add_argument("--sizes", type=int, default=5, help="sizes per budget, spread around the optimum")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.005, help="sd of a run's bpb around its expected value")
    ap.add_argument("--width", type=float, default=0.08, help="bpb cost of a size e^1 from the optimum")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--boot", type=int, default=200)
    args = ap.parse_args()
    result = coverage(sorted(args.budgets), args.sizes, args.seeds, args.noise, args.width, args.repeats, args.boot)
    print(json.dumps({"design": vars(args), "coverage_of_95pct_intervals": result}, indent=1))


if __name__ == "__main__":
    main()
