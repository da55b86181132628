"""The study's summaries across corpora, which `lab/scripts/scaling_results.py` writes into the README
and lab/reports/SCALING.md:
- the headline table (`summary_table`): each family at its best size of one budget, every corpus
  side by side, with its non-embedding parameters and inference FLOPs per byte;
- the paired verdicts of one budget (`paired_table`), per corpus and pooled (`pool_differences`);
- SCALING.md's study block (`study_block`): per corpus each family's best loss at every budget
  (`budget_matrix`), the envelopes, crossovers and reference-scale extrapolation, then the
  verdicts per budget; and the machine time of every folder of records (`machine_table`).
The best size is chosen on the selection split (`scaling_fit.best_by_choice`) and its loss
reported on the scored split, so no number is a minimum taken over the split it reports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rltok.analysis.scaling import read_records
from rltok.analysis.scaling_fit import best_by_choice, record_family, record_size


@dataclasses.dataclass(frozen=True)
class BestRun:
    """One family's best size at one budget of one corpus."""
    family: str
    corpus: str
    budget: float
    size: float
    mean: float  # scored split, over `seeds`
    sd: float | None
    seeds: tuple[int, ...]
    inference_flops_per_byte: float | None


def best_runs(records: list[dict], budget: float, corpus: str) -> dict[str, BestRun]:
    """{family: its best run} at `budget` (families with no finished run there are absent)."""
    here = [r for r in records if r.get("bpb") is not None and float(r["budget_flops"]) == budget]
    out = {}
    for family, size in best_by_choice(here).items():
        runs = [r for r in here if record_family(r) == family and record_size(r) == size]
        runs = sorted(runs, key=lambda r: r["seed"])
        losses = [float(r["bpb"]) for r in runs]
        flops = [r["forward_flops_per_byte"] for r in runs if r.get("forward_flops_per_byte")]
        out[family] = BestRun(family, corpus, budget, size, float(np.mean(losses)),
                              float(np.std(losses, ddof=1)) if len(losses) > 1 else None,
                              tuple(int(r["seed"]) for r in runs), float(np.mean(flops)) if flops else None)
    return out


def common_budget(folders: dict[str, Path], families: list[str] | None = None,
                  among: Iterable[float] | None = None) -> float | None:
    """The largest budget (of `among`, when given: e.g. a grid's complete budgets) at which every
    corpus has runs of every family (of `families`, or of those the corpora share)."""
    per = {}
    for corpus, folder in folders.items():
        per[corpus] = {}
        for r in read_records(folder):
            if r.get("bpb") is not None:
                per[corpus].setdefault(float(r["budget_flops"]), set()).add(record_family(r))
    if not per:
        return None
    wanted = set(families) if families else set.intersection(*(set().union(*b.values()) if b else set()
                                                                 for b in per.values()))
    allowed = None if among is None else {float(b) for b in among}
    shared = [b for b in set.intersection(*(set(b) for b in per.values()))
              if all(wanted <= per[c][b] for c in per) and (allowed is None or b in allowed)]
    return max(shared) if shared and wanted else None


def summary_table(folders: dict[str, Path], budget: float | None = None, families: list[str] | None = None,
                  labels: dict[str, str] | None = None) -> tuple[float, str]:
    """(the budget, markdown): a row per family (in `families` order, else by the first corpus's
    loss); per corpus the scored loss at the best size, mean ± sd (seeds) with the lowest in bold,
    its N and its inference FLOPs per byte."""
    budget = budget if budget is not None else common_budget(folders, families)
    if budget is None:
        raise ValueError("no budget at which every corpus has runs of every family")
    best = {c: best_runs(read_records(f), budget, c) for c, f in folders.items()}
    first = next(iter(folders))
    order = families or sorted(best[first], key=lambda fam: best[first][fam].mean)
    lowest = {c: min(b[f].mean for f in order if f in b) for c, b in best.items()}
    lines = ["| model | " + " | ".join(f"{c} bpb | N | FLOPs/byte" for c in folders) + " |",
             "|---|" + "---|---|---|" * len(folders)]
    for fam in order:
        cells = []
        for c in folders:
            run = best[c].get(fam)
            if run is None:
                cells += ["–", "–", "–"]
                continue
            sd = f" ± {run.sd:.3f}" if run.sd is not None else ""
            text = f"{run.mean:.3f}{sd} ({len(run.seeds)})"
            flops = "–" if run.inference_flops_per_byte is None else f"{run.inference_flops_per_byte:,.0f}"
            cells += [f"**{text}**" if run.mean == lowest[c] else text, f"{run.size:,.0f}", flops]
        lines.append(f"| {(labels or {}).get(fam, fam)} | " + " | ".join(cells) + " |")
    return budget, "\n".join(lines)


