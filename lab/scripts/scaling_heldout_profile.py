"""More sizes at a held-out budget, read against the held-out runs at the predicted size.

The held-out test runs each family at the size its envelope predicts; a miss in L* there can be the
law or the size. A second folder of runs at other sizes of the same families and budget (run by
its own grid, seeds shared with the held-out runs) answers which: per corpus and family, each size's
val and test bpb over the seeds both folders ran, the size chosen on val, and its test bpb minus the
predicted size's, paired by seed. Then one group (e.g. the best hierarchy) against one family
(e.g. flat bytes), paired by seed: the group's member and size, and the family's size, each chosen
on val among their runs at that budget, before the extra sizes (held-out runs only) and with them.

    python lab/scripts/scaling_heldout_profile.py --grid lab/scripts/scaling_cpu_grid.toml \\
        --study lab/results/scaling --profile lab/results/scaling_1e13_profile \\
        --budget 1e13 --group hierarchy --against flat
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections import defaultdict
from pathlib import Path

from rltok.analysis.paired_stats import paired_difference
from rltok.analysis.scaling import load_grid, read_records
from rltok_lab.scaling_summary import format_difference


def by_size(records: list[dict], budget: float) -> dict:
    """{(family, N): {seed: record}} of the finished runs at `budget`."""
    out: dict = defaultdict(dict)
    for r in records:
        if r.get("budget_flops") == budget and r.get("bpb") is not None:
            out[r["family"], int(r["non_embedding_params"])][r["seed"]] = r
    return out


def mean_of(runs: dict, seeds, key: str) -> float:
    return statistics.fmean(runs[s][key] for s in seeds)


def choose(cands: dict, seeds) -> tuple:
    """The (family, N) of `cands` ({(family, N): {seed: record}}) with the lowest mean val bpb over
    `seeds`; candidates that lack one of those seeds are not eligible."""
    ok = {k: v for k, v in cands.items() if all(s in v for s in seeds)}
    if not ok:
        raise SystemExit(f"no candidate ran every one of the seeds {sorted(seeds)}")
    return min(ok, key=lambda k: mean_of(ok[k], seeds, "bpb_select"))


def fmt(d) -> str:
    """A PairedDifference as the study's tables write one: `mean [lo, hi] (seeds)`."""
    return format_difference(dataclasses.asdict(d))


def family_table(corpus: str, fam: str, held: dict, extra: dict, seeds) -> list[str]:
    """Markdown rows for one family: every size (held-out marked), the val choice, paired gains."""
    cands = {k: v for k, v in {**held, **extra}.items() if k[0] == fam}
    held_keys = [k for k in held if k[0] == fam]
    if not held_keys or not any(k[0] == fam for k in extra):
        return []
    base = held_keys[0]
    best = choose(cands, seeds)
    rows = []
    for key in sorted(cands, key=lambda k: k[1]):
        runs = cands[key]
        shared = [s for s in seeds if s in runs]
        r0 = runs[shared[0]] if shared else next(iter(runs.values()))
        shape = f"{r0.get('width', '?')} × {r0.get('depth', '?')}"
        if len(shared) < len(seeds):
            rows.append(f"| {corpus} | {fam} | {shape} | {key[1]:,} | – | – | missing seeds | |")
            continue
        gain = "(the predicted size)" if key == base else fmt(paired_difference(
            {s: runs[s]["bpb"] for s in seeds}, {s: cands[base][s]["bpb"] for s in seeds}))
        steps = r0.get("steps", "–")
        rows.append(f"| {corpus} | {fam} | {shape} | {key[1]:,} | {steps} | {mean_of(runs, seeds, 'bpb_select'):.4f} | "
                    f"{mean_of(runs, seeds, 'bpb'):.4f} | {gain}{' **chosen on val**' if key == best else ''} |")
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", required=True, help="the study's grid (its groups and corpora)")
    ap.add_argument("--study", required=True, help="the study's results folder (the held-out runs)")
    ap.add_argument("--profile", required=True, help="the folder of runs at more sizes")
    ap.add_argument("--budget", type=float, default=1e13)
    ap.add_argument("--group", default="hierarchy", help="a group of the grid, chosen on val")
    ap.add_argument("--against", default="flat", help="the family the group is compared with")
    args = ap.parse_args(argv)
    grid = load_grid(args.grid)
    if args.group not in grid.groups:
        raise SystemExit(f"no group {args.group!r} in {args.grid}; its groups: {', '.join(grid.groups) or 'none'}")
    members = set(grid.groups[args.group])
    family_rows, group_rows = [], []
    before, after = {}, {}  # (corpus, seed) -> group − family: the pooled rows' pairs
    for corpus in grid.corpora:
        held = by_size(read_records(Path(args.study) / corpus), args.budget)
        extra = by_size(read_records(Path(args.profile) / corpus), args.budget)
        if not extra:
            continue
        seeds = sorted({s for runs in extra.values() for s in runs})
        for fam in sorted({k[0] for k in extra}):
            family_rows += family_table(corpus, fam, held, extra, seeds)
        if not any(k[0] == args.against for k in held):
            raise SystemExit(f"{corpus}: {args.against} has no held-out run at {args.budget:g}")
        for label, pool, out in (("held-out sizes only", held, before), ("with the extra sizes", {**held, **extra}, after)):
            key = choose({k: v for k, v in pool.items() if k[0] in members}, seeds)
            other = choose({k: v for k, v in pool.items() if k[0] == args.against}, seeds)
            runs, base = pool[key], pool[other]
            d = paired_difference({s: runs[s]["bpb"] for s in seeds}, {s: base[s]["bpb"] for s in seeds})
            out.update({(corpus, s): runs[s]["bpb"] - base[s]["bpb"] for s in seeds})
            group_rows.append(f"| {corpus} | {label} | {key[0]} at {key[1]:,} | {other[1]:,} | {fmt(d)} |")
    if not family_rows:
        raise SystemExit(f"no run at {args.budget:g} in {args.profile}")
    print(f"Test bpb at {args.budget:g} FLOPs, mean over the seeds both folders ran; gain: this size minus "
          "the predicted size, paired by seed, mean [95% t interval] (seeds).\n")
    print("| corpus | family | shape | N | steps | val | test | gain over the predicted size |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(family_rows))
    print(f"\nBest {args.group} (member and size chosen on val) − {args.against}, test bpb, paired by seed:\n")
    print(f"| corpus | runs they choose from | {args.group}: chosen | {args.against}: N chosen | "
          f"{args.group} − {args.against} |")
    print("|---|---|---|---|---|")
    print("\n".join(group_rows))
    for label, diffs in (("held-out sizes only", before), ("with the extra sizes", after)):
        keys = sorted(diffs)
        d = paired_difference({k: diffs[k] for k in keys}, {k: 0.0 for k in keys})
        print(f"| pooled | {label} | – | – | {fmt(d)} |")


if __name__ == "__main__":
    main()
