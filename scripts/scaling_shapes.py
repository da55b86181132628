"""Which shapes a family's ladders ran, and what each scored at every budget: per corpus and family,
one row per shape (width and depth as the size rule built them: the hierarchy's byte/chunk width and
encoder+main+decoder depth, a flat model's width and layers) and one column per budget, each cell
the mean bpb over the seeds every rung of that budget ran (the seeds the study chose on), the
budget's best shape in bold, "·" where that budget's ladder has no such shape. A budget whose
envelope point sits off its neighbours can be read here: its ladder may have skipped the shape that
wins at the budgets around it.

    python scripts/scaling_shapes.py --out docs/results/scaling --family uniform whitespace \\
        --budget 3e11 6e11 1e12

`--split test` reads the test bpb instead of the select split's (val in the CPU grid). `--minus B`
prints each family minus family B at the same shape instead (learned against uniform cuts share
every shape: `--family rl rl_r0.1 --minus uniform uniform_r0.1`, one family to subtract or one per
family): a difference read shape by shape, so a shape one side reaches only at some budgets does
not move it. With `--by-steps` those differences (every corpus, pair, budget and shape as one cell)
are binned by the run's optimizer steps (quartiles): whether a gap is paid in steps. Writes nothing;
prints markdown.

    python scripts/scaling_shapes.py --out docs/results/scaling --family rl rl_r0.1 \
        --minus uniform uniform_r0.1 --budget 1e11 3e11 6e11 1e12 --by-steps
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from rltok.analysis.scaling import budget_tag, read_records


def shape_of(rec: dict) -> str:
    """The rung's shape as its record states it: 'width depth' (e.g. '32/48 1+1+1')."""
    return f"{rec.get('width')} {rec.get('depth')}"


def shape_runs(folder: Path, family: str, budget: float) -> dict[str, list[dict]]:
    """{shape: its records at the seeds every rung of this budget ran}: the study's choice seeds,
    not the extra seeds its best size got."""
    by_rung: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in read_records(folder, f"{budget_tag(budget)}__{family}__N*__s*.json"):
        by_rung[shape_of(r)][r["seed"]] = r
    if not by_rung:
        return {}
    common = set.intersection(*(set(seeds) for seeds in by_rung.values()))
    return {sh: [seeds[s] for s in sorted(common)] for sh, seeds in by_rung.items()}


def shape_losses(folder: Path, family: str, budget: float, split: str = "select") -> dict[str, tuple[int, float]]:
    """{shape: (N, mean bpb)} over the seeds every rung of this budget ran (diverged runs left out)."""
    key = "bpb_select" if split == "select" else "bpb"
    out = {}
    for sh, recs in shape_runs(folder, family, budget).items():
        vals = [r.get(key) for r in recs if r.get(key) is not None]
        if vals:
            out[sh] = (recs[0]["non_embedding_params"], sum(vals) / len(vals))
    return out


def step_cells(folders: list[Path], pairs: list[tuple[str, str]], budgets: list[float],
               split: str = "select") -> list[tuple[float, float]]:
    """(optimizer steps, A − B) per corpus, pair, budget and shape both ran: the difference of their
    means over the seeds both ran, the steps of B's runs (the same shape trains the same steps)."""
    key = "bpb_select" if split == "select" else "bpb"
    cells = []
    for folder in folders:
        for a, b in pairs:
            for budget in budgets:
                ra, rb = shape_runs(folder, a, budget), shape_runs(folder, b, budget)
                for sh in set(ra) & set(rb):
                    xa = {r["seed"]: r for r in ra[sh] if r.get(key) is not None}
                    xb = {r["seed"]: r for r in rb[sh] if r.get(key) is not None}
                    seeds = sorted(set(xa) & set(xb))
                    if seeds:
                        gap = sum(xa[s][key] - xb[s][key] for s in seeds) / len(seeds)
                        cells.append((sum(xb[s]["steps"] for s in seeds) / len(seeds), gap))
    return sorted(cells)


