"""How far reruns of the study's own points land from their records: for each variant run by
`lab/scripts/scaling_variant.py` at one budget (a rerun, or the same config with another optimiser
kernel), its test bpb minus the study's record of the same corpus, seed and size; beside each
family, the median seed sd of one size's runs at that budget (both corpora), for scale.

    python lab/scripts/scaling_rerun_table.py --out lab/results/scaling --results lab/results/scaling_bits \\
        --budget 3e11 --pooled fused
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rltok.analysis.paired_stats import mean_interval
from rltok.analysis.scaling import budget_tag, read_records


def study_records(out: Path, corpora: list[str], budget: float) -> dict[str, list[dict]]:
    """{corpus: the study's scored records at `budget`}."""
    return {c: [r for r in read_records(out / c) if float(r["budget_flops"]) == budget and r.get("bpb") is not None]
            for c in corpora}


def differences(study: dict[str, list[dict]], results: Path, budget: float) -> dict[tuple[str, str], list]:
    """{(family, variant): [(corpus, seed, variant bpb - record bpb)]}; a variant's family is
    FAMILY_VARIANT, as scaling_variant.py names it."""
    rows: dict = {}
    for corpus, records in study.items():
        for r in read_records(results / corpus, f"{budget_tag(budget)}__*.json"):
            if r.get("bpb") is None:
                continue
            family, _, variant = r["family"].rpartition("_")
            same = [s for s in records if s.get("family") == family and s["seed"] == r["seed"]
                    and s["non_embedding_params"] == r["non_embedding_params"]]
            if len(same) != 1:
                raise SystemExit(f"error: {corpus} {r['family']} seed {r['seed']}: {len(same)} study records match")
            rows.setdefault((family, variant), []).append((corpus, int(r["seed"]), r["bpb"] - same[0]["bpb"]))
    return rows


def seed_sd(study: dict[str, list[dict]], family: str) -> float | None:
    """The median over sizes (and corpora) of the sd of one size's runs."""
    sds = []
    for records in study.values():
        by_size: dict = {}
        for r in records:
            if r.get("family") == family:
                by_size.setdefault(r["non_embedding_params"], []).append(r["bpb"])
        sds += [statistics.stdev(v) for v in by_size.values() if len(v) >= 2]
    return statistics.median(sds) if sds else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the study's results folder")
    ap.add_argument("--results", required=True, help="the variants' results folder (corpus subfolders)")
    ap.add_argument("--budget", type=float, required=True)
    ap.add_argument("--pooled", nargs="*", default=[], metavar="VARIANT",
                    help="also pool every family's pairs of these variants")
    args = ap.parse_args(argv)
    out, results = Path(args.out), Path(args.results)
    corpora = sorted(p.name for p in results.iterdir() if p.is_dir())
    study = study_records(out, corpora, args.budget)
    rows = differences(study, results, args.budget)
    print(f"| family | variant | {' | '.join(f'{c} by seed' for c in corpora)} | mean [95% t] (pairs) | max abs "
          f"| median seed sd of a size |")
    print("|---|---|" + "---|" * len(corpora) + "---|---|---|")
    for (family, variant), ds in sorted(rows.items()):
        mean, lo, hi = mean_interval([x for *_, x in ds])
        cells = [", ".join(f"{x:+.4f}" for c, _, x in sorted(ds) if c == corpus) for corpus in corpora]
        sd = seed_sd(study, family)
        print(f"| {family} | {variant} | {' | '.join(cells)} | {mean:+.4f} [{lo:+.4f}, {hi:+.4f}] ({len(ds)}) "
              f"| {max(abs(x) for *_, x in ds):.4f} | {'–' if sd is None else f'{sd:.4f}'} |")
    for variant in args.pooled:
        xs = [x for (_, v), ds in rows.items() if v == variant for *_, x in ds]
        if len(xs) >= 2:
            mean, lo, hi = mean_interval(xs)
            print(f"\nAll {len(xs)} {variant} pairs: {mean:+.4f} [{lo:+.4f}, {hi:+.4f}], sd {statistics.stdev(xs):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
