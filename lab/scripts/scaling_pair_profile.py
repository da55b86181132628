"""Two families of one study paired along the whole isoFLOP profile, not only at their best sizes:
at each budget, every rung both ran (the same shape: width and depth) and every seed both ran there,
A − B in test bpb; per rung the mean over its seeds, then per corpus and over
both corpora the mean of every (rung, seed) difference with a t interval. It answers whether a
difference between the families holds at every size or only where each side's best size fell
(the report's paired verdicts), e.g. learned against uniform cuts (same ladder, same shapes):

    python lab/scripts/scaling_pair_profile.py --out lab/results/scaling --a rl --b uniform --budget 1e12

Pooled two ways: every (rung, seed) difference as one sample (rungs with more seeds, such as each
side's best size with its verdict seeds, weigh more), and the rungs' means as one sample (each
rung once: the profile as a whole). Where the rungs disagree both are wide, which is the point.
Rungs are matched by shape, not by the size target that produced it: a budget whose ladder windows
were centred on each family's own optimum gives the two families different targets that land on the
same shapes. A diverged run's record has no shape; it takes the shape its family's finished runs of
the same target have (the shape rule is deterministic), or, where every seed of that rung diverged,
stays keyed by its target. Seeds where either side diverged are left out and counted. Writes
nothing; prints markdown.

`--along` adds, per corpus and over every budget given, A − B in validation bpb at each sixth of the
paired runs' training FLOPs (their records' curves): whether a difference opens early and stays, or
grows along the run.

    python lab/scripts/scaling_pair_profile.py --out lab/results/scaling --a rl --b uniform \
        --budget 1e11 3e11 6e11 1e12 --along
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from rltok.analysis.paired_stats import mean_interval
from rltok_lab.run_curve import SHARES, curve_at
from rltok.analysis.scaling import budget_tag, read_records
from rltok.analysis.scaling_fit import record_shape


def rung_keys(records: list[dict]) -> dict[int, str]:
    """{id(record): the key two families' runs are paired on}, over one budget's records: the
    run's shape; for a diverged run (no shape in its record), the shape of a finished run of the
    same family and size target, else its target."""
    shapes = {(r["family"], r["target_size"]): record_shape(r) for r in records if record_shape(r)}
    return {id(r): record_shape(r) or shapes.get((r["family"], r["target_size"]))
            or f"target {r['target_size']:,.0f}" for r in records}


def profile_pairs(folder: Path, a: str, b: str, budget: float) -> tuple[dict, int]:
    """({rung: (A's N, B's N, {seed: A − B})} over the rungs and seeds both ran, ordered by A's N;
    the number of shared (rung, seed) pairs left out because a side diverged)."""
    tag = budget_tag(budget)
    records = [r for fam in (a, b) for r in read_records(folder, f"{tag}__{fam}__N*__s*.json")]
    key = rung_keys(records)
    runs = defaultdict(dict)
    for r in records:
        runs[(r["family"], key[id(r)])][r["seed"]] = r
    out, diverged = {}, 0
    for (fam, key), seeds in sorted(runs.items(), key=lambda kv: min(r["target_size"] for r in kv[1].values())):
        other = runs.get((b, key))
        if fam != a or not other:
            continue
        shared = sorted(set(seeds) & set(other))
        ok = [s for s in shared if seeds[s].get("bpb") is not None and other[s].get("bpb") is not None]
        diverged += len(shared) - len(ok)
        if ok:
            out[key] = (seeds[ok[0]]["non_embedding_params"], other[ok[0]]["non_embedding_params"],
                        {s: seeds[s]["bpb"] - other[s]["bpb"] for s in ok})
    return out, diverged


def along_run(folder: Path, a: str, b: str, budgets: list[float]) -> tuple[list[list[float]], int]:
    """A − B in val bpb at each share of the run (`SHARES`, read off each record's curve), one list per
    share, over every (budget, rung, seed) both ran; a pair whose curves do not reach a share is left
    out of that share. Also the number of shared (budget, rung, seed) pairs left out because a side
    diverged."""
    columns: list[list[float]] = [[] for _ in SHARES]
    diverged = 0
    for budget in budgets:
        tag = budget_tag(budget)
        records = [r for fam in (a, b) for r in read_records(folder, f"{tag}__{fam}__N*__s*.json")]
        key = rung_keys(records)
        recs = {(r["family"], key[id(r)], r["seed"]): r for r in records}
        for (fam, key, seed), ra in sorted(recs.items()):
            rb = recs.get((b, key, seed))
            if fam != a or rb is None:
                continue
            if ra.get("bpb") is None or rb.get("bpb") is None:
                diverged += 1
                continue
            for col, share in zip(columns, SHARES):
                va, vb = curve_at(ra, share), curve_at(rb, share)
                if va is not None and vb is not None:
                    col.append(va - vb)
    return columns, diverged


def _interval(values: list[float]) -> str:
    if len(values) < 2:
        return "–"
    mean, lo, hi = mean_interval(values)
    return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] ({len(values)})"


def pooled(name: str, pairs: list[float], rungs: list[float]) -> str:
    return f"| {name} | {_interval(pairs)} | {_interval(rungs)} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the study's results folder (one subfolder per corpus)")
    ap.add_argument("--a", required=True, help="family A")
    ap.add_argument("--b", required=True, help="family B")
    ap.add_argument("--budget", type=float, required=True, nargs="+")
    ap.add_argument("--along", action="store_true",
                    help="A − B in val bpb at each sixth of the paired runs' training FLOPs (their records' curves)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    corpora = sorted(p.name for p in out.iterdir() if p.is_dir() and any(p.glob("C*__*.json")))
    for budget in args.budget:
        print(f"\n### {args.a} − {args.b} at {budget:.3g} FLOPs (test bpb, paired by rung and seed)\n")
        print(f"| corpus | shape | N of {args.a} / {args.b} | seeds | mean A − B "
              "| per seed |\n|---|---|---|---|---|---|")
        every, means, lost = defaultdict(list), defaultdict(list), 0
        for corpus in corpora:
            pairs, diverged = profile_pairs(out / corpus, args.a, args.b, budget)
            lost += diverged
            for key, (n_a, n_b, diffs) in pairs.items():
                values = list(diffs.values())
                every[corpus] += values
                means[corpus].append(sum(values) / len(values))
                per_seed = ", ".join(f"s{s} {d:+.3f}" for s, d in diffs.items())
                print(f"| {corpus} | {key} | {n_a:,} / {n_b:,} | {len(values)} "
                      f"| {means[corpus][-1]:+.3f} | {per_seed} |")
        if not every:
            print("\nno rung was run by both families at this budget")
            continue
        if lost:
            print(f"\n{lost} shared (rung, seed) pairs left out: a side diverged")
        print("\n| pooled | (rung, seed) pairs: mean A − B [95% t] (count) | rung means: mean [95% t] (rungs) |"
              "\n|---|---|---|")
        for corpus in every:
            print(pooled(corpus, every[corpus], means[corpus]))
        if len(every) > 1:
            print(pooled("both corpora", [v for c in every for v in every[c]], [m for c in means for m in means[c]]))
    if args.along:
        print(f"\n### {args.a} − {args.b} along the run (val bpb at each sixth of the training FLOPs, every "
              f"rung and seed of {', '.join(budget_tag(b) for b in args.budget)} both ran)\n")
        print("| corpus | " + " | ".join(f"{k}/6" for k in range(1, len(SHARES) + 1)) + " |\n|---|"
              + "---|" * len(SHARES))
        lost = 0
        for corpus in corpora:
            columns, diverged = along_run(out / corpus, args.a, args.b, args.budget)
            lost += diverged
            print(f"| {corpus} | " + " | ".join(_interval(col) for col in columns) + " |")
        if lost:
            print(f"\n{lost} shared (rung, seed) pairs left out: a side diverged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