def pool_differences(cells: list[dict], level: float = 0.95) -> dict | None:
    """Several paired differences (fits.json `difference`s: mean, sd, seeds) as one sample of
    every seed's difference: the pooled mean and its t interval; None when fewer than 2 runs.
    The interval treats the runs as exchangeable, so it holds where the cells agree (as their
    means show) and is too narrow where they differ for reasons of their own."""
    import math

    from rltok.analysis.paired_stats import t_quantile

    cells = [c for c in cells if c is not None]
    n = sum(len(c["seeds"]) for c in cells)
    if n < 2:
        return None
    mean = sum(len(c["seeds"]) * c["mean"] for c in cells) / n
    ss = sum((len(c["seeds"]) - 1) * (c.get("sd") or 0.0) ** 2 + len(c["seeds"]) * (c["mean"] - mean) ** 2 for c in cells)
    half = t_quantile(0.5 + level / 2, n - 1) * math.sqrt(ss / (n - 1)) / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "cells": len(cells)}


def format_difference(d: dict | None) -> str:
    """A paired difference (or a pooled one) as `mean [lo, hi] (count)`; – for none."""
    if d is None:
        return "–"
    count = d.get("n", len(d.get("seeds", ())))
    bounded = d.get("lo") is not None and math.isfinite(d["lo"]) and math.isfinite(d["hi"])  # one seed: no interval
    return f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] ({count})" if bounded else f"{d['mean']:+.3f} ({count})"


