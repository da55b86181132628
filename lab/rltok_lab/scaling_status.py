"""Where a study stands, for a study that runs over many sessions: per corpus and budget, the
ladder points done out of the grid's, the adaptive runs done so far (extensions, optimum and
verdict seeds), whether the budget is complete (a dry run of the study finds nothing left to run
there), the mean time of its runs, and the time left, estimated. Trains nothing.

The estimate, per family: its ladder points times the ratio of all runs to ladder runs at the
largest complete budget (the adaptive steps cannot be known before the ladder's results; with no
complete budget, the ladder alone, and said so), less the runs it has, times its mean seconds per
run at this budget, or, before it has one, its mean at the largest budget below times the budget
ratio (a run's time grows about in proportion to its FLOPs here: 1.4-1.9x per 1.7-2x of budget,
4.8x per 3x for the smallest flat shape from 1e12 to 3e12), or, for a family with no run at this
budget or below (one added to a grid under way), the other families' mean here, or at the largest
budget below that has runs, times the budget ratio. At least one run is left while a budget is not
complete.

Once the prediction exists, `holdout_status` does the same for the held-out budgets: the runs its
predicted sizes call for (`scaling_holdout.holdout_points`), those done, and the time left, per
family its finished held-out runs' mean time (a diverged run stops early), or before its first,
from its runs at the largest budget of the grid it ran: their seconds per training FLOP as a power
of N (`per_flop_seconds`), at the point's own N, times the held-out budget. A held-out run is one
size, not a ladder, so the ladder's mean is the wrong base. Read back in the rivals study
(`lab/scripts/time_estimate_backtest.py`), the fit from 1e12's runs put docs-en's 3e12 6% under its
measured time and code-py's first 92 runs there 10% under, where the ladder's mean times the budget
ratio put them 22% and 18% over; from 6e11's runs to 1e12 both overestimate, the fit by 31-33%, the
mean by 77-84%. With fewer than two sizes timed, the mean times the budget ratio.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rltok.analysis.scaling import Grid, budget_tag, grid_points, point_done, read_records
from rltok.analysis.table_cells import number
from rltok.config import ConfigError
from rltok.data.sources import DataError

KINDS = ("ladder", "extension", "optimum", "verdict")


def run_seconds(rec: dict) -> float | None:
    return rec.get("point_wall_s", rec.get("wall_s"))


def _family_seconds(records: list[dict]) -> dict[str, float]:
    """{family: mean seconds per run} over the records that have a time."""
    by: dict[str, list[float]] = {}
    for r in records:
        seconds = run_seconds(r)
        if seconds:
            by.setdefault(r.get("family"), []).append(seconds)
    return {f: sum(v) / len(v) for f, v in by.items()}


def timed_runs(records: list[dict]) -> list[dict]:
    """The study's own scored runs that have a time: a learning-rate check or a diverged run (it
    stops early) says nothing of what the study's next run will take."""
    return [r for r in records if r.get("bpb") is not None and r.get("point_kind", "ladder") in KINDS
            and run_seconds(r)]


def per_flop_seconds(records: list[dict], budget: float) -> Callable[[float], float] | None:
    """Seconds per training FLOP against N, from one family's timed runs at one budget: a line in
    log-log fitted by least squares (a run's time per FLOP grows with its width and depth, not
    with the budget). None with fewer than two sizes."""
    rs = [r for r in records if run_seconds(r) and r.get("non_embedding_params")]
    x = np.log([float(r["non_embedding_params"]) for r in rs])
    if len(set(x)) < 2:
        return None
    slope, intercept = np.polyfit(x, np.log([run_seconds(r) / budget for r in rs]), 1)
    return lambda n: math.exp(intercept + slope * math.log(n))


def budget_complete(grid: Grid, out: Path, corpus: str, budget: float) -> bool | None:
    """Whether a dry run of the study finds nothing left to run at one corpus and budget (None where
    the corpus's data cannot be read, so the dry run cannot tell)."""
    from rltok_lab.scaling_holdout import pending_point

    one = dataclasses.replace(grid, corpora={corpus: grid.corpora[corpus]}, budgets=(budget,))
    try:
        return pending_point(one, out) is None
    except (ConfigError, DataError, OSError):
        return None