def steps_table(cells: list[tuple[float, float]], bins: int = 4) -> str:
    """Markdown: the cells in `bins` groups of about equal count by steps, each group's mean and median gap."""
    if not cells:
        return "no shape both families ran"
    lines = ["| steps | cells | mean A − B | median A − B |", "|---|---|---|---|"]
    for i in range(bins):
        group = cells[round(i * len(cells) / bins):round((i + 1) * len(cells) / bins)]
        if not group:
            continue
        gaps = sorted(g for _, g in group)
        mid = len(gaps) // 2
        median = gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2
        lines.append(f"| {group[0][0]:,.0f}–{group[-1][0]:,.0f} | {len(group)} | {sum(gaps) / len(gaps):+.3f} "
                     f"| {median:+.3f} |")
    return "\n".join(lines)


def shape_table(folder: Path, family: str, budgets: list[float], split: str = "select", minus: str | None = None) -> str:
    """Markdown: one row per shape (ordered by size), one column per budget, the best per budget bold;
    with `minus`, the family's bpb minus that family's at the same shape and budget (no bold)."""
    cols = {b: shape_losses(folder, family, b, split) for b in budgets}
    if minus is not None:
        for b in budgets:
            other = shape_losses(folder, minus, b, split)
            cols[b] = {sh: (n, loss - other[sh][1]) for sh, (n, loss) in cols[b].items() if sh in other}
    shapes: dict[str, int] = {}
    for losses in cols.values():
        for sh, (n, _) in losses.items():
            shapes[sh] = n
    if not shapes:
        return f"no runs of {family} at {', '.join(budget_tag(b) for b in budgets)}"
    best = {} if minus else {b: min(losses, key=lambda sh: losses[sh][1]) for b, losses in cols.items() if losses}
    lines = ["| shape | N | " + " | ".join(budget_tag(b) for b in budgets) + " |",
             "|---|---|" + "---|" * len(budgets)]
    for sh in sorted(shapes, key=lambda s: (shapes[s], s)):
        cells = []
        for b in budgets:
            if sh not in cols[b]:
                cells.append("·")
                continue
            text = f"{cols[b][sh][1]:{'+.3f' if minus else '.3f'}}"
            cells.append(f"**{text}**" if best.get(b) == sh else text)
        lines.append(f"| {sh} | {shapes[sh]:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the study's results folder (one subfolder per corpus)")
    ap.add_argument("--family", nargs="+", required=True)
    ap.add_argument("--budget", nargs="+", type=float, required=True)
    ap.add_argument("--split", choices=("select", "test"), default="select",
                    help="the select split's bpb (the study's choices; default) or test")
    ap.add_argument("--minus", nargs="+", metavar="FAMILY",
                    help="print each family minus this one (or minus its own, one per --family) at the same shape")
    ap.add_argument("--by-steps", action="store_true", help="with --minus: the differences binned by optimizer steps")
    args = ap.parse_args(argv)
    corpora = sorted(p for p in args.out.iterdir() if p.is_dir() and any(p.glob("C*__*.json")))
    if not corpora:
        raise SystemExit(f"no study records under {args.out}")
    budgets = sorted(args.budget)
    minus = args.minus or []
    if minus and len(minus) not in (1, len(args.family)):
        raise SystemExit("--minus takes one family, or one per --family")
    others = minus * len(args.family) if len(minus) == 1 else minus
    if args.by_steps:
        if not minus:
            raise SystemExit("--by-steps needs --minus")
        pairs = list(zip(args.family, others))
        print(f"### {', '.join(f'{a} − {b}' for a, b in pairs)} by optimizer steps ({args.split} bpb; "
              f"{', '.join(f.name for f in corpora)}; {', '.join(budget_tag(b) for b in budgets)})\n")
        print(steps_table(step_cells(corpora, pairs, budgets, args.split)))
        return
    for folder in corpora:
        for i, fam in enumerate(args.family):
            other = others[i] if minus else None
            print(f"### {folder.name}: {fam + ' − ' + other if other else fam} ({args.split} bpb)\n")
            print(shape_table(folder, fam, budgets, args.split, other) + "\n")


if __name__ == "__main__":
    main()
