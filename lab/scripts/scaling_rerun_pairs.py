"""Pair the runs of two study folders by (family, size, seed) at one budget and print, per corpus
and family, the mean and range of B − A (test bpb): what changed between a study's runs and their
rerun (e.g. the hierarchies at 1x and 2x the learning-rate rule).

    python lab/scripts/scaling_rerun_pairs.py lab/results/scaling_lr_v1 lab/results/scaling --budget 3e11
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from rltok.analysis.scaling import budget_tag, read_records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="study folder A (corpus subfolders)")
    ap.add_argument("b", help="study folder B")
    ap.add_argument("--budget", type=float, required=True)
    args = ap.parse_args(argv)
    pattern = f"{budget_tag(args.budget)}__*__N*__s*.json"
    print("| corpus | family | pairs | mean B − A | min | max |\n|---|---|---|---|---|---|")
    for corpus in sorted(p.name for p in Path(args.a).iterdir() if p.is_dir() and (Path(args.b) / p.name).is_dir()):
        a = {(r["family"], r["target_size"], r["seed"]): r["bpb"] for r in read_records(Path(args.a) / corpus, pattern)}
        diffs = defaultdict(list)
        for r in read_records(Path(args.b) / corpus, pattern):
            old = a.get((r["family"], r["target_size"], r["seed"]))
            if old is not None and r["bpb"] is not None:
                diffs[r["family"]].append(r["bpb"] - old)
        for family, d in sorted(diffs.items()):
            print(f"| {corpus} | {family} | {len(d)} | {statistics.mean(d):+.3f} | {min(d):+.3f} | {max(d):+.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
