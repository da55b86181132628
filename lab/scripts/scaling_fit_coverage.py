"""How often the study's bootstrap intervals hold the truth: synthetic isoFLOP studies drawn from a
known law at a given design (budgets x sizes x seeds, noise), each fitted as the real study will be
(rltok.analysis.scaling_fit.fit_study), and the share of studies whose 95% interval contains the true
E, alpha, a, the per-budget optimal loss L* (at the middle budget) and the loss predicted at a
budget past the largest fitted one (10x by default), with the prediction's typical error and
interval width.

    python lab/scripts/scaling_fit_coverage.py --repeats 20 --seeds 2
    # the CPU study as it will be fitted: three budgets with interior optima, its seed noise and
    # curvature, a near power law as its losses so far suggest, the held-out budget at 3.33x
    python lab/scripts/scaling_fit_coverage.py --budgets 3e11 1e12 3e12 --holdout-factor 3.33 \
        --noise 0.03 --width 0.3 --law 0 78.6 0.12 --repeats 40
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


def set_law(e: float, a: float, alpha: float) -> None:
    LAW.update(E=e, A=a, alpha=alpha)


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


def coverage(budgets, sizes: int, seeds: int, noise: float, width: float, repeats: int, n_boot: int,
             factor: float = 10.0) -> dict:
    """The share of `repeats` synthetic studies whose intervals hold each true value, and the held-out
    prediction's median absolute error and median interval width (bpb)."""
    held_out = factor * max(budgets)
    middle = budgets[len(budgets) // 2]
    at = f"prediction at {factor:g}x"
    hits = {"E": 0, "alpha": 0, "a": 0, "L*(middle budget)": 0, at: 0}
    errors, widths = [], []
    for t in range(repeats):
        runs = synthetic_runs(budgets, sizes, seeds, noise, width, np.random.default_rng(t))
        fit = fit_study(runs, n_boot=n_boot, seed=t)["x"]
        env = fit.envelope
        hits["E"] += covers(env.intervals["E"], LAW["E"])
        hits["alpha"] += covers(env.intervals["alpha"], LAW["alpha"])
        hits["a"] += covers(env.intervals["a"], LAW["a"])
        hits["L*(middle budget)"] += covers(fit.isofits[middle].l_star_interval, loss_at(middle))
        pred = predict(env, held_out)
        hits[at] += covers(pred.l_star_interval, loss_at(held_out))
        errors.append(abs(pred.l_star - loss_at(held_out)))
        widths.append(pred.l_star_interval[1] - pred.l_star_interval[0])
    return {**{k: v / repeats for k, v in hits.items()},
            f"{at}: median |error|": float(np.median(errors)), f"{at}: median interval width": float(np.median(widths))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[1e11, 3e11, 1e12, 3e12, 1e13])
    ap.add_argument("--sizes", type=int, default=5, help="sizes per budget, spread around the optimum")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.005, help="sd of a run's bpb around its expected value")
    ap.add_argument("--width", type=float, default=0.08, help="bpb cost of a size e^1 from the optimum")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--holdout-factor", type=float, default=10.0, help="the held-out budget / the largest fitted")
    ap.add_argument("--law", type=float, nargs=3, metavar=("E", "A", "ALPHA"),
                    default=[LAW["E"], LAW["A"], LAW["alpha"]], help="the true L*(C) = E + A C^-alpha")
    args = ap.parse_args()
    set_law(*args.law)
    result = coverage(sorted(args.budgets), args.sizes, args.seeds, args.noise, args.width, args.repeats, args.boot,
                      args.holdout_factor)
    print(json.dumps({"design": vars(args), "coverage_of_95pct_intervals": result}, indent=1))


if __name__ == "__main__":
    main()
