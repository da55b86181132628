"""Which shapes a family's ladders ran, and what each scored at every budget: per corpus and family,
one row per shape (width and depth as the size rule built them: the hierarchy's byte/chunk width and
encoder+main+decoder depth, a flat model's width and layers) and one column per budget, each cell
the mean bpb over the seeds every rung of that budget ran (the seeds the study chose on; listed
under the table), the budget's best shape in bold, "·" where that budget's ladder has no such shape
(with `--minus`, where either family lacks it). Diverged runs are left out. A budget whose envelope
point sits off its neighbours can be read here: its ladder may have skipped the shape that wins at
the budgets around it.

    python lab/scripts/scaling_shapes.py --out lab/results/scaling --family uniform whitespace \\
        --budget 3e11 6e11 1e12

`--split test` reads the test bpb instead of the select split's (val in the CPU grid). `--minus B`
prints each family minus family B at the same shape instead (learned against uniform cuts share
every shape: `--family rl rl_r0.1 --minus uniform uniform_r0.1`, one family to subtract or one per
family; paired by seed): a difference read shape by shape, so a shape one side reaches only at some budgets does
not move it. With `--by-steps` those differences (every corpus, pair, budget and shape as one cell)
are binned by the run's optimizer steps (quartiles): whether a gap is paid in steps; `--plot PNG`
draws each cell and the bins' means against steps. Writes nothing but that plot; prints markdown.

    python lab/scripts/scaling_shapes.py --out lab/results/scaling --family rl rl_r0.1 \\
        --minus uniform uniform_r0.1 --budget 1e11 3e11 6e11 1e12 --by-steps
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from rltok.analysis.scaling import budget_tag, read_records
from rltok.analysis.scaling_fit import record_shape


def shape_runs(folder: Path, family: str, budget: float) -> dict[str, dict[int, dict]]:
    """{shape: {seed: record}} at the seeds every rung of this budget ran (the study's choice
    seeds, not the extra seeds its best size got; each rung's own seeds where the rungs share none,
    as the study chooses). Diverged runs (no bpb) are left out first."""
    by_rung: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in read_records(folder, f"{budget_tag(budget)}__{family}__N*__s*.json"):
        if r.get("bpb") is not None:
            by_rung[record_shape(r)][r["seed"]] = r
    if not by_rung:
        return {}
    common = set.intersection(*(set(seeds) for seeds in by_rung.values()))
    return {sh: {s: r for s, r in seeds.items() if not common or s in common} for sh, seeds in by_rung.items()}


def _key(split: str) -> str:
    return "bpb_select" if split == "select" else "bpb"


def _losses(runs: dict[str, dict[int, dict]], split: str) -> dict[str, tuple[int, float]]:
    key, out = _key(split), {}
    for sh, by_seed in runs.items():
        vals = [r[key] for r in by_seed.values() if r.get(key) is not None]
        if vals:
            out[sh] = (next(iter(by_seed.values()))["non_embedding_params"], sum(vals) / len(vals))
    return out


def shape_losses(folder: Path, family: str, budget: float, split: str = "select") -> dict[str, tuple[int, float]]:
    """{shape: (N, mean bpb)} over the seeds `shape_runs` keeps."""
    return _losses(shape_runs(folder, family, budget), split)


def _gaps(ra: dict[str, dict[int, dict]], rb: dict[str, dict[int, dict]],
          split: str) -> dict[str, tuple[int, float, float]]:
    key, out = _key(split), {}
    for sh in set(ra) & set(rb):
        seeds = [s for s in sorted(set(ra[sh]) & set(rb[sh]))
                 if ra[sh][s].get(key) is not None and rb[sh][s].get(key) is not None]
        if seeds:
            gap = sum(ra[sh][s][key] - rb[sh][s][key] for s in seeds) / len(seeds)
            steps = sum(rb[sh][s]["steps"] for s in seeds) / len(seeds)
            out[sh] = (ra[sh][seeds[0]]["non_embedding_params"], gap, steps)
    return out


def shape_gaps(folder: Path, a: str, b: str, budget: float,
               split: str = "select") -> dict[str, tuple[int, float, float]]:
    """{shape both ran: (A's N, mean of A − B over the seeds both kept, B's mean optimizer steps)}:
    A and B paired by seed at the same shape (learned and uniform cuts build the same shapes; their
    steps differ by under 1%, the boundary rule's parameters)."""
    return _gaps(shape_runs(folder, a, budget), shape_runs(folder, b, budget), split)


def step_cells(folders: list[Path], pairs: list[tuple[str, str]], budgets: list[float],
               split: str = "select") -> list[tuple[float, float, str, float]]:
    """(optimizer steps, A − B, corpus, budget) per corpus, pair, budget and shape both ran
    (`shape_gaps`), by steps."""
    cells = [(steps, gap, folder.name, budget) for folder in folders for a, b in pairs for budget in budgets
             for _, gap, steps in shape_gaps(folder, a, b, budget, split).values()]
    return sorted(cells, key=lambda cell: cell[0])


def steps_table(cells: list[tuple], bins: int = 4) -> str:
    """Markdown: the cells (sorted by steps) in `bins` groups of about equal count, each group's mean
    and median gap."""
    if not cells:
        return "no shape both families ran"
    lines = ["| steps | cells | mean A − B | median A − B |", "|---|---|---|---|"]
    for i in range(bins):
        group = cells[round(i * len(cells) / bins):round((i + 1) * len(cells) / bins)]
        if not group:
            continue
        gaps = sorted(cell[1] for cell in group)
        mid = len(gaps) // 2
        median = gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2
        lines.append(f"| {group[0][0]:,.0f}–{group[-1][0]:,.0f} | {len(group)} | {sum(gaps) / len(gaps):+.3f} "
                     f"| {median:+.3f} |")
    return "\n".join(lines)


def shape_table(folder: Path, family: str, budgets: list[float], split: str = "select",
                minus: str | None = None) -> str:
    """Markdown: one row per shape (ordered by size), one column per budget, the best per budget bold;
    with `minus`, the family's bpb minus that family's at the same shape and budget (no bold)."""
    runs = {b: shape_runs(folder, family, b) for b in budgets}  # read once: the cells and the seeds listed
    if minus is None:
        cols = {b: _losses(runs[b], split) for b in budgets}
    else:  # paired by seed at each shape both ran
        cols = {b: {sh: (n, gap) for sh, (n, gap, _) in
                    _gaps(runs[b], shape_runs(folder, minus, b), split).items()} for b in budgets}
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
    seeds = []
    for b in budgets:
        used = sorted({s for by_seed in runs[b].values() for s in by_seed})
        if used:
            seeds.append(f"{budget_tag(b)} seeds {','.join(map(str, used))}")
    return "\n".join(lines) + ("\n\n" + "; ".join(seeds) if seeds else "")


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
    ap.add_argument("--bins", type=int, default=4, help="with --by-steps: how many groups of about equal count")
    ap.add_argument("--min-steps", type=float, default=0.0,
                    help="with --by-steps: only the cells whose runs took more than this many steps")
    ap.add_argument("--plot", type=Path, metavar="PNG",
                    help="with --by-steps: also draw every cell and the groups' means against steps (needs matplotlib)")
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
        if args.bins < 1:
            raise SystemExit("--bins must be >= 1")
        cells = [c for c in step_cells(corpora, pairs, budgets, args.split) if c[0] > args.min_steps]
        print(steps_table(cells, args.bins))
        if args.plot and cells:
            from rltok_lab.study_plots import plot_gap_by_steps

            title = f"{', '.join(f'{a} − {b}' for a, b in pairs)} ({args.split})"
            print(f"\nplot: {plot_gap_by_steps(cells, args.plot, args.bins, title)}")
        return
    for folder in corpora:
        for i, fam in enumerate(args.family):
            other = others[i] if minus else None
            print(f"### {folder.name}: {fam + ' − ' + other if other else fam} ({args.split} bpb)\n")
            print(shape_table(folder, fam, budgets, args.split, other) + "\n")


if __name__ == "__main__":
    main()
