"""A variant of one family, trained at that family's best size and budget in the study with the
study's settings (learning rate, warm-up, evaluation), then paired by seed against the family
itself and its rivals at their best sizes. Three kinds of variant:

- `--set KEY=VALUE ...`: the family's method with more settings, e.g. a learned rule that settles
  after a quarter of its compute (`--variant until25 --set objective.policy_until=0.25`);
- `--shape KEY=VALUE ...`: the family at its best size with shape keys replaced, e.g. a deeper
  encoder (`--variant enc4 --shape model.encoder_layers=4`), at the size's learning rate (or that
  times `--lr-scale`, which also makes a variant alone);
- `--teacher`: a hierarchy trained from scratch on a finished learned-cut run's boundaries,
  frozen from the first step (`model.chunker=teacher`; variant name `frozen`). The teacher is one
  run (the family's best size, seed `--teacher-seed`, its last checkpoint); its FLOPs are not
  charged, as whitespace cuts charge none: a diagnostic, never a rival row.

    python lab/scripts/scaling_variant.py --grid lab/scripts/scaling_cpu_grid.toml --out lab/results/scaling \\
        --budget 3e11 --family rl --teacher --seeds 0 1 2 3 4 5 --results lab/results/scaling_frozen

Resumable: the runs go to RESULTS/<corpus>/ (one JSON each, named C<budget>__<family>_<variant>__N..,
skipped when present); the table, from whatever has finished, is printed and written under the
command that made it as section `C<budget>__<family>_<variant>` of variants.md beside RESULTS
(every variant's table in one file: lab/results/variants.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from rltok.analysis.paired_stats import paired_difference
from rltok_lab.run_curve import SHARES, curve_at
from rltok_lab.tables_file import put_section
from rltok.analysis.scaling import Point, budget_tag, corpus_split, family_rungs, load_grid, read_records, run_points
from rltok_lab.scaling_check import best_sizes
from rltok_lab.scaling_summary import format_difference, pool_differences
from rltok.training.checkpoint import resolve_checkpoint
from rltok.config import load_plugin

load_plugin("rltok_lab.variants")  # the teacher rule is the lab's


def teacher_checkpoint(out: Path, corpus: str, budget: float, fam, target: float, seed: int) -> Path:
    """The last valid checkpoint of the family's run at `target` and `seed` in the study."""
    stem = f"{budget_tag(budget)}__{fam.name}__N{round(target)}__s{seed}"
    runs = [p for p in (out / corpus / "runs" / stem).glob("*") if p.is_dir()] if (out / corpus / "runs" / stem).is_dir() else []
    if not runs:
        raise SystemExit(f"error: no run folder of {stem} under {out / corpus / 'runs'} (the study's runs stay on the "
                         "machine that ran them)")
    return resolve_checkpoint(runs[0])


def reshaped(rung, shape: list[str]):
    """The rung with its shape keys replaced by `shape` (KEY=VALUE, added where the rung has none).
    Its N stays the ladder's, so the learning rate is the one the family trains with there."""
    keys = {kv.partition("=")[0] for kv in shape}
    return rung._replace(overrides=[o for o in rung.overrides if o.partition("=")[0] not in keys] + list(shape))


RULE_KEYS = ("model.chunker", "model.chunker.kind")


def variant_method(method: str, sets: list[str]) -> tuple[str, list[str]]:
    """(method, settings) of a variant: a setting that names the boundary rule replaces the method's
    rule (its other pieces kept: `uniform+ngram` with `model.chunker=whitespace` is
    `whitespace+ngram`). Given as a setting, the method's own `model.chunker=` would override it."""
    rules = [kv for kv in sets if kv.partition("=")[0].strip() in RULE_KEYS]
    if not rules:
        return method, list(sets)
    _, plus, pieces = method.partition("+")
    return rules[-1].partition("=")[2].strip() + plus + pieces, [kv for kv in sets if kv not in rules]


