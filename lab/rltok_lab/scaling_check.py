"""Checks at each family's optimum of one budget of the study.

The learning-rate rule: each family's best size (lowest mean choice loss, `scaling_fit.choice_loss`)
also runs at `lr_mults` times the rule's rate (0.5x and 2x by default) and, for a family whose
boundary rule has parameters of its own, at `policy_mults` times its policy's rate
(`objective.policy_lr_mult`), with the grid's seeds; the rule holds for a family where its run is
within `tolerance` bpb of the best of those settings on the selection split (a setting that
diverged counts as the worst), per corpus and over the corpora together. A budget is checked only
once it is complete: before, its best sizes may still move. Variants: the same size with other
overrides in place of the family's own (the flat model with full attention instead of its
window), compared paired by seed.

`optimum_points` names the runs, `run_optimum_check` runs those not done (resumable like every point
of the study) under OUT/optimum_check/<corpus>/ and scores them against the study's own runs at
that size (OUT/<corpus>/), writing OUT/optimum_check/<budget>.json and .md (`check_markdown`).
"""

from __future__ import annotations

import dataclasses
import math
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


def policy_name(family: str, mult: float) -> str:
    return f"{family}_plr{mult:g}"


def setting_label(kind: str, mult: float) -> str:
    """A setting's column: the model's rate ("lr 2x", "lr 1x" the study's own) or the policy's."""
    return f"{kind} {mult:g}x"


def rule_policy_lr(grid: Grid, fam) -> float | None:
    """The policy's rate multiple a family trains with, where its boundary rule has parameters of
    its own (what `objective.policy_lr_mult` scales); None where it has none."""
    from rltok.analysis.compare import method_overrides
    from rltok.analysis.scaling_grid import run_base
    from rltok.config import load_config
    from rltok.model.factory import planned_model

    cfg = load_config(grid.preset, overrides=[*run_base(grid, fam), *method_overrides(fam.method)])
    chunker = getattr(planned_model(cfg.model), "chunker", None)
    own = chunker is not None and any(p.numel() for p in chunker.parameters())
    return cfg.objective.policy_lr_mult if own else None


def best_sizes(records: list[dict], budget: float) -> dict[str, tuple[float, int]]:
    """{family: (target size, achieved N)} of the lowest mean choice loss at `budget`."""
    from rltok.analysis.scaling_fit import best_by_choice

    return best_by_choice([r for r in records if float(r["budget_flops"]) == budget],
                          key=lambda r: (float(r["target_size"]), int(r.get("ladder_params", r["non_embedding_params"]))))


def optimum_points(grid: Grid, out: Path, budget: float, lr_mults=(0.5, 2.0), variants=(), log=print,
                   policy_mults=()) -> list[Point]:
    """The check's runs: per corpus, each family's best size at `budget` at every lr multiple (and
    every policy-rate multiple where its rule has parameters), and each variant at its family's
    best size; the grid's seeds."""
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
        for fam in grid.families if policy_mults else ():
            plr = rule_policy_lr(grid, fam)
            specs += [(dataclasses.replace(fam, name=policy_name(fam.name, m),
                                           overrides=(*fam.overrides, f"objective.policy_lr_mult={plr * m!r}")), fam.name)
                      for m in policy_mults if plr is not None]
        same_model = len(specs)  # these train the family's own model; a variant may change it
        specs += [(dataclasses.replace(by_name[v.family], name=v.name, overrides=v.overrides), v.family)
                  for v in variants]
        for i, (spec, family) in enumerate(specs):
            if family not in best:
                log(f"{corpus} {spec.name}: {family} has no runs at {budget:g}: skipped")
                continue
            target, achieved = best[family]
            spec = dataclasses.replace(spec, sizes=(target,), size_coef=None)
            rung = family_rungs(grid, spec, [target])[round(target)]
            if rung.achieved != achieved and (i < same_model or spec.overrides == by_name[family].overrides):
                raise ConfigError(f"{corpus} {spec.name}: target {target:g} builds N {rung.achieved:,} here but "
                                  f"{achieved:,} in the study (the ladder changed since)")
            points += [Point(corpus, budget, spec, rung, seed, "check") for seed in grid.seeds]
    return points