def unfinished_budgets(grid: Grid, out: Path) -> list[tuple[str, float]]:
    """(corpus, budget) of the grid's budgets that have runs but are not complete, or whose
    completeness cannot be told (the corpus's data unreadable): their fits may be provisional (a
    partial ladder fits its own parabola)."""
    out_list = []
    for corpus in grid.corpora:
        folder = out / corpus
        started = {float(r["budget_flops"]) for r in read_records(folder)} if folder.is_dir() else set()
        out_list += [(corpus, b) for b in grid.budgets if b in started and budget_complete(grid, out, corpus, b) is not True]
    return out_list


def budget_status(grid: Grid, out: Path, corpus: str, budget: float) -> dict:
    """One corpus and budget: counts per kind of run, completeness (None where the corpus's data
    cannot be read, so the dry run cannot tell), mean seconds per run, overall and per family."""
    one = dataclasses.replace(grid, corpora={corpus: grid.corpora[corpus]}, budgets=(budget,))
    ladder = grid_points(one, log=lambda message: None)
    folder = out / corpus
    records = read_records(folder, f"{budget_tag(budget)}__*__N*__s*.json") if folder.is_dir() else []
    records = [r for r in records if r.get("point_kind", "ladder") in KINDS]
    seconds = [s for s in map(run_seconds, records) if s]
    done = {kind: sum(1 for r in records if r.get("point_kind", "ladder") == kind) for kind in KINDS}
    complete = budget_complete(grid, out, corpus, budget)
    ladder_by_family = Counter(p.family.name for p in ladder)
    return {"corpus": corpus, "budget": budget, "ladder_total": len(ladder),
            "ladder_done": sum(point_done(out, p) for p in ladder), "done": done, "runs": len(records),
            "complete": complete, "mean_s": sum(seconds) / len(seconds) if seconds else None,
            "hours": sum(seconds) / 3600, "ladder_by_family": ladder_by_family,
            "runs_by_family": {f: sum(1 for r in records if r.get("family") == f) for f in ladder_by_family},
            "family_s": _family_seconds(records)}


def _left_hours(row: dict, below: list[dict], ratio: float | None) -> float | None:
    """The estimate of the module docstring for one corpus and budget; None where no run of a
    family has a time at this budget or any below it."""
    total = 0.0
    nearest_first = sorted(below, key=lambda b: -b["budget"])
    for fam, n_ladder in row["ladder_by_family"].items():
        left = n_ladder * (ratio or 1.0) - row["runs_by_family"].get(fam, 0)
        if left <= 0:
            continue
        mean = row["family_s"].get(fam)
        if mean is None:
            prev = next((b for b in nearest_first if fam in b["family_s"]), None)
            if prev is not None:
                mean = prev["family_s"][fam] * row["budget"] / prev["budget"]
            else:  # a family added to a grid under way: the others' mean, here or at the nearest budget below
                ref = row if row["family_s"] else next((b for b in nearest_first if b["family_s"]), None)
                if ref is None:
                    return None
                mean = sum(ref["family_s"].values()) / len(ref["family_s"]) * row["budget"] / ref["budget"]
        total += left * mean
    if total == 0.0:  # not complete, yet the ladders look done: the adaptive runs left are at least one
        means = list(row["family_s"].values())
        total = sum(means) / len(means) if means else 0.0
    return total / 3600


def study_status(grid: Grid, out: Path) -> list[dict]:
    """Every corpus and budget of the grid (holdout budgets excepted), with the time left estimated."""
    rows = [budget_status(grid, out, corpus, budget) for corpus in grid.corpora for budget in grid.budgets]
    for corpus in grid.corpora:
        mine = [r for r in rows if r["corpus"] == corpus]
        finished = [r for r in mine if r["complete"] and r["ladder_done"]]
        largest = max(finished, key=lambda r: r["budget"]) if finished else None
        ratio = largest["runs"] / largest["ladder_done"] if largest else None
        for r in mine:
            r["adaptive_ratio"] = ratio
            below = [b for b in mine if b["budget"] < r["budget"]]
            r["left_hours"] = 0.0 if r["complete"] else _left_hours(r, below, ratio)
    return rows