def paired_table(fits: dict[str, dict], budget: float, labels: dict[str, str] | None = None,
                 pools: dict[str, list[tuple[str, str]]] | None = None) -> str:
    """Markdown: per pair of the study's report (fits.json `paired`), a − b at `budget` for each
    corpus, paired by seed at each side's best size, with its t interval and the seed count, and
    every corpus's seeds pooled (`pool_differences`); then each of `pools` ({label: [pairs]}), the
    pairs' differences pooled over corpora and pairs. "" where no corpus has a pair at `budget`."""
    rows: dict = {}
    for corpus, fit in fits.items():
        for p in fit.get("paired", []):
            if float(p["budget"]) == budget:
                rows.setdefault((p["a"], p["b"]), {})[corpus] = p.get("difference")
    if not rows:
        return ""
    name = (labels or {}).get
    lines = ["| a − b | " + " | ".join(fits) + " | pooled |", "|---|" + "---|" * (len(fits) + 1)]
    for (a, b), cells in rows.items():
        present = [d for d in cells.values() if d is not None]
        pooled = pool_differences(present) if len(present) > 1 else None
        lines.append(f"| {name(a, a)} − {name(b, b)} | " + " | ".join(format_difference(cells.get(c)) for c in fits)
                     + f" | {format_difference(pooled)} |")
    for label, pairs in (pools or {}).items():
        members = [rows[pair][c] for pair in pairs if pair in rows for c in fits if c in rows[pair]]
        pooled = pool_differences(members)
        if pooled is not None:
            lines.append(f"| {label} | " + " | ".join("–" for _ in fits) + f" | {format_difference(pooled)} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- lab/reports/SCALING.md's study block

def budget_matrix(rep, budgets, families: list[str], labels: dict[str, str] | None = None) -> str:
    """Markdown from a `StudyReport`: a row per family (or group), a column per budget; each cell
    the scored loss at the best size (chosen on the selection split, `best_index`), mean over its
    seeds, and that size. "N ≤" / "N ≥" mark a best size that is the smallest / largest one run
    at that budget: the optimum may lie beyond it, so the loss there bounds L* and is no minimum."""
    from rltok.analysis.scaling_report import best_index

    budgets = sorted(float(b) for b in budgets)
    lines = ["| model | " + " | ".join(f"{b:.3g}" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
    for fam in families:
        cells = []
        for b in budgets:
            profile = rep.profiles.get(fam, {}).get(b)
            if profile is None:
                cells.append("–")
                continue
            i = best_index(rep, fam, b)
            size = float(profile.sizes[i])
            edge = " ≤" if size == profile.sizes.min() else (" ≥" if size == profile.sizes.max() else "")
            cells.append(f"{profile.means[i]:.3f} (N{edge} {_short(size)}; {len(profile.seeds[i])} seeds)")
        lines.append(f"| {(labels or {}).get(fam, fam)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _short(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else (f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}")


def machine_hours(root: Path, pattern: str = "C*__*__N*__s*.json") -> list[tuple[str, int, float, int]]:
    """(folder relative to `root`, runs, machine-hours, runs timed by their training only) for
    every folder under `root` holding run records (never a run's own `runs/` folder), by
    `scaling_report.record_seconds`."""
    import json

    from rltok.analysis.scaling_report import record_seconds

    per: dict = {}
    for path in sorted(Path(root).rglob(pattern)):
        rel = path.parent.relative_to(root)
        if "runs" in rel.parts:
            continue
        secs, only = record_seconds(json.loads(path.read_text()))
        runs, total, partial = per.get(str(rel), (0, 0.0, 0))
        per[str(rel)] = (runs + 1, total + (secs or 0.0), partial + only)
    return [(k, n, s / 3600.0, only) for k, (n, s, only) in sorted(per.items())]


def machine_table(root: Path) -> str:
    rows = machine_hours(root)
    lines = [f"| records under `{root}` | runs | machine-hours | runs timed by their training only |",
             "|---|---|---|---|"]
    lines += [f"| {k} | {n} | {h:.2f} | {only} |" for k, n, h, only in rows]
    lines.append(f"| **all** | {sum(r[1] for r in rows)} | {sum(r[2] for r in rows):.2f} | {sum(r[3] for r in rows)} |")
    return "\n".join(lines)


def _held_out_progress(grid, folders: dict[str, Path]) -> dict[float, tuple[int, int]]:
    """{holdout budget: (runs done, runs planned)} over the corpora, once a prediction exists."""
    from rltok_lab.scaling_status import holdout_status

    out = {}
    roots = {folder.parent for folder in folders.values()}
    for root in roots:
        for r in holdout_status(grid, root):
            done, planned = out.get(r["budget"], (0, 0))
            out[r["budget"]] = (done + r["done"], planned + r["planned"])
    return out


def study_block(grid, folders: dict[str, Path], labels: dict[str, str] | None = None, n_boot: int | None = None,
                pools: dict[str, list[tuple[str, str]]] | None = None) -> str:
    """lab/reports/SCALING.md's results: per corpus, each family's best loss per budget with its size,
    the envelopes with their intervals, the crossovers and what the fits imply at the reference's
    scale; then per budget the paired verdicts of both corpora (`paired_table`, with `pools`);
    from the same `build_report` as each corpus's report.md (so the numbers agree)."""
    from rltok_lab.scaling_holdout import holdout_paired
    from rltok.analysis.scaling_report import (build_report, crossover_table, envelope_table, reference_table,
                                               report_plain)

    families = [f.name for f in grid.families]
    parts, plain = [], {}
    for corpus, folder in folders.items():
        rep = build_report(read_records(folder), grid.groups, grid.crossovers, corpus, n_boot or grid.n_boot,
                           budgets=grid.budgets, interior_only=grid.interior_only, fit_from=grid.fit_from)
        plain[corpus] = report_plain(rep)
        plain[corpus]["paired"] += holdout_paired(grid, folder)  # the held-out budgets', where run
        ref = rep.reference_scale
        parts += [f"### {corpus}", "",
                  "Test bpb at each family's best size (chosen on val), mean over seeds; N: non-embedding "
                  "parameters (N ≤ / N ≥: the smallest / largest size run, so a bound rather than a minimum).", "",
                  budget_matrix(rep, grid.budgets, families + list(grid.groups), labels), "",
                  "Envelopes, L*(C) = E + A·C^(−alpha) and N*(C) = k·C^a, bootstrap 95% intervals:", "",
                  envelope_table(rep), "", "Crossovers:", "",
                  crossover_table(rep) if rep.crossovers else "No pairs in the grid.", "",
                  f"Extrapolated to the reference's scale ({ref.flops:.3g} FLOPs; the reference models have "
                  f"{ref.params / 1e6:.0f}M parameters and see {ref.bytes:.3g} bytes), not measured:", "",
                  reference_table(rep) if rep.reference else "No envelope to extrapolate yet.", ""]
    held = {float(b) for b in grid.holdout_budgets}
    verdicts = [(b, paired_table(plain, b, labels, pools)) for b in sorted({*map(float, grid.budgets), *held})]
    if any(table for _, table in verdicts):
        parts += ["### Paired verdicts per budget", "",
                  "Test bpb of a minus b at each side's best size (chosen on val), paired by seed, mean [95% t "
                  "interval] (seeds); pooled: every seed's difference of both corpora as one sample. At a "
                  "held-out budget each side ran at its predicted size alone.", ""]
        progress = _held_out_progress(grid, folders) if held else {}
        for budget, table in verdicts:
            if table:
                note = ""
                if budget in held:
                    done, planned = progress.get(budget, (0, 0))
                    note = " (held out: each side at its predicted size" + (
                        f"; {done} of {planned} runs done so far" if done < planned else "") + ")"
                parts += [f"At {budget:.3g} FLOPs{note}:", "", table, ""]
    return "\n".join(parts).rstrip("\n")
