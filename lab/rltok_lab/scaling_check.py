"""Checks at each family's optimum of one budget of the study.

The learning-rate rule: each family's best size (lowest mean choice loss, `scaling_fit.choice_loss`)
also runs at `lr_mults` times the rule's rate (0.5x and 2x by default) with the grid's seeds; the
rule holds for a family where its run is within `tolerance` bpb of the best of the three on the
selection split. Variants: the same size with other overrides in place of the family's own (the
flat model with full attention instead of its window), compared paired by seed.

`optimum_points` names the runs, `run_optimum_check` runs those not done (resumable like every point
of the study) under OUT/optimum_check/<corpus>/ and scores them against the study's own runs at
that size (OUT/<corpus>/), writing OUT/optimum_check/<budget>.json and .md (`check_markdown`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from rltok.analysis.scaling import (NAME, Grid, Point, _write_json, budget_tag, corpus_split, family_rungs,
                                    read_records, run_points)
from rltok.analysis.table_cells import number
from rltok.config import ConfigError

FOLDER = "optimum_check"


@dataclasses.dataclass(frozen=True)
class Variant:
    """A family's optimum run again with `overrides` in place of the family's own."""
    name: str
    family: str
    overrides: tuple[str, ...]


def parse_variant(text: str) -> Variant:
    """NAME=FAMILY[:override,override...] (no overrides: the compare method's defaults)."""
    name, sep, rest = text.partition("=")
    family, _, overrides = rest.partition(":")
    if not sep or not NAME.fullmatch(name) or not family:
        raise ConfigError(f"--variant {text!r}: give NAME=FAMILY[:key=value,key=value...] (NAME: letters, digits, "
                          "'.', '+', '-' and single '_')")
    return Variant(name, family, tuple(o for o in overrides.split(",") if o))


def lr_name(family: str, mult: float) -> str:
    return f"{family}_lr{mult:g}"


def best_sizes(records: list[dict], budget: float) -> dict[str, tuple[float, int]]:
    """{family: (target size, achieved N)} of the lowest mean choice loss at `budget`."""
    from rltok.analysis.scaling_fit import best_by_choice

    return best_by_choice([r for r in records if float(r["budget_flops"]) == budget],
                          key=lambda r: (float(r["target_size"]), int(r.get("ladder_params", r["non_embedding_params"]))))


def optimum_points(grid: Grid, out: Path, budget: float, lr_mults=(0.5, 2.0), variants=(), log=print) -> list[Point]:
    """The check's runs: per corpus, each family's best size at `budget` at every lr multiple, and
    each variant at its family's best size; the grid's seeds."""
    by_name = {f.name: f for f in grid.families}
    for v in variants:
        if v.family not in by_name:
            raise ConfigError(f"--variant {v.name}: no family {v.family!r} in the grid ({', '.join(by_name)})")
        if v.name in by_name:
            raise ConfigError(f"--variant {v.name}: the name of a family of the grid; choose another")
    points = []
    for corpus in grid.corpora:
        best = best_sizes(read_records(out / corpus), budget)
        if not best:
            raise ConfigError(f"{corpus}: no runs at budget {budget:g} in {out / corpus}: run the study there first")
        specs = [(dataclasses.replace(fam, name=lr_name(fam.name, m), lr_mult=fam.lr_mult * m), fam.name)
                 for fam in grid.families for m in lr_mults]
        specs += [(dataclasses.replace(by_name[v.family], name=v.name, overrides=v.overrides), v.family)
                  for v in variants]
        for spec, family in specs:
            if family not in best:
                log(f"{corpus} {spec.name}: {family} has no runs at {budget:g}: skipped")
                continue
            target, achieved = best[family]
            spec = dataclasses.replace(spec, sizes=(target,), size_coef=None)
            rung = family_rungs(grid, spec, [target])[round(target)]
            if rung.achieved != achieved and spec.overrides == by_name[family].overrides:
                raise ConfigError(f"{corpus} {spec.name}: target {target:g} builds N {rung.achieved:,} here but "
                                  f"{achieved:,} in the study (the ladder changed since)")
            points += [Point(corpus, budget, spec, rung, seed, "check") for seed in grid.seeds]
    return points


def _losses(records: list[dict], family: str, target: float, key: str) -> dict[int, float]:
    """{seed: loss} of a family's runs at one target size (`key`: "bpb" or the choice loss)."""
    from rltok.analysis.scaling_fit import choice_loss

    return {int(r["seed"]): (choice_loss(r) if key == "select" else float(r["bpb"])) for r in records
            if r.get("family") == family and float(r["target_size"]) == target and r.get("bpb") is not None}


def _mean(d: dict[int, float], seeds) -> float | None:
    vals = [d[s] for s in seeds if s in d]
    return float(np.mean(vals)) if len(vals) == len(seeds) and vals else None


def score_check(grid: Grid, out: Path, budget: float, lr_mults=(0.5, 2.0), variants=(), tolerance: float = 0.02) -> dict:
    """The rule's rows (per corpus and family: the choice and test loss at each multiple, over the
    seeds every multiple ran, and whether the rule is within `tolerance` of the best) and the
    variants' rows (paired by seed against the family at the same size)."""
    from rltok.analysis.paired_stats import paired_difference
    from rltok.analysis.scaling_fit import to_plain

    rule_rows, variant_rows = [], []
    for corpus in grid.corpora:
        study = [r for r in read_records(out / corpus) if float(r["budget_flops"]) == budget]
        check = [r for r in read_records(out / FOLDER / corpus) if float(r["budget_flops"]) == budget]
        best = best_sizes(study, budget)
        for fam in grid.families:
            if fam.name not in best:
                continue
            target, n = best[fam.name]
            runs = {1.0: (study, fam.name), **{m: (check, lr_name(fam.name, m)) for m in lr_mults}}
            select = {m: _losses(recs, name, target, "select") for m, (recs, name) in runs.items()}
            test = {m: _losses(recs, name, target, "bpb") for m, (recs, name) in runs.items()}
            seeds = sorted(set.intersection(*(set(v) for v in select.values())))
            if not seeds:
                continue
            mults = sorted(runs)
            sel = [_mean(select[m], seeds) for m in mults]
            gap = sel[mults.index(1.0)] - min(sel)
            rule_rows.append({"corpus": corpus, "family": fam.name, "lr_mult": fam.lr_mult, "target_size": target,
                              "n": n, "seeds": seeds,
                              "mults": mults, "select": sel, "test": [_mean(test[m], seeds) for m in mults],
                              "rule_gap": gap, "holds": gap <= tolerance, "best_mult": mults[int(np.argmin(sel))]})
        for v in variants:
            if v.family not in best:
                continue
            target, n = best[v.family]
            row = {"corpus": corpus, "variant": v.name, "family": v.family, "overrides": list(v.overrides),
                   "target_size": target, "n": n}
            for key in ("select", "bpb"):
                a, b = _losses(check, v.name, target, key), _losses(study, v.family, target, key)
                try:
                    row[key] = to_plain(paired_difference(a, b, name_a=v.name, name_b=v.family))
                except ValueError as e:
                    row[key] = {"error": str(e)}
            sizes = [r["non_embedding_params"] for r in check if r.get("family") == v.name]
            row["variant_n"] = sizes[0] if sizes else None
            variant_rows.append(row)
    return {"budget": budget, "lr_mults": sorted([1.0, *lr_mults]), "tolerance": tolerance, "select_split": grid.select_split,
            "split": grid.split, "rule": rule_rows, "variants": variant_rows}


def check_markdown(result: dict, command: str | None = None, commit: str | None = None) -> str:
    mults = sorted(result["lr_mults"])
    sel, rep = result["select_split"] or result["split"], result["split"]
    lines = [f"# Checks at each family's optimum, budget {result['budget']:.3g} FLOPs", ""]
    if command:
        lines += [f"Command: `{command}`" + (f" (commit {commit})" if commit else ""), ""]
    lines += [f"## The learning-rate rule against {', '.join(f'{m:g}x' for m in mults if m != 1)} its rate", "",
              f"Each family at its best size (lowest mean {sel} bpb at this budget) and its rate (the rule's times "
              f"the family's lr_mult), the seeds every rate ran; "
              f"the rule holds where its {sel} bpb is within {result['tolerance']:g} of the best of the rates. "
              f"{rep} bpb for reference.", "",
              "| corpus | family | lr_mult | N | " + " | ".join(f"{sel} {m:g}x" for m in mults)
              + " | rule − best | holds | " + " | ".join(f"{rep} {m:g}x" for m in mults) + " |",
              "|---|---|---|---|" + "---|" * (2 * len(mults) + 2)]
    for r in result["rule"]:
        at = {key: dict(zip(r["mults"], r[key])) for key in ("select", "test")}  # rows kept from other runs may
        lines.append(f"| {r['corpus']} | {r['family']} | {r.get('lr_mult', 1):g} | {r['n']:,} | "  # lack a multiple
                     + " | ".join(number(at["select"].get(m), '.3f') for m in mults)
                     + f" | {number(r['rule_gap'], '+.3f')} | {'yes' if r['holds'] else 'no (best ' + format(r['best_mult'], 'g') + 'x)'} | "
                     + " | ".join(number(at["test"].get(m), '.3f') for m in mults) + " |")
    held = sum(r["holds"] for r in result["rule"])
    lines += ["", f"The rule holds for {held} of {len(result['rule'])} families."]
    if result["variants"]:
        lines += ["", "## Variants at the same size", "",
                  "Variant minus family, paired by seed (mean [95% t interval]).", "",
                  f"| corpus | variant | family | overrides | N | {sel} | {rep} |", "|---|---|---|---|---|---|---|"]
        for r in result["variants"]:
            cells = []
            for key in ("select", "bpb"):
                d = r[key]
                cells.append(d["error"] if "error" in d else f"{d['mean']:+.3f} [{number(d['lo'], '+.3f')}, "
                             f"{number(d['hi'], '+.3f')}] ({len(d['seeds'])} seeds)")
            lines.append(f"| {r['corpus']} | {r['variant']} | {r['family']} | {', '.join(r['overrides']) or '(defaults)'} "
                         f"| {r['n']:,} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def run_optimum_check(grid: Grid, out: Path, budget: float, lr_mults=(0.5, 2.0), variants=(),
                      tolerance: float = 0.02, log=print, runner=None, command: str | None = None) -> dict:
    """Run the check's points not done yet, score them and write OUT/optimum_check/<budget>.json
    and .md; the result."""
    from rltok.analysis.compare import git_commit

    if any(m <= 0 or m == 1 for m in lr_mults):
        raise ConfigError(f"--lr-mults {list(lr_mults)}: multiples of the rule's rate, > 0 and not 1")
    commit = git_commit()
    points = optimum_points(grid, out, budget, lr_mults, variants, log)
    splits = {c: corpus_split(grid, c, log) for c in grid.corpora}
    log(f"{len(points)} check points at {budget:g}")
    run_points(grid, points, out / FOLDER, splits, log, runner)
    result = score_check(grid, out, budget, lr_mults, variants, tolerance)
    folder = out / FOLDER
    stem = budget_tag(budget)
    # one process per corpus may run the check, or a check only some families: keep the rows of
    # the other corpora and of the families (and variants) this one did not check
    old = folder / f"{stem}.json"
    if old.exists():
        import json

        prev = json.loads(old.read_text())
        mine = {"rule": ("family", {f.name for f in grid.families}), "variants": ("variant", {v.name for v in variants})}
        for key, (field, names) in mine.items():
            result[key] = [r for r in prev.get(key, []) if r["corpus"] not in grid.corpora or r[field] not in names
                           ] + result[key]
    _write_json(folder / f"{stem}.json", {**result, "commit": commit, "command": command})
    (folder / f"{stem}.md").write_text(check_markdown(result, command, commit))
    return result
