"""Running a grid (`run_grid`): its ladder points, then the steps that depend on their results
(docs/SCALING.md, "Extend until interior", "More seeds at the optimum"), decided from the records
of the grid's seeds only, so a rerun makes the same decisions."""

from __future__ import annotations

from pathlib import Path

from rltok.analysis.scaling import (Grid, Point, budget_tag, corpus_split, family_rungs, grid_points, point_done,
                                    read_records, run_points)
from rltok.analysis.scaling_fit import best_by_choice, choice_records
from rltok.analysis.scaling_grid import step_ratio

MAX_STEPS = 4  # step ratios tried beyond an edge before a new shape is given up on


def cell_records(folder: Path, budget: float, family: str) -> list[dict]:
    """The records of one family at one budget (its files' names say so)."""
    return read_records(folder, f"{budget_tag(budget)}__{family}__N*__s*.json")


def _cells(points: list[Point]) -> dict:
    """(corpus, budget, family name) -> (family, its distinct rungs in ladder order)."""
    cells: dict = {}
    for p in points:
        fam, rungs = cells.setdefault((p.corpus, p.budget, p.family.name), (p.family, []))
        if all(r.target != p.rung.target for r in rungs):
            rungs.append(p.rung)
    return cells


def adapt_grid(grid: Grid, points: list[Point], out: Path, splits: dict, log=print, runner=None) -> int:
    """Extensions, then the optimum's seeds, for every cell of the grid's ladder points; runs added."""
    added = 0
    for (corpus, budget, _), (fam, rungs) in _cells(points).items():
        cell = Cell(grid, corpus, budget, fam, out, splits, log, runner)
        rungs, n = cell.extend(rungs)
        added += n + cell.optimum(rungs)
    return added