def status_table(rows: list[dict]) -> str:
    """Markdown: one row per corpus and budget."""
    lines = ["| corpus | budget | ladder | extensions | optimum seeds | verdict seeds | complete | s / run "
             "| machine-hours | left (est.) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        left = "–" if r["complete"] else (number(r["left_hours"], ".1f") + " h")
        complete = {True: "yes", False: "no", None: "? (no data)"}[r["complete"]]
        lines.append(f"| {r['corpus']} | {budget_tag(r['budget'])} | {r['ladder_done']}/{r['ladder_total']} "
                     f"| {r['done']['extension']} | {r['done']['optimum']} | {r['done']['verdict']} "
                     f"| {complete} | {number(r['mean_s'], '.0f')} | {r['hours']:.2f} "
                     f"| {left} |")
    ratios = {r["corpus"]: r["adaptive_ratio"] for r in rows}
    notes = [f"{c}: x{v:.2f}" if v else f"{c}: ladder only (no complete budget yet)" for c, v in ratios.items()]
    lines += ["", "Time left, per family: its ladder scaled by all runs / ladder runs at the largest complete "
              f"budget for the adaptive steps ({'; '.join(notes)}), less its runs, times its seconds per run at "
              "this budget (before its first: at the budget below, times the budget ratio). Machine-hours: one "
              "core each."]
    return "\n".join(lines)


def holdout_status(grid: Grid, out: Path) -> list[dict]:
    """Per corpus and holdout budget with points to run: the held-out runs planned, done, their
    machine-hours and the time left, estimated; [] before the prediction is written."""
    from rltok_lab.scaling_holdout import PREDICTION, holdout_points, load_prediction

    if not grid.holdout_budgets or not (out / PREDICTION).is_file():
        return []
    points = holdout_points(grid, load_prediction(out), log=lambda message: None)
    rows = []
    for corpus in grid.corpora:
        folder = out / corpus
        # {family: (the largest grid budget it has timed runs at, their mean seconds, the fit of
        # their seconds per FLOP on N or None)}
        before: dict[str, tuple[float, float, Callable[[float], float] | None]] = {}
        for b in sorted(grid.budgets) if folder.is_dir() else []:
            timed = timed_runs(read_records(folder, f"{budget_tag(b)}__*__N*__s*.json"))
            for fam, mean in _family_seconds(timed).items():
                before[fam] = (b, mean, per_flop_seconds([r for r in timed if r.get("family") == fam], b))
        for budget in grid.holdout_budgets:
            mine = [p for p in points if p.corpus == corpus and p.budget == budget]
            if not mine:
                continue
            records = [r for r in (read_records(folder, f"{budget_tag(budget)}__*__N*__s*.json")
                                   if folder.is_dir() else []) if r.get("point_kind") == "holdout"]
            seconds = [s for s in map(run_seconds, records) if s]
            family_s = _family_seconds([r for r in records if r.get("bpb") is not None])
            finished = [point_done(out, p) for p in mine]
            left, unknown = 0.0, False
            for p in (p for p, done in zip(mine, finished) if not done):
                mean = family_s.get(p.family.name)
                if mean is None and p.family.name in before:
                    below, below_s, fit = before[p.family.name]
                    mean = fit(p.rung.achieved) * budget if fit else below_s * budget / below
                unknown |= mean is None
                left += mean or 0.0
            rows.append({"corpus": corpus, "budget": budget, "planned": len(mine),
                         "done": sum(finished),
                         "diverged": sum(1 for r in records if r.get("bpb") is None),
                         "mean_s": sum(seconds) / len(seconds) if seconds else None, "hours": sum(seconds) / 3600,
                         "left_hours": None if unknown else left / 3600})
    return rows


def holdout_table(rows: list[dict]) -> str:
    """Markdown: one row per corpus and holdout budget."""
    lines = ["| corpus | held-out budget | runs | diverged | s / run | machine-hours | left (est.) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        left = "–" if r["done"] == r["planned"] else (number(r["left_hours"], ".1f") + " h")
        lines.append(f"| {r['corpus']} | {budget_tag(r['budget'])} | {r['done']}/{r['planned']} | {r['diverged']} "
                     f"| {number(r['mean_s'], '.0f')} | {r['hours']:.2f} | {left} |")
    lines += ["", "The runs at each family's predicted size (prediction.json); time left per family: its finished "
              "held-out runs' mean time, or its mean at the largest budget of the grid it ran, times the budget "
              "ratio."]
    return "\n".join(lines)