def _losses(records: list[dict], family: str, target: float, key: str) -> dict[int, float]:
    """{seed: loss} of a family's runs at one target size (`key`: "bpb" or the choice loss); a run
    that diverged (no bpb) is infinitely bad, so a setting that breaks the model stays in the
    comparison as the worst instead of dropping its seed."""
    from rltok.analysis.scaling_fit import choice_loss

    return {int(r["seed"]): (math.inf if r.get("bpb") is None else choice_loss(r) if key == "select"
                             else float(r["bpb"]))
            for r in records if r.get("family") == family and float(r["target_size"]) == target}


def _mean(d: dict[int, float], seeds) -> float | None:
    vals = [d[s] for s in seeds if s in d]
    return float(np.mean(vals)) if len(vals) == len(seeds) and vals else None


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: a diverged setting's mean is written as None (and named in `diverged`)."""
    return x if x is None or math.isfinite(x) else None


def score_check(grid: Grid, out: Path, budget: float, lr_mults=(0.5, 2.0), variants=(), tolerance: float = 0.02,
                policy_mults=()) -> dict:
    """The rule's rows (per corpus and family: the choice and test loss at each setting, over the
    seeds every setting ran, and whether the rule is within `tolerance` of the best) and the
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
            runs = {setting_label("lr", 1.0): (study, fam.name),
                    **{setting_label("lr", m): (check, lr_name(fam.name, m)) for m in lr_mults}}
            plr = [m for m in policy_mults if _losses(check, policy_name(fam.name, m), target, "select")]
            runs.update({setting_label("policy", m): (check, policy_name(fam.name, m)) for m in plr})
            select = {k: _losses(recs, name, target, "select") for k, (recs, name) in runs.items()}
            test = {k: _losses(recs, name, target, "bpb") for k, (recs, name) in runs.items()}
            seeds = sorted(set.intersection(*(set(v) for v in select.values())))
            if not seeds:
                continue
            labels = sorted(runs, key=lambda k: (k.startswith("policy"), float(k.split()[1][:-1])))
            sel = {k: _mean(select[k], seeds) for k in labels}
            top = min(labels, key=lambda k: sel[k])
            gap = sel[setting_label("lr", 1.0)] - sel[top]  # inf where 1x diverged; NaN where all did
            mults = sorted([1.0, *lr_mults])
            rule_rows.append({"corpus": corpus, "family": fam.name, "lr_mult": fam.lr_mult, "target_size": target,
                              "n": n, "seeds": seeds, "mults": mults,
                              "select": [_finite(sel[setting_label("lr", m)]) for m in mults],
                              "test": [_finite(_mean(test[setting_label("lr", m)], seeds)) for m in mults],
                              "policy_mults": plr,
                              "policy_select": [_finite(sel[setting_label("policy", m)]) for m in plr],
                              "policy_test": [_finite(_mean(test[setting_label("policy", m)], seeds)) for m in plr],
                              "diverged": [k for k in labels if sel[k] == math.inf],
                              "rule_gap": _finite(gap), "holds": bool(gap <= tolerance), "best": top,
                              "best_mult": float(top.split()[1][:-1]) if top.startswith("lr") else None})
        for v in variants:
            if v.family not in best:
                continue
            target, n = best[v.family]
            row = {"corpus": corpus, "variant": v.name, "family": v.family, "overrides": list(v.overrides),
                   "target_size": target, "n": n}
            for key in ("select", "bpb"):  # paired over the seeds both finished; a diverged seed is named
                a, b = _losses(check, v.name, target, key), _losses(study, v.family, target, key)
                row.setdefault("diverged_seeds", sorted(s for s, x in a.items() if x == math.inf))
                a, b = ({s: x for s, x in d.items() if math.isfinite(x)} for d in (a, b))
                try:
                    row[key] = to_plain(paired_difference(a, b, name_a=v.name, name_b=v.family))
                except ValueError as e:
                    row[key] = {"error": str(e)}
            sizes = [r["non_embedding_params"] for r in check if r.get("family") == v.name]
            row["variant_n"] = sizes[0] if sizes else None
            variant_rows.append(row)
    return {"budget": budget, "lr_mults": sorted([1.0, *lr_mults]), "policy_mults": sorted(policy_mults),
            "tolerance": tolerance, "select_split": grid.select_split, "split": grid.split, "rule": rule_rows,
            "variants": variant_rows}


def _settings(row: dict, key: str) -> dict[str, float | None]:
    """{label: loss} of a rule row (`key`: "select" or "test"), the model's and the policy's rates."""
    out = {setting_label("lr", m): v for m, v in zip(row["mults"], row[key])}
    out.update({setting_label("policy", m): v for m, v in zip(row.get("policy_mults", []), row.get(f"policy_{key}", []))})
    return out


def pooled_decisions(rows: list[dict], tolerance: float) -> list[dict]:
    """Per family, each setting's selection loss averaged over the corpora whose rows have it (a
    diverged one is the worst), and whether the study's own setting (lr 1x) is within `tolerance`
    of the best: the decision a study written to read both corpora together takes."""
    out = []
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        per = [{**_settings(r, "select"), **{k: math.inf for k in r.get("diverged", [])}} for r in mine]
        labels = [k for k in per[0] if all(k in p for p in per)]
        mean = {k: float(np.mean([math.inf if p[k] is None else p[k] for p in per])) for k in labels}
        best = min(labels, key=lambda k: mean[k])
        gap = mean[setting_label("lr", 1.0)] - mean[best]
        out.append({"family": family, "corpora": [r["corpus"] for r in mine], "select": {k: _finite(v) for k, v in mean.items()},
                    "diverged": [k for k in labels if mean[k] == math.inf], "best": best, "rule_gap": _finite(gap),
                    "keeps": bool(gap <= tolerance)})
    return out


def check_markdown(result: dict, command: str | None = None, commit: str | None = None) -> str:
    mults = sorted(result["lr_mults"])
    pmults = sorted(result.get("policy_mults", []))
    sel, rep = result["select_split"] or result["split"], result["split"]
    labels = [setting_label("lr", m) for m in mults] + [setting_label("policy", m) for m in pmults]
    lines = [f"# Checks at each family's optimum, budget {result['budget']:.3g} FLOPs", ""]
    if command:
        lines += [f"Command: `{command}`" + (f" (commit {commit})" if commit else ""), ""]
    policy = (f" and its policy's rate at {', '.join(f'{m:g}x' for m in pmults)} (`objective.policy_lr_mult`, "
              "where the boundary rule has parameters of its own)") if pmults else ""
    lines += [f"## The learning-rate rule against {', '.join(f'{m:g}x' for m in mults if m != 1)} its rate{policy}", "",
              f"Each family at its best size (lowest mean {sel} bpb at this budget) and its rate (the rule's times "
              f"the family's lr_mult), the seeds every setting ran; "
              f"the rule holds where its {sel} bpb is within {result['tolerance']:g} of the best setting "
              f"(\"diverged\": a setting whose run broke down, the worst). {rep} bpb for reference.", "",
              "| corpus | family | lr_mult | N | " + " | ".join(f"{sel} {k}" for k in labels)
              + " | rule − best | holds | " + " | ".join(f"{rep} {k}" for k in labels) + " |",
              "|---|---|---|---|" + "---|" * (2 * len(labels) + 2)]

    def cell(r: dict, values: dict, k: str) -> str:
        return "diverged" if k in r.get("diverged", []) else number(values.get(k), '.3f')

    for r in result["rule"]:  # rows kept from other runs may lack a setting
        at = {key: _settings(r, key) for key in ("select", "test")}
        best = r.get("best") or setting_label("lr", r["best_mult"])
        lines.append(f"| {r['corpus']} | {r['family']} | {r.get('lr_mult', 1):g} | {r['n']:,} | "
                     + " | ".join(cell(r, at["select"], k) for k in labels)
                     + f" | {number(r['rule_gap'], '+.3f')} | {'yes' if r['holds'] else f'no (best {best})'} | "
                     + " | ".join(cell(r, at["test"], k) for k in labels) + " |")
    held = sum(r["holds"] for r in result["rule"])
    lines += ["", f"The rule holds for {held} of {len(result['rule'])} families."]
    pooled = pooled_decisions(result["rule"], result["tolerance"])
    if len({c for r in result["rule"] for c in [r["corpus"]]}) > 1:
        lines += ["", "## Over the corpora together", "",
                  f"Each setting's {sel} bpb averaged over the corpora (each corpus the mean over its seeds); the "
                  f"family keeps the study's rate where lr 1x is within {result['tolerance']:g} of the best.", "",
                  "| family | corpora | " + " | ".join(f"{sel} {k}" for k in labels) + " | rule − best | keeps |",
                  "|---|---|" + "---|" * (len(labels) + 2)]
        for d in pooled:
            lines.append(f"| {d['family']} | {', '.join(d['corpora'])} | "
                         + " | ".join("diverged" if k in d["diverged"] else number(d["select"].get(k), '.3f')
                                      for k in labels)
                         + f" | {number(d['rule_gap'], '+.3f')} | {'yes' if d['keeps'] else 'no (best ' + d['best'] + ')'} |")
        lines += ["", f"The study's rate is kept for {sum(d['keeps'] for d in pooled)} of {len(pooled)} families."]
    if result["variants"]:
        lines += ["", "## Variants at the same size", "",
                  "Variant minus family, paired by seed (mean [95% t interval]).", "",
                  f"| corpus | variant | family | overrides | N | {sel} | {rep} |", "|---|---|---|---|---|---|---|"]
        for r in result["variants"]:
            cells = []
            for key in ("select", "bpb"):
                d = r[key]
                cells.append(d["error"] if "error" in d else f"{number(d['mean'], '+.3f')} [{number(d['lo'], '+.3f')}, "
                             f"{number(d['hi'], '+.3f')}] ({len(d['seeds'])} seeds)"
                             + (f"; diverged: seed {', '.join(map(str, r['diverged_seeds']))}" if r.get("diverged_seeds") else ""))
            lines.append(f"| {r['corpus']} | {r['variant']} | {r['family']} | {', '.join(r['overrides']) or '(defaults)'} "
                         f"| {r['n']:,} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def run_optimum_check(grid: Grid, out: Path, budget: float, lr_mults=(0.5, 2.0), variants=(),
                      tolerance: float = 0.02, log=print, runner=None, command: str | None = None,
                      policy_mults=()) -> dict:
    """Run the check's points not done yet, score them and write OUT/optimum_check/<budget>.json
    and .md; the result. Refused while the budget is not complete in a corpus checked."""
    from rltok.analysis.compare import git_commit
    from rltok_lab.scaling_status import budget_complete

    if any(m <= 0 or m == 1 for m in (*lr_mults, *policy_mults)):
        raise ConfigError(f"--lr-mults {list(lr_mults)} / --policy-lr-mults {list(policy_mults)}: multiples of a "
                          "rate, > 0 and not 1")
    for corpus in grid.corpora:
        if budget_complete(grid, out, corpus, budget) is not True:
            raise ConfigError(f"{corpus}: the study at {budget:g} is not complete (or its data cannot be read): its "
                              "best sizes may still move; finish it first (`study --status` says where it stands)")
    commit = git_commit()
    points = optimum_points(grid, out, budget, lr_mults, variants, log, policy_mults)
    splits = {c: corpus_split(grid, c, log) for c in grid.corpora}
    log(f"{len(points)} check points at {budget:g}")
    run_points(grid, points, out / FOLDER, splits, log, runner)
    result = score_check(grid, out, budget, lr_mults, variants, tolerance, policy_mults)
    folder = out / FOLDER
    stem = budget_tag(budget)
    # one process per corpus may run the check, or a check only some families: keep the rows of
    # the other corpora and of the families (and variants) this one did not check, read and
    # rewritten under a lock so two corpora finishing together keep each other's
    from rltok_lab.scaling_holdout import _exclusive

    old = folder / f"{stem}.json"
    with _exclusive(folder / f".{stem}.json.lock"):
        if old.exists():
            import json

            prev = json.loads(old.read_text())
            mine = {"rule": ("family", {f.name for f in grid.families}), "variants": ("variant", {v.name for v in variants})}
            for key, (field, names) in mine.items():
                result[key] = [r for r in prev.get(key, []) if r["corpus"] not in grid.corpora or r[field] not in names
                               ] + result[key]
            result["policy_mults"] = sorted({*prev.get("policy_mults", []), *result["policy_mults"]})
        result["pooled"] = pooled_decisions(result["rule"], tolerance)  # over every corpus's rows kept
        _write_json(folder / f"{stem}.json", {**result, "commit": commit, "command": command})
        (folder / f"{stem}.md").write_text(check_markdown(result, command, commit))
    return result
