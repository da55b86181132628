"""Regenerate the compute-optimal study's tables in the lab's README and in lab/reports/SCALING.md from its
runs; never edit the lines between the markers by hand.

- README, between `<!-- scaling-results:begin -->` and `<!-- scaling-results:end -->`: each family
  at its best size (chosen on val) of the largest of the grid's budgets that is complete on every
  corpus, test bpb (mean ± sd over seeds), N and inference FLOPs per byte, and the paired verdicts
  there.
- lab/reports/SCALING.md, between `<!-- scaling-study:begin -->` and `<!-- scaling-study:end -->`: per
  corpus each family's best loss at every budget with its size, the envelopes with intervals,
  the crossovers and the reference-scale extrapolation; every prediction held out from the fit
  (the held-out budgets' and any forecast) with its score once run; and the machine-hours of
  every record under the results folder.

    python lab/scripts/scaling_results.py --grid lab/scripts/scaling_cpu_grid.toml --out lab/results/scaling

While a budget of the grid has runs but is not complete, the SCALING.md block would show its partial
fits: the script refuses, unless `--allow-partial` (the block then says which budgets are under way)
or `--doc ''` (the README table alone, which only ever shows a complete budget).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rltok.analysis.compare import git_commit
from rltok.analysis.scaling import load_grid
from rltok_lab.scaling_holdout import predictions_block
from rltok_lab.scaling_status import unfinished_budgets
from rltok_lab.scaling_summary import common_budget, machine_table, paired_table, study_block, summary_table

# rows pooling the seeds of several pairs over every corpus (pairs the grid's crossovers name)
POOLS = {"learned − uniform cuts, both rates": [("rl", "uniform"), ("rl_r0.1", "uniform_r0.1")]}
README_MARKS = ("<!-- scaling-results:begin -->", "<!-- scaling-results:end -->")
DOC_MARKS = ("<!-- scaling-study:begin -->", "<!-- scaling-study:end -->")
LABELS = {"flat": "flat bytes", "flat_ngram": "flat bytes + n-gram tables",
          "bpe1024": "BPE tokens, 1,024 merges", "bpe4096": "BPE tokens, 4,096 merges",
          "uniform": "hierarchy, uniform cuts, rate 0.2", "uniform_r0.1": "hierarchy, uniform cuts, rate 0.1",
          "whitespace": "hierarchy, whitespace cuts", "rl": "hierarchy, learned cuts, rate 0.2",
          "rl_r0.1": "hierarchy, learned cuts, rate 0.1", "hierarchy": "best hierarchy", "bytes": "best byte model",
          "bpe": "best BPE vocabulary"}


def splice(path: Path, block: str, marks: tuple[str, str]) -> None:
    """Replace the lines between the two markers of `path` with `block`."""
    begin, end = marks
    text = path.read_text()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"error: {path} needs one {begin} line before one {end} line")
    head, rest = text.split(begin)
    path.write_text(f"{head}{begin}\n{block}\n{end}{rest.split(end, 1)[1]}")


def _predictions(out: Path) -> str:
    block = predictions_block(out)
    return f"### Predictions held out from the fit\n\n{block}\n\n" if block else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True)
    ap.add_argument("--out", required=True, help="the study's results folder")
    ap.add_argument("--budget", type=float,
                    help="the README table's budget (default: the largest of the grid's budgets complete on every corpus)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="regenerate the SCALING.md block while a budget is under way (its fits are provisional)")
    ap.add_argument("--readme", default="lab/README.md")
    ap.add_argument("--doc", default="lab/reports/SCALING.md", help="its study block; '' leaves it alone")
    ap.add_argument("--results-root", help="where the machine-hours are summed (default: the parent of --out)")
    args = ap.parse_args(argv)
    grid = load_grid(args.grid)
    folders = {c: Path(args.out) / c for c in grid.corpora if (Path(args.out) / c).is_dir()}
    if not folders:
        raise SystemExit(f"error: no corpus folder of the grid under {args.out}")
    families = [f.name for f in grid.families]
    unfinished = unfinished_budgets(dataclasses.replace(grid, corpora={c: grid.corpora[c] for c in folders}),
                                    Path(args.out))
    under_way = sorted({b for _, b in unfinished})
    said = ", ".join(f"{c} {b:.3g}" for c, b in unfinished)
    if under_way and args.doc and not args.allow_partial:
        raise SystemExit(f"error: {said} not complete (or its data cannot be read to tell): the SCALING.md block "
                         "would show provisional fits (--allow-partial to write them anyway, --doc '' for the "
                         "README table alone)")
    budget = args.budget
    if budget is not None and budget in under_way and not args.allow_partial:
        raise SystemExit(f"error: --budget {budget:g} is not complete ({said}): the README table shows a complete "
                         "budget (--allow-partial to show it anyway)")
    if budget is None:  # a budget under way stays out of the README
        complete = [b for b in grid.budgets if b not in under_way]
        budget = common_budget(folders, families, among=complete)
        if budget is None and args.allow_partial:
            budget = common_budget(folders, families)
        if budget is None:
            raise SystemExit("error: no budget of the grid is complete on every corpus for every family yet "
                             "(--allow-partial to tabulate one under way)")
    budget, table = summary_table(folders, budget, families, LABELS)
    chosen = ("" if args.budget is None else f" --budget {args.budget:g}") + (" --allow-partial" if args.allow_partial else "")
    provisional = " **Provisional**: this budget is under way." if budget in under_way else ""
    block = (f"Test bits per byte at **{budget:.3g} training FLOPs**, each family at its best size (chosen on val), "
             f"mean ± sd over seeds (count in brackets); N: non-embedding parameters; FLOPs/byte: inference. "
             f"Generated by `python lab/scripts/scaling_results.py --grid {args.grid} --out {args.out}{chosen}` at commit "
             f"`{git_commit()}`.{provisional}\n\n{table}")
    fits = {c: json.loads((f / "fits.json").read_text()) for c, f in folders.items() if (f / "fits.json").exists()}
    pairs = paired_table(fits, budget, LABELS, POOLS)
    if pairs:
        block += ("\n\nPaired by seed at each side's best size (chosen on val), test bpb of a minus b, mean "
                  "[95% t interval] (seeds); negative: a is better. From each corpus's fits.json (`rltok scaling "
                  "--fit-only`). Pooled: every seed's difference of both corpora (and, in the last row, of "
                  "both rates) as one sample, an interval that holds where the cells agree.\n\n" + pairs)
    splice(Path(args.readme), block, README_MARKS)
    print(block)
    if args.doc:
        root = Path(args.results_root or Path(args.out).parent)
        partial = "" if not under_way else (
            " **Provisional**: " + ", ".join(f"{b:.3g}" for b in under_way) + " under way, its fits from a partial "
            "ladder (`--allow-partial`).")
        doc = (f"Generated by `python lab/scripts/scaling_results.py --grid {args.grid} --out {args.out}` at commit "
               f"`{git_commit()}` from the runs finished then (the same fits as each corpus's report.md).{partial}\n\n"
               f"{study_block(grid, folders, LABELS, pools=POOLS)}\n\n{_predictions(Path(args.out))}### Machine time\n\nThe sum of the runs' wall-clock "
               "seconds (one thread each, two runs side by side), per folder of records: `point_wall_s` (the "
               "whole point: building, training, every evaluation, interrupted attempts) where a record has it; "
               "records written before it existed have `wall_s`, their training alone, so those folders' hours "
               f"are a lower bound.\n\n{machine_table(root)}")
        splice(Path(args.doc), doc, DOC_MARKS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
