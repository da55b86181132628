"""Where a study stands, for a study that runs over many sessions: per corpus and budget, the
ladder points done out of the grid's, the adaptive runs done so far (extensions, optimum and
verdict seeds), whether the budget is complete (a dry run of the study finds nothing left to run
there), the mean time of its runs, and the time left, estimated. Trains nothing.

The estimate: the ladder points left times the budget's mean run time, times the ratio of all
runs to ladder runs at the largest complete budget (the adaptive steps cannot be known before the
ladder's results); with no complete budget, the ladder alone, and said so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rltok.analysis.scaling import Grid, budget_tag, grid_points, point_done, read_records
from rltok.analysis.table_cells import number

KINDS = ("ladder", "extension", "optimum", "verdict")


def _run_seconds(rec: dict) -> float | None:
    return rec.get("point_wall_s", rec.get("wall_s"))


def budget_status(grid: Grid, out: Path, corpus: str, budget: float) -> dict:
    """One corpus and budget: counts per kind of run, completeness, mean seconds per run."""
    from rltok.analysis.scaling_holdout import pending_point

    one = dataclasses.replace(grid, corpora={corpus: grid.corpora[corpus]}, budgets=(budget,))
    ladder = grid_points(one, log=lambda message: None)
    records = read_records(out / corpus, f"{budget_tag(budget)}__*__N*__s*.json") if (out / corpus).is_dir() else []
    records = [r for r in records if r.get("point_kind", "ladder") in KINDS]
    seconds = [s for s in map(_run_seconds, records) if s]
    done = {kind: sum(1 for r in records if r.get("point_kind", "ladder") == kind) for kind in KINDS}
    return {"corpus": corpus, "budget": budget, "ladder_total": len(ladder),
            "ladder_done": sum(point_done(out, p) for p in ladder), "done": done, "runs": len(records),
            "complete": pending_point(one, out) is None,
            "mean_s": sum(seconds) / len(seconds) if seconds else None,
            "hours": sum(seconds) / 3600}


def study_status(grid: Grid, out: Path) -> list[dict]:
    """Every corpus and budget of the grid (holdout budgets excepted), with the time left estimated."""
    rows = [budget_status(grid, out, corpus, budget) for corpus in grid.corpora for budget in grid.budgets]
    for corpus in grid.corpora:
        mine = [r for r in rows if r["corpus"] == corpus]
        finished = [r for r in mine if r["complete"] and r["ladder_done"]]
        ratio = finished[-1]["runs"] / finished[-1]["ladder_done"] if finished else None
        for r in mine:
            r["adaptive_ratio"] = ratio
            if r["complete"]:
                r["left_hours"] = 0.0
                continue
            # a budget not started yet: its cost per run unknown here, the last measured one stands in
            mean = r["mean_s"] or next((m["mean_s"] for m in reversed(mine) if m["mean_s"]), None)
            left_runs = (r["ladder_total"] * (ratio or 1.0)) - r["runs"]
            r["left_hours"] = None if mean is None else max(left_runs, 0) * mean / 3600
    return rows


def status_table(rows: list[dict]) -> str:
    """Markdown: one row per corpus and budget."""
    lines = ["| corpus | budget | ladder | extensions | optimum seeds | verdict seeds | complete | s / run "
             "| machine-hours | left (est.) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        left = "–" if r["complete"] else (number(r["left_hours"], ".1f") + " h")
        lines.append(f"| {r['corpus']} | {budget_tag(r['budget'])} | {r['ladder_done']}/{r['ladder_total']} "
                     f"| {r['done']['extension']} | {r['done']['optimum']} | {r['done']['verdict']} "
                     f"| {'yes' if r['complete'] else 'no'} | {number(r['mean_s'], '.0f')} | {r['hours']:.2f} "
                     f"| {left} |")
    ratios = {r["corpus"]: r["adaptive_ratio"] for r in rows}
    notes = [f"{c}: x{v:.2f}" if v else f"{c}: ladder only (no complete budget yet)" for c, v in ratios.items()]
    lines += ["", "Time left: the runs left times the budget's mean seconds per run (the last measured budget's "
              "where none has run), the ladder scaled by all runs / ladder runs at the largest complete budget "
              f"for the adaptive steps ({'; '.join(notes)}). Machine-hours: one core each."]
    return "\n".join(lines)
