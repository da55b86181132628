"""Rerun some of a study's points exactly, and check that they reproduce their records: the way back
to run folders lost with a machine (notebook R56), whose checkpoints an instrument needs.

`grid` writes a grid (JSON, which `rltok scaling --grid` reads as it reads TOML) holding only the
named points: the study grid's settings, each family at the record's own target sizes, the one seed
named, one budget, no extension, optimum or verdict seeds, no held-out budget. Run it with
`rltok scaling --grid RERUN.json --out RERUN_OUT --corpus C` from a clean worktree of the commit the
records name, then `compare` pairs each rerun record with the packed one and says whether the
scored bpb and the selection split's bpb are equal to the bit (the difference only, never the
values: a budget may be unread).

    python lab/scripts/rerun_grid.py grid --grid lab/scripts/scaling_rivals_grid.toml --study rivals \\
        --corpus docs-en --runs C3e12__rl__N34641__s0 C3e12__hnet__N54772__s0 --write rerun.json
    python lab/scripts/rerun_grid.py compare --study rivals --corpus docs-en --rerun RERUN_OUT/docs-en
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

from rltok.analysis.scaling import budget_tag, read_record
from rltok_lab import records
from rltok_lab.tables_file import commanded_table

STEM = re.compile(r"^(C[^_]+)__(.+)__N(\d+)__s(\d+)$")
DROPPED = ("optimum_seeds", "holdout_budgets", "holdout_seeds", "holdout_overrides", "verdict_seeds", "groups",
           "crossovers", "fit_from")


def packed(study: str, corpus: str, root: Path) -> dict[str, dict]:
    """{stem: record} of a study's packed records of one corpus."""
    return {Path(f).stem: r for f, r in records.entries(study, corpus, root)}


def rerun_grid(grid: dict, corpus: str, runs: list[str], known: dict[str, dict]) -> dict:
    """The study grid `grid` (its parsed file) cut down to the points `runs` (record stems) of
    `corpus`, each family at its records' target sizes."""
    if corpus not in grid.get("corpora", {}):
        raise SystemExit(f"rerun_grid: the grid has no corpus {corpus!r}")
    by_family: dict[str, list[float]] = {}
    budgets, seeds = set(), set()
    for stem in runs:
        if not STEM.match(stem):
            raise SystemExit(f"rerun_grid: {stem!r} is not a record's name (C<budget>__<family>__N<size>__s<seed>)")
        if stem not in known:
            raise SystemExit(f"rerun_grid: no packed record {stem} of {corpus}")
        r = known[stem]
        by_family.setdefault(r["family"], []).append(float(r["target_size"]))
        budgets.add(float(r["budget_flops"]))
        seeds.add(int(r["seed"]))
    if len(budgets) != 1 or len(seeds) != 1:
        raise SystemExit(f"rerun_grid: name points of one budget and one seed (got budgets {sorted(budgets)}, "
                         f"seeds {sorted(seeds)}): each grid reruns one of each")
    families = []
    for spec in grid["families"]:
        name = spec.get("name", spec["method"])
        if name in by_family:
            kept = {k: v for k, v in spec.items() if k != "size_coef"}  # explicit sizes replace the size rule's
            families.append({**kept, "sizes": sorted(set(by_family.pop(name)))})
    if by_family:
        raise SystemExit(f"rerun_grid: families not in the grid: {', '.join(sorted(by_family))}")
    out = {k: v for k, v in grid.items() if k not in DROPPED}
    out.update(corpora={corpus: grid["corpora"][corpus]}, budgets=sorted(budgets), seeds=sorted(seeds), extend=0,
               interior_only=False, families=families)
    return out


def compare(known: dict[str, dict], rerun: Path, budget: float | None) -> list[str]:
    """One row per rerun record: its packed twin's commit and its own, and whether bpb and
    bpb_select agree to the bit (else the absolute difference)."""
    pattern = f"{budget_tag(budget)}__*__N*__s*.json" if budget else "C*__*__N*__s*.json"
    rows = ["| run | packed commit | rerun commit | bpb | bpb (selection split) |", "|---|---|---|---|---|"]
    same = 0
    reruns = [(p.stem, r) for p in rerun.glob(pattern) if (r := read_record(p)) is not None and not r.get("excluded")]
    reruns.sort(key=lambda e: (e[1]["family"], float(e[1]["target_size"])))
    for stem, r in reruns:
        old = known.get(stem)
        if old is None:
            rows.append(f"| {stem} | no packed record | {r.get('commit')} | — | — |")
            continue
        cells = []
        for key in ("bpb", "bpb_select"):
            a, b = old.get(key), r.get(key)
            cells.append("equal" if a == b else "missing" if a is None or b is None else f"differs by {abs(a - b):.2e}")
        same += cells == ["equal", "equal"]
        rows.append(f"| {stem} | {old.get('commit')} | {r.get('commit')} | {cells[0]} | {cells[1]} |")
    return [*rows, "", f"{same} of {len(reruns)} reruns reproduce their records to the bit."]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grid", help="write the grid that reruns the named points")
    g.add_argument("--grid", required=True, type=Path, help="the study's grid (TOML or JSON)")
    g.add_argument("--runs", nargs="+", required=True, help="record names, e.g. C3e12__rl__N34641__s0")
    g.add_argument("--write", required=True, type=Path, help="the rerun grid (JSON)")
    c = sub.add_parser("compare", help="pair the reruns with their packed records")
    c.add_argument("--rerun", required=True, type=Path, help="the rerun's corpus folder (RERUN_OUT/<corpus>)")
    c.add_argument("--budget", type=float)
    c.add_argument("--out", help="also write the table here")
    for p in (g, c):
        p.add_argument("--study", default="rivals", help="a study folder under lab/results")
        p.add_argument("--corpus", required=True)
        p.add_argument("--root", type=Path, default=records.RESULTS, help="the results root holding the study")
    args = ap.parse_args(argv)
    known = packed(args.study, args.corpus, args.root)
    if args.command == "grid":
        text = args.grid.read_text()
        grid = json.loads(text) if args.grid.suffix == ".json" else tomllib.loads(text)
        args.write.write_text(json.dumps(rerun_grid(grid, args.corpus, args.runs, known), indent=2) + "\n")
        print(f"wrote {args.write}: {len(args.runs)} points")
        return 0
    if not args.rerun.is_dir():
        raise SystemExit(f"rerun_grid: {args.rerun} is not a folder")
    commanded_table("rerun_grid.py", argv if argv is not None else sys.argv[1:], compare(known, args.rerun, args.budget),
                    args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
