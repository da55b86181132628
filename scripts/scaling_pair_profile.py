"""Two families of one study paired along the whole isoFLOP profile, not only at their best sizes:
at each budget, every rung both ran (the same size target) and every seed both ran there, A − B
in test bpb; per rung the mean over its seeds (with the rung's shape), then per corpus and over
both corpora the mean of every (rung, seed) difference with a t interval. It answers whether a
difference between the families holds at every size or only where each side's best size fell
(the report's paired verdicts), e.g. learned against uniform cuts (same ladder, same shapes):

    python scripts/scaling_pair_profile.py --out docs/results/scaling --a rl --b uniform --budget 1e12

The pooled interval treats the (rung, seed) differences as one sample: where the rungs disagree it
is wide, which is the point. Writes nothing; prints markdown.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from rltok.analysis.paired_stats import paired_difference
from rltok.analysis.scaling import budget_tag, read_records


def shape(rec: dict) -> str:
    """The rung's width/depth as the ladder built it (the hierarchy: byte/chunk width, main depth)."""
    c = rec.get("config", {}).get("model", {})
    if c.get("arch") == "hourglass":
        return f"{c.get('d_byte')}/{c.get('d_chunk')} x{c.get('main_layers')}"
    return f"{rec.get('width')} x{rec.get('depth')}"


def profile_pairs(folder: Path, a: str, b: str, budget: float) -> dict:
    """{target size: (shape of A's rung, {seed: A − B})} over the rungs and seeds both ran."""
    tag = budget_tag(budget)
    runs = defaultdict(dict)
    for fam in (a, b):
        for r in read_records(folder, f"{tag}__{fam}__N*__s*.json"):
            if r.get("bpb") is not None:
                runs[(fam, r["target_size"])][r["seed"]] = r
    out = {}
    for (fam, target), seeds in sorted(runs.items()):
        other = runs.get((b, target))
        if fam != a or not other:
            continue
        diffs = {s: seeds[s]["bpb"] - other[s]["bpb"] for s in sorted(set(seeds) & set(other))}
        if diffs:
            out[target] = (shape(next(iter(seeds.values()))), diffs)
    return out


def pooled(name: str, diffs: list[float]) -> str:
    pd = paired_difference(diffs, [0.0] * len(diffs))
    return f"| {name} | {len(diffs)} | {pd.mean:+.3f} [{pd.lo:+.3f}, {pd.hi:+.3f}] |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the study's results folder (one subfolder per corpus)")
    ap.add_argument("--a", required=True, help="family A")
    ap.add_argument("--b", required=True, help="family B")
    ap.add_argument("--budget", type=float, required=True, nargs="+")
    args = ap.parse_args(argv)
    out = Path(args.out)
    corpora = sorted(p.name for p in out.iterdir() if p.is_dir() and any(p.glob("C*__*.json")))
    for budget in args.budget:
        print(f"\n### {args.a} − {args.b} at {budget:.3g} FLOPs (test bpb, paired by rung and seed)\n")
        print("| corpus | target N | shape of " + args.a + " | seeds | mean A − B | per seed |\n|---|---|---|---|---|---|")
        every = defaultdict(list)
        for corpus in corpora:
            for target, (form, diffs) in profile_pairs(out / corpus, args.a, args.b, budget).items():
                values = list(diffs.values())
                every[corpus] += values
                per_seed = ", ".join(f"{d:+.3f}" for d in values)
                print(f"| {corpus} | {target:,.0f} | {form} | {len(values)} | {sum(values) / len(values):+.3f} "
                      f"| {per_seed} |")
        if not every:
            print("\nno rung was run by both families at this budget")
            continue
        print("\n| pooled over rungs and seeds | pairs | mean A − B [95% t interval] |\n|---|---|---|")
        for corpus, values in every.items():
            if len(values) > 1:
                print(pooled(corpus, values))
        both = [v for values in every.values() for v in values]
        if len(every) > 1 and len(both) > 1:
            print(pooled("both corpora", both))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
