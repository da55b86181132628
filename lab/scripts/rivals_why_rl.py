"""Why the learned rule trails uniform cuts (lab/notes/rivals.md, R14-R17): on docs-en at 3e11, at
rl's val-chosen size (target 17,321), the learned rule against uniform cuts, against random cuts
from its untrained policy (`rl_random`) and against itself with its losses kept out of the encoder
(`rl_detach`), paired by seed over every seed that all of them ran. Holm's correction over the three
comparisons the notebook predicted (uniform − rl is shown for context, outside the correction).

    python lab/scripts/rivals_why_rl.py [--results lab/results] [--out table.md]
    python lab/scripts/rivals_why_rl.py --confirm   # R20: seeds 8-15 alone, its two predicted comparisons
    python lab/scripts/rivals_why_rl.py --capacity  # R28-R32: encoder depth and rate, both rules, seeds 0-7

Reads the packed records: the study's rl and uniform runs (`rivals`) for seeds 0-2, the optimum
check's controls and the why-rl grid's runs of all four (`rivals_checks`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rltok_lab import records
from rltok_lab.audit import LEVEL, Verdict, holm, paired

BUDGET, TARGET, CORPUS = 3e11, 17321.0, "docs-en"
FAMILIES = ("rl", "uniform", "rl_random", "rl_detach")
PREDICTED = (("rl_random", "rl"), ("rl_random", "uniform"), ("rl_detach", "rl"))
CONTEXT = (("uniform", "rl"),)
# where each family's runs are read: the study's own rl and uniform; the controls (and the grid's
# further seeds of all four) from the checks, not the study's rl_detach family (R21), whose ladder
# shares the diagnostic's size
SOURCES = {"rivals": ("rl", "uniform"), "rivals_checks": FAMILIES}
# R28-R32: the learned rule, attached and detached, with a 4-layer encoder (R28), the same at half the
# learning rate (R30) and one layer at half the rate (R32), made by lab/scripts/scaling_variant.py
# --shape/--lr-scale. (label, attached, detached); the first, the study's own shape, is the reference
CAPACITY_PAIRS = (("1 layer", "rl", "rl_detach"), ("4 layers", "rl_enc4", "rl_detach_enc4"),
                  ("4 layers, half the rate", "rl_enc4h", "rl_detach_enc4h"),
                  ("1 layer, half the rate", "rl_h", "rl_detach_h"))
DEEPER = tuple(f for _, a, d in CAPACITY_PAIRS[1:] for f in (a, d))
DEEPER_SOURCE = "rivals_capacity"
# the confirmation on fresh seeds: read apart from the seeds that suggested it
CONFIRM_SEEDS = tuple(range(8, 16))
CONFIRMED = (("rl_detach", "rl"), ("rl_detach", "uniform"))


def losses(root: Path, sources: dict = SOURCES, curves: dict | None = None) -> dict[str, dict[int, float]]:
    """{family: {seed: test bpb}} at the diagnostic's cell; a seed recorded twice is an error.
    `curves`: also filled with {family: {seed: record}} (the validation curve along the run)."""
    out: dict[str, dict[int, float]] = {f: {} for fams in sources.values() for f in fams}
    for study, families in sources.items():
        for r in records.load(study, CORPUS, root=root):
            if (r.get("family") not in families or r.get("bpb") is None or float(r["budget_flops"]) != BUDGET
                    or float(r["target_size"]) != TARGET):
                continue
            seed = int(r["seed"])
            if seed in out[r["family"]]:
                raise SystemExit(f"{r['family']} seed {seed} is recorded twice (in {study})")
            out[r["family"]][seed] = float(r["bpb"])
            if curves is not None:
                curves.setdefault(r["family"], {})[seed] = r
    return out


def verdict(bpb: dict, a: str, b: str) -> Verdict:
    n, mean, lo, hi, p = paired(bpb[a], bpb[b])
    return Verdict(CORPUS, BUDGET, a, b, n, mean, lo, hi, p, "charged")


def table(bpb: dict[str, dict[int, float]], seeds=None, predicted=PREDICTED, context=CONTEXT) -> str:
    """The families that ran, their shared seeds (of `seeds`, if given) and the comparisons."""
    bpb = {f: v for f, v in bpb.items() if v}
    shared = set.intersection(*(set(v) for v in bpb.values()))
    seeds = sorted(shared if seeds is None else shared & set(seeds))
    if len(seeds) < 2:
        raise SystemExit(f"fewer than two seeds shared by {', '.join(bpb)}: nothing to pair")
    bpb = {f: {s: v[s] for s in seeds} for f, v in bpb.items()}
    rows = [f"docs-en, {BUDGET:.0e} FLOPs, target size {TARGET:,.0f}, seeds {', '.join(map(str, seeds))}; "
            f"test bpb, {LEVEL:.0%} t intervals paired by seed.", "",
            "| family | mean test bpb | per seed |", "|---|---:|---|"]
    rows += [f"| {f} | {sum(v.values()) / len(v):.4f} | {' '.join(f'{v[s]:.4f}' for s in seeds)} |"
             for f, v in bpb.items()]
    rows += ["", f"| A − B | n | mean | interval | p | p (Holm, m = {len(predicted)}) | resolved |",
             "|---|---:|---:|---|---:|---:|---|"]
    for v in holm([verdict(bpb, a, b) for a, b in predicted]):
        rows.append(f"| {v.a} − {v.b} | {v.n} | {v.mean:+.3f} | [{v.lo:+.3f}, {v.hi:+.3f}] | {v.p:.4f} | "
                    f"{v.p_holm:.4f} | {'yes' if v.resolved else 'no'} |")
    rows += [context_row(f"{a} − {b}", *paired(bpb[a], bpb[b])) for a, b in context]
    return "\n".join(rows) + "\n"


def context_row(label: str, n: int, mean: float, lo: float, hi: float, p: float) -> str:
    """A comparison shown for context, outside the correction."""
    return f"| {label} (context) | {n} | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {p:.4f} | — | — |"


def capacity_table(bpb: dict[str, dict[int, float]], seeds=range(CONFIRM_SEEDS[0]), runs: dict | None = None) -> str:
    """R28, R30 and R32: the detached rule's gain with a 4-layer encoder at the size's rate and at
    half of it, and with one layer at half of it, where those runs exist (the predicted
    comparisons, corrected together), beside the one-layer gain on the same seeds and each change
    from it, paired by seed; with `runs` ({family: {seed: record}}), every gain along the run too
    (validation bpb)."""
    pairs = [(label, a, d) for label, a, d in CAPACITY_PAIRS if bpb.get(a) and bpb.get(d)]
    fams = [f for _, a, d in pairs for f in (a, d)]
    shared = sorted(set(seeds).intersection(*(bpb[f] for f in fams)))
    if len(pairs) < 2 or len(shared) < 2:
        raise SystemExit(f"fewer than two seeds shared by {', '.join(fams)}: nothing to pair")
    gaps = {label: {s: bpb[d][s] - bpb[a][s] for s in shared} for label, a, d in pairs}
    text = table({f: bpb[f] for f in fams}, shared, [(d, a) for _, a, d in pairs[1:]], [(pairs[0][2], pairs[0][1])])
    reference = pairs[0][0]
    for label, _, _ in pairs[1:]:
        text += context_row(f"change of the gain, {label} − {reference}", *paired(gaps[label], gaps[reference])) + "\n"
    if runs:
        from rltok_lab.run_curve import SHARES, curve_at

        text += ("\nAlong the run: validation bpb, detached − attached, mean over the same seeds.\n\n"
                 "| encoder | " + " | ".join(f"{x:.2f}" for x in SHARES) + " |\n"
                 "|---|" + "---:|" * len(SHARES) + "\n")
        for label, a, d in pairs:
            cells = []
            for x in SHARES:
                at = [(curve_at(runs[d][s], x), curve_at(runs[a][s], x)) for s in shared]
                diffs = [vd - va for vd, va in at if vd is not None and va is not None]
                cells.append(f"{sum(diffs) / len(diffs):+.3f} ({len(diffs)})" if diffs else "–")
            text += f"| {label} | " + " | ".join(cells) + " |\n"
    return text


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=records.RESULTS, help="the packed records' root")
    p.add_argument("--out", type=Path, help="also write the table here")
    p.add_argument("--confirm", action="store_true",
                   help=f"the confirmation: seeds {CONFIRM_SEEDS[0]}-{CONFIRM_SEEDS[-1]} alone, "
                        "rl_detach against rl and uniform")
    p.add_argument("--capacity", action="store_true",
                   help="R28-R32: rl and rl_detach with a 4-layer encoder and with one layer, at the size's "
                        "rate and at half of it, seeds 0-7")
    args = p.parse_args(argv)
    if args.capacity:
        runs: dict = {}
        text = capacity_table(losses(args.results, {**SOURCES, DEEPER_SOURCE: DEEPER}, runs), runs=runs)
    elif args.confirm:
        bpb = losses(args.results)
        text = table({f: bpb[f] for f in ("rl", "uniform", "rl_detach")}, CONFIRM_SEEDS, CONFIRMED, ())
    else:
        text = table(losses(args.results), range(CONFIRM_SEEDS[0]))
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
