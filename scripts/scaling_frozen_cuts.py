"""Where a learned rule cuts, against what learning to cut costs: a hierarchy trained from scratch
on a finished learned-cut run's boundaries, frozen from the first step (`model.chunker=teacher`),
at that family's best size and budget in the study, with the study's settings (learning rate,
warm-up, evaluation), then paired by seed against the learned rule itself and against uniform
and whitespace cuts at their best sizes. The teacher is one run (the family's best size, seed
`--teacher-seed`, its last checkpoint); its FLOPs are not charged, as whitespace cuts charge none.

    python scripts/scaling_frozen_cuts.py --grid scripts/scaling_cpu_grid.toml --out docs/results/scaling \\
        --budget 3e11 --family rl --seeds 0 1 2 3 4 5 --results docs/results/scaling_frozen

Resumable: the runs go to RESULTS/<corpus>/ (one JSON each, skipped when present); the table is
printed from whatever has finished.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rltok.analysis.paired_stats import paired_difference
from rltok.analysis.scaling import Point, budget_tag, corpus_split, family_rungs, load_grid, read_records, run_points
from rltok.analysis.scaling_check import best_sizes
from rltok.analysis.scaling_summary import format_difference, pool_differences
from rltok.training.checkpoint import resolve_checkpoint


def teacher_checkpoint(out: Path, corpus: str, budget: float, fam, target: float, seed: int) -> Path:
    """The last valid checkpoint of the family's run at `target` and `seed` in the study."""
    stem = f"{budget_tag(budget)}__{fam.name}__N{round(target)}__s{seed}"
    runs = [p for p in (out / corpus / "runs" / stem).glob("*") if p.is_dir()] if (out / corpus / "runs" / stem).is_dir() else []
    if not runs:
        raise SystemExit(f"error: no run folder of {stem} under {out / corpus / 'runs'} (the study's runs stay on the "
                         "machine that ran them)")
    return resolve_checkpoint(runs[0])


def frozen_points(grid, out: Path, budget: float, family: str, seeds: list[int],
                  teacher_seed: int) -> list[Point]:
    by_name = {f.name: f for f in grid.families}
    if family not in by_name:
        raise SystemExit(f"error: no family {family!r} in the grid ({', '.join(by_name)})")
    fam = by_name[family]
    points = []
    for corpus in grid.corpora:
        best = best_sizes(read_records(out / corpus), budget)
        if family not in best:
            raise SystemExit(f"error: {corpus}: {family} has no runs at {budget:g}")
        target, _ = best[family]
        ckpt = teacher_checkpoint(out, corpus, budget, fam, target, teacher_seed).resolve()
        # the rule and its teacher in the family's base overrides (the method's own
        # `model.chunker=teacher` keeps them), so the path stays out of the run folder's name
        spec = dataclasses.replace(fam, name=f"{family}_frozen", method="teacher", sizes=(target,), size_coef=None,
                                   overrides=(*fam.overrides, "model.chunker=teacher", f"model.chunker.checkpoint={ckpt}"))
        rung = family_rungs(grid, fam, [target])[round(target)]  # the learned rule's shape, less its policy head
        points += [Point(corpus, budget, spec, rung, s, "frozen") for s in seeds]
    return points


def _losses(records: list[dict], family: str, size=None) -> dict[int, float]:
    return {int(r["seed"]): float(r["bpb"]) for r in records if r.get("family") == family and r.get("bpb") is not None
            and (size is None or float(r["non_embedding_params"]) == size)}


def paired_rows(grid, out: Path, results: Path, budget: float, family: str, rivals: list[str]) -> str:
    """Markdown: frozen − each of (the family, rivals) per corpus at their best sizes, and pooled."""
    from rltok.analysis.scaling_fit import best_by_choice

    rows, lines = {}, []
    for corpus in grid.corpora:
        study = [r for r in read_records(out / corpus) if float(r["budget_flops"]) == budget]
        best = best_by_choice(study)
        frozen = _losses([r for r in read_records(results / corpus) if float(r["budget_flops"]) == budget],
                         f"{family}_frozen")
        for rival in [family, *rivals]:
            if not frozen or rival not in best:
                continue
            d = paired_difference(frozen, _losses(study, rival, best[rival]), name_a="frozen", name_b=rival)
            rows.setdefault(rival, {})[corpus] = {"mean": d.mean, "sd": d.sd, "lo": d.lo, "hi": d.hi,
                                                  "seeds": list(d.seeds)}
    lines = ["| frozen cuts − | " + " | ".join(grid.corpora) + " | pooled |", "|---|" + "---|" * (len(grid.corpora) + 1)]
    for rival, cells in rows.items():
        pooled = pool_differences(list(cells.values())) if len(cells) > 1 else None
        lines.append(f"| {rival} | " + " | ".join(format_difference(cells.get(k)) for k in grid.corpora)
                     + f" | {format_difference(pooled)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True)
    ap.add_argument("--out", required=True, help="the study's results folder")
    ap.add_argument("--budget", type=float, required=True)
    ap.add_argument("--family", default="rl", help="the learned-cut family whose boundaries are frozen")
    ap.add_argument("--teacher-seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--rivals", nargs="*", default=["uniform", "whitespace"])
    ap.add_argument("--results", required=True, help="where the frozen-cut runs go (corpus subfolders)")
    ap.add_argument("--corpus", help="only this corpus of the grid")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    grid = load_grid(args.grid)
    if args.corpus:
        grid = dataclasses.replace(grid, corpora={args.corpus: grid.corpora[args.corpus]})
    out, results = Path(args.out), Path(args.results)
    if not args.table_only:
        points = frozen_points(grid, out, args.budget, args.family, args.seeds, args.teacher_seed)
        splits = {c: corpus_split(grid, c) for c in grid.corpora}
        run_points(grid, points, results, splits)
    print(paired_rows(grid, out, results, args.budget, args.family, args.rivals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
