"""How far apart two seeds of one size land, per corpus, family and budget: the seed noise that sets
how many seeds a paired verdict needs. Each cell is the pooled within-size standard deviation of one
run's bpb (every size of the budget's ladder with two or more seeds, the seeds' spread about their
size's mean, pooled over sizes) with the number of sizes in brackets; "pooled" pools every budget,
and "median size" is the median of the sizes' own standard deviations (a few sizes whose seeds parted
early, often a budget's largest rung, weigh on the pooled value). Diverged runs are left out.

    python scripts/scaling_seed_noise.py --out docs/results/scaling
    python scripts/scaling_seed_noise.py --out docs/results/scaling --family flat flat_ngram --budget 3e11 1e12

`--opened K` then lists, per corpus, the K sizes whose seeds differ most, with each seed's validation
bpb at each sixth of its run (its record's curve) and the first sixth at which the spread between
the seeds reached half its final value: whether two seeds part early and stay apart (different runs) or
wander around one curve (noise at the last step). `--split select` reads the select split's bpb (val
in the CPU grid) instead of test. Writes nothing; prints markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from rltok.analysis.run_curve import SHARES, curve_at
from rltok.analysis.scaling import budget_tag, read_records
from rltok.analysis.table_cells import number


def size_runs(folder: Path, budget: float, families: list[str] | None) -> dict[tuple[str, str], dict[int, dict]]:
    """{(family, record stem without the seed): {seed: record}} at one budget; diverged runs left out."""
    out: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for path in sorted(Path(folder).glob(f"{budget_tag(budget)}__*__N*__s*.json")):
        r = json.loads(path.read_text())
        if r.get("bpb") is None or (families and r["family"] not in families):
            continue
        out[(r["family"], path.stem.rsplit("__s", 1)[0])][r["seed"]] = r
    return out


def pooled_sd(groups: list[list[float]]) -> tuple[float, int]:
    """The pooled within-group standard deviation and the number of groups with two or more values:
    sqrt(sum of squared deviations from each group's mean / sum of (n - 1))."""
    ss, dof, used = 0.0, 0, 0
    for g in groups:
        if len(g) < 2:
            continue
        m = sum(g) / len(g)
        ss += sum((x - m) ** 2 for x in g)
        dof += len(g) - 1
        used += 1
    return (math.sqrt(ss / dof) if dof else math.nan), used


def _key(split: str) -> str:
    return "bpb_select" if split == "select" else "bpb"


def noise_table(folder: Path, budgets: list[float], families: list[str] | None, split: str) -> list[str]:
    key = _key(split)
    groups: dict[str, dict[float, list[list[float]]]] = defaultdict(dict)
    for b in budgets:
        for (family, _), by_seed in size_runs(folder, b, families).items():
            vals = [r[key] for r in by_seed.values() if r.get(key) is not None]
            groups[family].setdefault(b, []).append(vals)
    lines = ["| family | " + " | ".join(budget_tag(b) for b in budgets) + " | pooled | median size |",
             "|---|" + "---|" * (len(budgets) + 2)]
    for family in sorted(groups):
        cells = []
        for b in budgets:
            sd, n = pooled_sd(groups[family].get(b, []))
            cells.append(f"{number(sd, '.3f')} ({n})" if n else "·")
        every = [g for b in budgets for g in groups[family].get(b, []) if len(g) >= 2]
        sd, n = pooled_sd(every)
        typical = statistics.median(pooled_sd([g])[0] for g in every) if every else math.nan
        lines.append(f"| {family} | " + " | ".join(cells) + f" | {number(sd, '.3f')} ({n}) | {number(typical, '.3f')} |")
    return lines


def val_spread(by_seed: dict[int, dict]) -> tuple[list[float], dict[int, list[float]], list[float]] | None:
    """Each seed's val bpb at each share of its run (`SHARES`) its record's curve reaches for every seed:
    (shares, {seed: val bpb at each}, spread between the seeds at each); None where there is no such share."""
    at = {s: [curve_at(r, x) for x in SHARES] for s, r in sorted(by_seed.items())}
    keep = [i for i in range(len(SHARES)) if all(v[i] is not None for v in at.values())]
    if not keep:
        return None
    at = {s: [v[i] for i in keep] for s, v in at.items()}
    gaps = [max(v[i] for v in at.values()) - min(v[i] for v in at.values()) for i in range(len(keep))]
    return [SHARES[i] for i in keep], at, gaps


def opened_at(shares: list[float], gaps: list[float]) -> float:
    """The first share of the run whose spread was half the final one or more."""
    return next(x for x, g in zip(shares, gaps) if g >= gaps[-1] / 2)


def opened_table(folder: Path, budgets: list[float], families: list[str] | None, split: str, k: int,
                 min_spread: float = 0.05) -> list[str]:
    key = _key(split)
    spreads = []
    for b in budgets:
        for (family, stem), by_seed in size_runs(folder, b, families).items():
            kept = {s: r for s, r in by_seed.items() if r.get(key) is not None}
            if len(kept) >= 2:
                vals = [r[key] for r in kept.values()]
                spreads.append((max(vals) - min(vals), b, family, stem, kept))
    lines = []
    for spread, b, family, stem, kept in sorted(spreads, key=lambda t: -t[0])[:k]:
        lines.append(f"**{stem}** ({family}, {budget_tag(b)}): {split} bpb "
                     + ", ".join(f"s{s} {r[key]:.3f}" for s, r in sorted(kept.items())) + f"; spread {spread:.3f}")
        found = val_spread(kept)
        if found is None:
            lines += ["", "(no validation curve in every seed's record)", ""]
            continue
        at_shares, at, gaps = found
        lines += ["", "| share of the run | " + " | ".join(f"s{s}" for s in at) + " | spread |",
                  "|---|" + "---|" * (len(at) + 1)]
        lines += [f"| {x:.2f} | " + " | ".join(f"{v[i]:.3f}" for v in at.values()) + f" | {gaps[i]:.3f} |"
                  for i, x in enumerate(at_shares)]
        lines += ["", f"half the final val spread ({gaps[-1]:.3f}) reached at {opened_at(at_shares, gaps):.0%} of the run", ""]
    shares = []
    for _, _, _, _, kept in spreads:
        found = val_spread(kept)
        if found is not None and found[2][-1] >= min_spread:
            shares.append(opened_at(found[0], found[2]))
    if shares:
        thirds = [sum(lo < x <= hi for x in shares) for lo, hi in ((0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1))]
        lines.append(f"Of the {len(shares)} sizes whose seeds end {min_spread} val bpb or more apart, half the final "
                     f"spread was there within the first third of the run in {thirds[0]}, the second in {thirds[1]}, "
                     f"the last in {thirds[2]}.\n")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the study's results folder (one subfolder per corpus)")
    ap.add_argument("--family", nargs="+", help="only these families (default: every family with records)")
    ap.add_argument("--budget", nargs="+", type=float, help="only these budgets (default: every budget with records)")
    ap.add_argument("--split", choices=("test", "select"), default="test")
    ap.add_argument("--opened", type=int, default=0, metavar="K",
                    help="the K sizes per corpus whose seeds differ most, with their val curves")
    args = ap.parse_args(argv)
    corpora = sorted(p for p in args.out.iterdir() if p.is_dir() and any(p.glob("C*__*__N*__s*.json")))
    if not corpora:
        raise SystemExit(f"no run records (C<budget>__<family>__N<size>__s<seed>.json) under {args.out}/<corpus>/")
    for corpus in corpora:
        budgets = args.budget or sorted({r["budget_flops"] for r in read_records(corpus, "C*__*__N*__s*.json")})
        print(f"## {corpus.name}\n")
        print("\n".join(noise_table(corpus, budgets, args.family, args.split)))
        print("\nPooled within-size sd of one run's bpb (sizes with 2+ seeds in brackets); median size: "
              "the median over sizes of each size's own sd.\n")
        if args.opened:
            print("\n".join(opened_table(corpus, budgets, args.family, args.split, args.opened)))


if __name__ == "__main__":
    main()
