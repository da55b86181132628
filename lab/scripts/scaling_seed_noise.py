"""How far apart two seeds of one size land, per corpus, family and budget: the seed noise that sets
how many seeds a paired verdict needs. Each cell is the standard deviation of one run's test bpb
about its size's mean over seeds, pooled over the budget's sizes with two or more seeds (their
number in brackets); "pooled" pools every budget shown, and "median sd over sizes" is the median of
the sizes' own standard deviations, which a few sizes whose seeds parted (often a budget's largest
rung) move less. With two seeds a size's own sd is |difference| / sqrt(2), whose median is about
0.67 of the true sd: that column compares families, it does not estimate the sd. Diverged runs are
left out.

    python lab/scripts/scaling_seed_noise.py --out lab/results/scaling
    python lab/scripts/scaling_seed_noise.py --out lab/results/scaling --family flat flat_ngram --budget 3e11 1e12

`--parted K` then lists, per corpus, the K sizes whose seeds differ most in test bpb, with each
seed's validation bpb at every sixth of its run (the curve in its record), and counts, over every
size whose seeds end `--min-spread` val bpb or more apart, in which third of the run half of that
final spread was first present, and how often the seed that ends best was already ahead of the one
that ends worst at a third of the run: whether seeds part early and stay apart, or wander around
one curve. `--plateau` counts, per family, the runs whose validation bpb at a sixth of the run was
still within 0.1 of the byte unigram entropy of the corpus's val split (the loss of a model that
predicts byte frequencies and reads no context; the corpus is read from the path the runs' records
name, relative to the current folder). Writes nothing; prints markdown.
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
from collections import defaultdict
from pathlib import Path

from rltok_lab.run_curve import SHARES, curve_at
from rltok.analysis.scaling import RESULTS_GLOB, budget_tag, read_records
from rltok.analysis.scaling_fit import pooled_within_sd, profiles_from_records, record_family, record_size
from rltok.analysis.table_cells import number

THIRD = SHARES.index(2 / 6)  # the evaluation at a third of the run


def noise_table(records: list[dict], budgets: list[float], families: list[str] | None) -> list[str]:
    profiles = profiles_from_records(records)
    lines = ["| family | " + " | ".join(budget_tag(b) for b in budgets) + " | pooled | median sd over sizes |",
             "|---|" + "---|" * (len(budgets) + 2)]
    for family in sorted(f for f in profiles if not families or f in families):
        groups = {b: [v for v in profiles[family][b].losses if len(v) >= 2] for b in budgets if b in profiles[family]}
        cells = [f"{number(pooled_within_sd(groups[b]), '.3f')} ({len(groups[b])})" if groups.get(b) else "·"
                 for b in budgets]
        every = [v for g in groups.values() for v in g]
        median = statistics.median(pooled_within_sd([v]) for v in every) if every else None
        lines.append(f"| {family} | " + " | ".join(cells)
                     + f" | {number(pooled_within_sd(every), '.3f')} ({len(every)}) | {number(median, '.3f')} |")
    return lines


def val_at_shares(by_seed: dict[int, dict]) -> tuple[list[int], dict[int, list[float]]]:
    """The indices of `SHARES` every seed's curve reaches, and each seed's val bpb there."""
    at = {s: [curve_at(r, x) for x in SHARES] for s, r in sorted(by_seed.items())}
    keep = [i for i in range(len(SHARES)) if all(v[i] is not None for v in at.values())]
    return keep, {s: [v[i] for i in keep] for s, v in at.items()}


def half_spread_at(gaps: list[float]) -> int | None:
    """The first evaluation whose spread between seeds was half the final one or more; None where
    there is no final spread."""
    if not gaps or not math.isfinite(gaps[-1]) or gaps[-1] <= 0:
        return None
    return next((i for i, g in enumerate(gaps) if g >= gaps[-1] / 2), None)


def size_runs(records: list[dict], budgets: list[float], families: list[str] | None) -> dict[tuple, dict[int, dict]]:
    """{(family, budget, size): {seed: record}} of the runs with a test bpb."""
    out: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in records:
        if r.get("bpb") is not None and r["budget_flops"] in budgets and (not families or record_family(r) in families):
            out[(record_family(r), r["budget_flops"], record_size(r))][r["seed"]] = r
    return out


def parted_table(records: list[dict], budgets: list[float], families: list[str] | None, k: int,
                 min_spread: float) -> list[str]:
    sizes = {key: runs for key, runs in size_runs(records, budgets, families).items() if len(runs) >= 2}
    spread = {key: max(r["bpb"] for r in runs.values()) - min(r["bpb"] for r in runs.values())
              for key, runs in sizes.items()}
    lines = []
    for key in sorted(spread, key=lambda key: -spread[key])[:k]:
        family, budget, n = key
        runs = sizes[key]
        lines.append(f"**{family}, {budget_tag(budget)}, N = {n:,.0f}**: test bpb "
                     + ", ".join(f"s{s} {r['bpb']:.3f}" for s, r in sorted(runs.items())) + f"; spread {spread[key]:.3f}")
        keep, at = val_at_shares(runs)
        if not keep:
            lines += ["", "(no validation curve in every seed's record)", ""]
            continue
        gaps = [max(v[i] for v in at.values()) - min(v[i] for v in at.values()) for i in range(len(keep))]
        lines += ["", "| share of the run | " + " | ".join(f"s{s}" for s in at) + " | spread |",
                  "|---|" + "---|" * (len(at) + 1)]
        lines += [f"| {SHARES[j]:.2f} | " + " | ".join(f"{v[i]:.3f}" for v in at.values()) + f" | {gaps[i]:.3f} |"
                  for i, j in enumerate(keep)]
        first = half_spread_at(gaps)
        lines += ["", "no final val spread" if first is None else
                  f"half the final val spread ({gaps[-1]:.3f}) present at {SHARES[keep[first]]:.0%} of the run", ""]
    thirds, kept_order, counted = [0, 0, 0], 0, 0
    for runs in sizes.values():
        keep, at = val_at_shares(runs)
        if len(keep) != len(SHARES):  # a curve short of some sixth: left out of the count
            continue
        gaps = [max(v[i] for v in at.values()) - min(v[i] for v in at.values()) for i in range(len(keep))]
        first = half_spread_at(gaps)
        if gaps[-1] < min_spread or first is None:
            continue
        counted += 1
        thirds[first // 2] += 1  # sixths 1-2, 3-4, 5-6
        best = min(at, key=lambda s: at[s][-1])
        worst = max(at, key=lambda s: at[s][-1])
        kept_order += at[best][THIRD] < at[worst][THIRD]
    lines.append(f"Of the {counted} sizes whose seeds end {min_spread} val bpb or more apart (every sixth of "
                 f"every seed's curve known), half the final spread was first present in the first third of the "
                 f"run in {thirds[0]}, the second in {thirds[1]}, the last in {thirds[2]}; the seed that ends best "
                 f"was already ahead of the one that ends worst at a third of the run in {kept_order}.\n")
    return lines


PLATEAU_MARGIN = 0.1  # bpb above the unigram entropy that still counts as on the plateau


def unigram_entropy(data: bytes) -> float:
    """Bits per byte of the byte frequencies of `data`: the loss of a model that reads no context."""
    counts = [c for c in collections.Counter(data).values()]
    n = sum(counts)
    return -sum(c / n * math.log2(c / n) for c in counts)


def plateau_table(records: list[dict], families: list[str] | None) -> list[str]:
    from rltok.data.corpus import load_eval_bytes

    specs = {r["config"]["data"]["train"] for r in records if r.get("config")}
    if len(specs) != 1:
        return [f"(--plateau needs the runs of one corpus; their records name {sorted(specs) or 'none'})"]
    spec = specs.pop()
    entropy = unigram_entropy(bytes(load_eval_bytes(spec, "val").tolist()))
    stuck: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        v = curve_at(r, SHARES[0]) if r.get("bpb") is not None else None
        if v is not None and (not families or record_family(r) in families):
            stuck[record_family(r)].append(v > entropy - PLATEAU_MARGIN)
    lines = [f"Runs within {PLATEAU_MARGIN} bpb of the val split's byte unigram entropy ({entropy:.3f}, {spec}) "
             "at a sixth of the run:", "", "| family | runs on the plateau | runs |", "|---|---|---|"]
    lines += [f"| {f} | {sum(v)} | {len(v)} |" for f, v in sorted(stuck.items())]
    return lines + [f"| all | {sum(sum(v) for v in stuck.values())} | {sum(len(v) for v in stuck.values())} |", ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the study's results folder (one subfolder per corpus)")
    ap.add_argument("--family", nargs="+", help="only these families (default: every family with records)")
    ap.add_argument("--budget", nargs="+", type=float, help="only these budgets (default: every budget with records)")
    ap.add_argument("--parted", type=int, default=0, metavar="K",
                    help="the K sizes per corpus whose seeds differ most, with their val curves, and where seeds parted")
    ap.add_argument("--plateau", action="store_true",
                    help="per family, the runs still near the byte unigram entropy at a sixth of the run")
    ap.add_argument("--min-spread", type=float, default=0.05,
                    help="with --parted: the final val spread from which a size counts as parted (default 0.05)")
    args = ap.parse_args(argv)
    corpora = sorted(p for p in args.out.iterdir() if p.is_dir() and any(p.glob(RESULTS_GLOB)))
    if not corpora:
        raise SystemExit(f"no run records ({RESULTS_GLOB}) under {args.out}/<corpus>/")
    for corpus in corpora:
        records = read_records(corpus)
        budgets = args.budget or sorted({r["budget_flops"] for r in records})
        records = [r for r in records if r["budget_flops"] in budgets]
        print(f"## {corpus.name}\n")
        print("\n".join(noise_table(records, budgets, args.family)))
        print("\nStandard deviation of one run's test bpb about its size's mean, pooled over sizes with 2+ seeds "
              "(their number in brackets).\n")
        if args.parted:
            print("\n".join(parted_table(records, budgets, args.family, args.parted, args.min_spread)))
        if args.plateau:
            print("\n".join(plateau_table(records, args.family)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