class Cell:
    """One family at one budget of one corpus."""

    def __init__(self, grid: Grid, corpus: str, budget: float, fam, out: Path, splits: dict, log, runner):
        self.grid, self.corpus, self.budget, self.fam = grid, corpus, budget, fam
        self.out, self.splits, self.log, self.runner = out, splits, log, runner
        self.folder = out / corpus

    def _run(self, rungs, seeds, kind: str) -> int:
        points = [Point(self.corpus, self.budget, self.fam, r, s, kind) for r in rungs for s in seeds]
        return run_points(self.grid, points, self.out, self.splits, self.log, self.runner)

    def _records(self, rungs) -> list[dict]:
        """The cell's scored records of `rungs` and the grid's seeds (a diverged run has no loss to
        choose by)."""
        targets = {round(r.target) for r in rungs}
        return [r for r in cell_records(self.folder, self.budget, self.fam.name)
                if round(r["target_size"]) in targets and r["seed"] in self.grid.seeds and r.get("bpb") is not None]

    def _found_extensions(self, rungs) -> list:
        """The sizes an earlier invocation added here, from their records."""
        base = {round(r.target) for r in rungs}
        found = sorted({round(r["target_size"]) for r in cell_records(self.folder, self.budget, self.fam.name)
                        if r.get("point_kind") == "extension"} - base)
        return list(family_rungs(self.grid, self.fam, found).values()) if found else []

    def extend(self, rungs: list) -> tuple[list, int]:
        """The cell's rungs once its optimum is interior (or `extend` sizes were added) and the
        number of runs that took."""
        found = self._found_extensions(rungs)
        rungs = rungs + found
        ran = self._run(found, self.grid.seeds, "extension")  # an interrupted extension's other seeds
        for _ in range(self.grid.extend - len(found)):
            side = self._side(rungs)
            rung = self._next_rung(rungs, side) if side else None
            if rung is None:
                break
            self.log(f"{self.corpus} {budget_tag(self.budget)} {self.fam.name}: optimum not interior: "
                     f"adding N {rung.target:g} ({side})")
            rungs = rungs + [rung]
            ran += self._run([rung], self.grid.seeds, "extension")
        return rungs, ran

    def _side(self, rungs) -> str | None:
        """None when the parabola's optimum is interior (or cannot be fitted), else the side to extend."""
        from rltok.analysis.scaling_fit import fit_isoflop, profiles_from_records

        profile = profiles_from_records(choice_records(self._records(rungs))).get(self.fam.name, {}).get(self.budget)
        if profile is None or len(profile.sizes) < 3:
            self.log(f"{self.corpus} {budget_tag(self.budget)} {self.fam.name}: fewer than 3 sizes: not extended")
            return None
        return fit_isoflop(profile, n_boot=0).extend

    def _next_rung(self, rungs, side: str):
        """The first shape one or more step ratios beyond the edge on `side`; None when the shape
        rule has none there (the smallest model, or the same shape again)."""
        step = step_ratio(self.grid, self.fam) ** (1 if side == "larger" else -1)
        edge = (max if side == "larger" else min)(rungs, key=lambda r: r.achieved)
        for k in range(1, MAX_STEPS + 1):
            target = round(edge.target * step ** k)
            if target < 1:
                break
            rung = family_rungs(self.grid, self.fam, [target])[target]
            beyond = rung.achieved > edge.achieved if side == "larger" else rung.achieved < edge.achieved
            if beyond:  # N beyond every rung's: a shape not run here yet
                return rung
        self.log(f"{self.corpus} {budget_tag(self.budget)} {self.fam.name}: no {side} shape within "
                 f"{MAX_STEPS} steps of N {edge.achieved:,}: not extended")
        return None

    def optimum(self, rungs: list) -> int:
        """Run the optimum's extra seeds at the best measured size, then the verdict seeds where
        the grid names this family (and budget); the number run."""
        extra = [s for s in self.grid.optimum_seeds if s not in self.grid.seeds]
        verdict = self.grid.verdict_seeds_at(self.fam.name, self.budget)
        best = best_by_choice(self._records(rungs), key=lambda r: round(r["target_size"])).get(self.fam.name)
        if not (extra or verdict) or best is None:
            return 0
        rung = next(r for r in rungs if round(r.target) == best)
        return self._run([rung], extra, "optimum") + self._run([rung], verdict, "verdict")


def shard_points(points: list[Point], shard: tuple[int, int]) -> list[Point]:
    """Shard k of n (1-based): every k-th cell (corpus, budget, family) in the grid's order, with all
    its points. A cell's later steps decide from its own records only, so shards never wait for each
    other and together run exactly what one process runs."""
    k, n = shard
    cells: dict = {}
    for p in points:
        cells.setdefault((p.corpus, p.budget, p.family.name), len(cells))
    return [p for p in points if cells[(p.corpus, p.budget, p.family.name)] % n == k - 1]


def run_grid(grid: Grid, out: Path, log=print, runner=None, shard: tuple[int, int] | None = None) -> dict:
    """Every ladder point of the grid whose JSON does not exist yet, then per corpus, budget and
    family the extensions and the optimum's seeds (`adapt_grid`); returns {"points", "done",
    "ran", "added"} (added: extension and optimum runs). `shard` (k, n): only shard k's cells."""
    from rltok.analysis.compare import git_commit

    git_commit()  # the commit the study starts from, before any run can take long
    splits = {c: corpus_split(grid, c, log) for c in grid.corpora}
    points = grid_points(grid, log)
    if shard is not None:
        points = shard_points(points, shard)
        log(f"shard {shard[0]}/{shard[1]}")
    done = sum(point_done(out, p) for p in points)
    log(f"{len(points)} points: {done} done already, {len(points) - done} to run")
    ran = run_points(grid, points, out, splits, log, runner)
    added = 0
    if grid.extend or set(grid.optimum_seeds) - set(grid.seeds) or grid.verdict_seeds:
        added = adapt_grid(grid, points, out, splits, log, runner)
    return {"points": len(points), "done": done, "ran": ran, "added": added}