def variant_points(grid, out: Path, budget: float, family: str, variant: str, sets: list[str], seeds: list[int],
                   teacher_seed: int | None = None, shape: list[str] = (), lr_scale: float = 1.0) -> list[Point]:
    """The variant's points, one per corpus and seed, at the family's best size at `budget`;
    `teacher_seed`: train on that seed's finished run's boundaries instead (with `sets` too);
    `shape`: shape keys that replace the size's own (e.g. a deeper encoder); `lr_scale`: the
    family's learning rate times this."""
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
        method, extra = variant_method(fam.method, sets)
        if teacher_seed is not None:
            ckpt = teacher_checkpoint(out, corpus, budget, fam, target, teacher_seed).resolve()
            # the rule and its teacher in the family's base overrides (the method's own
            # `model.chunker=teacher` keeps them), so the path stays out of the run folder's name
            method, extra = "teacher", ["model.chunker=teacher", f"model.chunker.checkpoint={ckpt}", *extra]
        spec = dataclasses.replace(fam, name=f"{family}_{variant}", method=method, sizes=(target,), size_coef=None,
                                   overrides=(*fam.overrides, *extra), lr_mult=fam.lr_mult * lr_scale)
        rung = reshaped(family_rungs(grid, fam, [target])[round(target)], shape)  # the family's shape at that size
        points += [Point(corpus, budget, spec, rung, s, "variant") for s in seeds]
    return points


def _losses(records: list[dict], family: str, size=None) -> dict[int, float]:
    """{seed: test bpb} of the family's records at `size` (None: a variant's, which has one size)."""
    mine = [r for r in records if r.get("family") == family and r.get("bpb") is not None
            and (size is None or float(r["non_embedding_params"]) == size)]
    if len({float(r["non_embedding_params"]) for r in mine}) > 1:
        raise SystemExit(f"error: {family} has records at several sizes; a variant runs at one (move the others away)")
    return {int(r["seed"]): float(r["bpb"]) for r in mine}


def paired_rows(grid, out: Path, results: Path, budget: float, family: str, variant: str, rivals: list[str]) -> str:
    """Markdown: the variant − each of (the family, rivals) per corpus at their best sizes, and pooled.
    A rival that is not a study family is looked up among the variants in `results` (each at its one size)."""
    from rltok.analysis.scaling_fit import best_by_choice

    rows = {}
    for corpus in grid.corpora:
        study = [r for r in read_records(out / corpus) if float(r["budget_flops"]) == budget]
        best = best_by_choice(study)
        variants = [r for r in read_records(results / corpus) if float(r["budget_flops"]) == budget]
        mine = _losses(variants, f"{family}_{variant}")
        for rival in [family, *rivals]:
            theirs = _losses(study, rival, best[rival]) if rival in best else _losses(variants, rival)
            if not mine or not set(mine) & set(theirs):
                continue
            d = paired_difference(mine, theirs, name_a=variant, name_b=rival)
            rows.setdefault(rival, {})[corpus] = {"mean": d.mean, "sd": d.sd, "lo": d.lo, "hi": d.hi,
                                                  "seeds": list(d.seeds)}
    lines = [f"| {family}_{variant} − | " + " | ".join(grid.corpora) + " | pooled |",
             "|---|" + "---|" * (len(grid.corpora) + 1)]
    for rival, cells in rows.items():
        pooled = pool_differences(list(cells.values())) if len(cells) > 1 else None
        lines.append(f"| {rival} | " + " | ".join(format_difference(cells.get(k)) for k in grid.corpora)
                     + f" | {format_difference(pooled)} |")
    return "\n".join(lines)


def rate_line(grid, results: Path, budget: float, name: str) -> str:
    """The boundary rate each corpus' runs of the variant scored at (lowest–highest over seeds)."""
    parts = []
    for corpus in grid.corpora:
        rates = sorted(float(r["rate"]) for r in read_records(results / corpus)
                       if r.get("family") == name and float(r["budget_flops"]) == budget and r.get("rate") is not None)
        if rates:
            parts.append(f"{corpus} {rates[0]:.3f}–{rates[-1]:.3f} ({len(rates)})")
    return f"Boundary rate scored, {name}: " + ("; ".join(parts) or "–") + "."


def curve_rows(grid, out: Path, results: Path, budget: float, family: str, variant: str) -> str:
    """Markdown: where along the run the variant's gap to its family opens, val bpb paired by seed
    at each sixth of the training FLOPs (from the records' evaluation curves)."""
    from rltok.analysis.scaling_fit import best_by_choice

    lines = [f"| {family}_{variant} − {family}, val bpb at | " + " | ".join(f"{x:.2f}" for x in SHARES) + " |",
             "|---|" + "---|" * len(SHARES)]
    for corpus in grid.corpora:
        study = [r for r in read_records(out / corpus) if float(r["budget_flops"]) == budget]
        best = best_by_choice(study)
        if family not in best:
            continue
        mine = {int(r["seed"]): r for r in read_records(results / corpus) if float(r["budget_flops"]) == budget
                and r.get("family") == f"{family}_{variant}"}
        theirs = {int(r["seed"]): r for r in study if r.get("family") == family
                  and float(r["non_embedding_params"]) == best[family]}
        cells = []
        for share in SHARES:
            a = {k: v for k, r in mine.items() if (v := curve_at(r, share)) is not None}
            b = {k: v for k, r in theirs.items() if (v := curve_at(r, share)) is not None}
            if not set(a) & set(b):
                cells.append("–")
                continue
            d = paired_difference(a, b)
            cells.append(format_difference({"mean": d.mean, "lo": d.lo, "hi": d.hi, "seeds": list(d.seeds)}))
        lines.append(f"| {corpus} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


VARIANTS_PREAMBLE = """# Variants of the study's families

One table per variant (lab/scripts/scaling_variant.py), each under the command that made it, its
records in the folder that command's `--results` names. Regenerated from them by
`python -m rltok_lab.regenerate --only variants`.
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True)
    ap.add_argument("--out", required=True, help="the study's results folder")
    ap.add_argument("--budget", type=float, required=True)
    ap.add_argument("--family", default="rl", help="the family the variant is of")
    ap.add_argument("--variant", help="its name (the records' family is FAMILY_VARIANT; default `frozen` with --teacher)")
    ap.add_argument("--set", dest="sets", nargs="*", default=[], metavar="KEY=VALUE",
                    help="the variant's settings, beside the family's own")
    ap.add_argument("--shape", nargs="*", default=[], metavar="KEY=VALUE",
                    help="shape keys replacing the best size's own (e.g. model.encoder_layers=4); the learning "
                         "rate stays the size's")
    ap.add_argument("--lr-scale", type=float, default=1.0,
                    help="the family's learning rate times this (its lr_mult scaled)")
    ap.add_argument("--teacher", action="store_true",
                    help="train on the family's finished run's boundaries, frozen from the first step")
    ap.add_argument("--teacher-seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--rivals", nargs="*", default=["uniform", "whitespace"],
                    help="study families (at their best sizes) or other variants in --results (FAMILY_VARIANT)")
    ap.add_argument("--results", required=True, help="where the variant's runs go (corpus subfolders)")
    ap.add_argument("--corpus", help="only this corpus of the grid")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    variant = args.variant or ("frozen" if args.teacher else None)
    if not variant or not (args.teacher or args.sets or args.shape or args.lr_scale != 1.0):
        ap.error("give --teacher, or --variant NAME with its --set KEY=VALUE settings, --shape KEY=VALUE keys "
                 "or --lr-scale")
    if not 0 < args.lr_scale < float("inf"):
        ap.error(f"--lr-scale must be > 0, got {args.lr_scale}")
    if any("=" not in kv or not kv.startswith("model.") for kv in args.shape):
        ap.error(f"--shape takes model.KEY=VALUE, got {args.shape}")
    grid = load_grid(args.grid)
    if args.corpus and args.corpus not in grid.corpora:
        ap.error(f"--corpus {args.corpus!r} is not in the grid ({', '.join(grid.corpora)})")
    out, results = Path(args.out), Path(args.results)
    if not args.table_only:  # --corpus: run only its points; the table reads every corpus' records
        runs = dataclasses.replace(grid, corpora={args.corpus: grid.corpora[args.corpus]}) if args.corpus else grid
        points = variant_points(runs, out, args.budget, args.family, variant, args.sets, args.seeds,
                                args.teacher_seed if args.teacher else None, args.shape, args.lr_scale)
        splits = {c: corpus_split(runs, c) for c in runs.corpora}
        run_points(runs, points, results, splits)
    table = paired_rows(grid, out, results, args.budget, args.family, variant, args.rivals)
    table += "\n\n" + rate_line(grid, results, args.budget, f"{args.family}_{variant}")
    table += "\n\n" + curve_rows(grid, out, results, args.budget, args.family, variant)
    print(table)
    given = sys.argv[1:] if argv is None else argv
    skip = {"--table-only", "--corpus", args.corpus}
    command = shlex.join(["python", "lab/scripts/scaling_variant.py",
                          *(a for i, a in enumerate(given) if a not in skip or (a == args.corpus and given[i - 1] != "--corpus"))])
    put_section(results.resolve().parent / "variants.md", f"{budget_tag(args.budget)}__{args.family}_{variant}",
                f"Generated by `{command}` (test bpb, the variant − each row's family at its best size, paired by "
                f"seed: mean [95% t interval] (seeds)).\n\n{table}\n", VARIANTS_PREAMBLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
