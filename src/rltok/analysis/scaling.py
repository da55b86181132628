"""The compute-optimal (isoFLOP) study from a grid file: every corpus x budget x family x size x
seed trained to its FLOPs budget (`rltok.analysis.compare.run_one`), one JSON per run, then the
fits (`scaling_fit.fit_study`) and plots (`scaling_plots.plot_study`) per corpus.

The grid (TOML or JSON; schema in docs/SCALING.md):
  corpora: {name: data folder} (or a list of folders, named by their last component);
  budgets: training FLOPs; seeds; split (the held-out split scored, "test" by default);
  preset; max_eval_windows; overrides (base config overrides of every run); n_boot;
  families: a list of {name, method, overrides, n_min, n_max, points | sizes}: `method` an
  `rltok compare` method (NAME or NAME+PIECE...), `overrides` this family's base overrides, and
  the size ladder in non-embedding parameters (`rltok.model.sizing`).

Layout: `OUT/<corpus>/<budget>__<family>__N<target>__s<seed>.json` per run (written as soon as it
exists; a point whose JSON exists is skipped, an interrupted one resumes from its checkpoint under
`OUT/<corpus>/runs/`), `OUT/<corpus>/fits.json` and the PNGs from the fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

from rltok.config import ConfigError, load_config

GRID_KEYS = {"corpora", "budgets", "families", "seeds", "split", "preset", "max_eval_windows", "overrides",
             "n_boot"}
FAMILY_KEYS = {"name", "method", "overrides", "n_min", "n_max", "points", "sizes"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*(_[A-Za-z0-9.+-]+)*")  # a file-name part without "__"
RESULTS_GLOB = "C*__*__N*__s*.json"  # the run records of a corpus folder (not fits.json)


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """One family of the grid: a compare method, its own base overrides and its target sizes."""
    name: str
    method: str  # NAME or NAME+PIECE...: the shape keys are added per size as NAME@k=v,...
    overrides: tuple[str, ...]
    sizes: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Grid:
    corpora: dict  # name -> data spec (a folder with train/val/test)
    budgets: tuple[float, ...]
    families: tuple[FamilySpec, ...]
    seeds: tuple[int, ...] = (0,)
    split: str = "test"
    preset: str = "tiny"
    max_eval_windows: int = 0
    overrides: tuple[str, ...] = ()
    n_boot: int = 1000


def _unknown(keys, allowed: set, where: str) -> None:
    extra = sorted(set(keys) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _family(d: dict, i: int) -> FamilySpec:
    from rltok.model.sizing import geometric_sizes

    where = f"families[{i}]"
    _unknown(d, FAMILY_KEYS, where)
    if "method" not in d or "@" in d["method"]:
        raise ConfigError(f"{where}: `method` is a compare method NAME or NAME+PIECE... (put overrides in "
                          "`overrides`)")
    if "sizes" in d:
        sizes = [float(s) for s in d["sizes"]]
    elif {"n_min", "n_max", "points"} <= set(d):
        try:
            sizes = geometric_sizes(float(d["n_min"]), float(d["n_max"]), int(d["points"]))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    else:
        raise ConfigError(f"{where}: give `sizes` or `n_min`, `n_max` and `points`")
    if not sizes or min(sizes) <= 0:
        raise ConfigError(f"{where}: sizes must be > 0")
    return FamilySpec(_name(str(d.get("name", d["method"])), where), d["method"], tuple(d.get("overrides", ())),
                      tuple(sizes))


def _name(name: str, where: str) -> str:
    """A family or corpus name: part of file and folder names, so letters, digits, . + - and single _."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: name {name!r} must be letters, digits, '.', '+', '-' and single '_'")
    return name


def parse_grid(d: dict) -> Grid:
    """A Grid from the file's table; every problem is a ConfigError naming the key."""
    _unknown(d, GRID_KEYS, "grid")
    for key in ("corpora", "budgets", "families"):
        if not d.get(key):
            raise ConfigError(f"grid: `{key}` is required and may not be empty")
    corpora = d["corpora"]
    if not isinstance(corpora, dict):
        corpora = {Path(c).name: c for c in corpora}
    budgets = tuple(float(b) for b in d["budgets"])
    if min(budgets) <= 0:
        raise ConfigError("grid: budgets must be > 0")
    if len({budget_tag(b) for b in budgets}) < len(budgets):
        raise ConfigError(f"grid: budgets must differ in their first 4 digits: {list(budgets)}")
    families = tuple(_family(f, i) for i, f in enumerate(d["families"]))
    names = [f.name for f in families]
    if len(set(names)) < len(names):
        raise ConfigError(f"grid: family names must differ: {names}")
    return Grid({_name(str(k), "corpora"): str(v) for k, v in corpora.items()}, budgets, families,
                tuple(int(s) for s in d.get("seeds", (0,))), d.get("split", "test"), d.get("preset", "tiny"),
                int(d.get("max_eval_windows", 0)), tuple(d.get("overrides", ())), int(d.get("n_boot", 1000)))


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grid {path}: not a file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            return parse_grid(tomllib.loads(text))
        return parse_grid(json.loads(text))
    except (ValueError, TypeError) as e:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"grid {path}: {e}") from None


# ---------------------------------------------------------------- the points of the grid

def budget_tag(budget: float) -> str:
    """A budget in a file name: 1e8 -> C1e08, 3.162e14 -> C3.162e14."""
    return "C" + f"{budget:.4g}".replace("e+", "e")


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of the grid."""
    corpus: str
    budget: float
    family: FamilySpec
    rung: object  # rltok.model.sizing.Rung
    seed: int

    @property
    def stem(self) -> str:
        return f"{budget_tag(self.budget)}__{self.family.name}__N{round(self.rung.target)}__s{self.seed}"


def family_overrides(grid: Grid, fam: FamilySpec) -> list[str]:
    """The base overrides a family's runs train with (`run_one`'s `base`): the grid's, then its own."""
    return [*grid.overrides, *fam.overrides]


def family_ladder(grid: Grid, fam: FamilySpec, log=print) -> list:
    """The family's rungs (rltok.model.sizing.ladder, its architecture asked of its config); a
    target whose shape repeats a smaller target's is dropped (two runs of one model would be one
    point twice in the fit)."""
    from rltok.analysis.compare import method_overrides
    from rltok.model.sizing import ladder

    try:
        method = method_overrides(fam.method)
        base = [*family_overrides(grid, fam), *method]  # as method_config orders them
        arch = load_config(grid.preset, overrides=base).model.arch
        rungs = ladder(arch, fam.sizes, base, grid.preset)
    except ValueError as e:
        raise ConfigError(f"family {fam.name}: {e}") from None
    out, seen = [], {}
    for rung in rungs:
        key = tuple(rung.overrides)
        if key in seen:
            log(f"{fam.name}: target N {rung.target:g} builds the same model as {seen[key]:g} "
                f"(N {rung.achieved:,}): skipped")
            continue
        seen[key] = rung.target
        out.append(rung)
    return out


def grid_points(grid: Grid, log=print) -> list[Point]:
    ladders = {fam.name: family_ladder(grid, fam, log) for fam in grid.families}
    return [Point(corpus, budget, fam, rung, seed) for corpus in grid.corpora for budget in grid.budgets
            for fam in grid.families for rung in ladders[fam.name] for seed in grid.seeds]


# ---------------------------------------------------------------- running

def run_point(grid: Grid, p: Point, folder: Path, split: str) -> dict:
    """Train and evaluate one point; its record with the study's fields added."""
    from rltok.analysis.compare import method_slug, run_one
    from rltok.model.sizing import method_spec
    from rltok.training.loading import load_checkpoint

    method = method_spec(p.family.method, p.rung.overrides)
    run_root = folder / "runs" / p.stem
    rec = run_one(method, p.seed, grid.corpora[p.corpus], run_root, p.budget, family_overrides(grid, p.family),
                  grid.preset, split, grid.max_eval_windows)
    model = load_checkpoint(run_root / f"{method_slug(method)}_s{p.seed}")[0]  # N asked of the trained model
    rec.update(corpus=p.corpus, family=p.family.name, family_method=p.family.method, target_size=p.rung.target,
               ladder_params=p.rung.achieved, non_embedding_params=model.non_embedding_params(),
               budget_flops=p.budget, seed=p.seed, split=split)
    return rec


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.rename(path)  # a JSON that exists is complete: a rerun skips it


def corpus_split(grid: Grid, corpus: str, log=print) -> str:
    from rltok.data.corpus import load_eval_bytes, resolve_split

    split = resolve_split(grid.corpora[corpus], grid.split, fallback=True)
    load_eval_bytes(grid.corpora[corpus], split, max_bytes=1)  # a corpus that is not there fails before any run
    if split != grid.split:
        log(f"note: {corpus} has no {grid.split!r} split: evaluating on {split!r}")
    return split


def run_grid(grid: Grid, out: Path, log=print) -> dict:
    """Every point of the grid whose JSON does not exist yet; returns {"done": n, "ran": n}."""
    from rltok.analysis.compare import git_commit

    git_commit()  # the commit the study starts from, before any run can take long
    splits = {c: corpus_split(grid, c, log) for c in grid.corpora}
    points = grid_points(grid, log)
    todo = [p for p in points if not (out / p.corpus / f"{p.stem}.json").exists()]
    log(f"{len(points)} points: {len(points) - len(todo)} done already, {len(todo)} to run")
    for i, p in enumerate(todo, 1):
        folder = out / p.corpus
        folder.mkdir(parents=True, exist_ok=True)
        log(f"[{i}/{len(todo)}] {p.corpus} {p.stem} ...")
        rec = run_point(grid, p, folder, splits[p.corpus])
        _write_json(folder / f"{p.stem}.json", rec)
        log(f"[{i}/{len(todo)}] {p.corpus} {p.stem}: N {rec['non_embedding_params']:,} bpb {rec['bpb']:.4f} "
            f"({rec['wall_s']:.0f} s)")
    return {"points": len(points), "done": len(points) - len(todo), "ran": len(todo)}


# ---------------------------------------------------------------- fitting

def read_records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob(RESULTS_GLOB))]


def fit_corpus(folder: Path, n_boot: int = 1000) -> dict:
    """Fit every record in a corpus folder; write fits.json and the plots there; the study."""
    from rltok.analysis.scaling_fit import fit_study, to_plain
    from rltok.analysis.scaling_plots import plot_study

    study = fit_study(read_records(folder), n_boot=n_boot)
    _write_json(folder / "fits.json", to_plain(study))
    plot_study(study, folder)
    return study


def _fmt(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3g}"


def study_table(study: dict) -> str:
    """Per family and budget: the best measured size and its loss, the fitted N*, and whether the
    optimum is interior or which side of the ladder to extend."""
    lines = ["| family | budget | best N | best bpb | fitted N* | optimum |", "|---|---|---|---|---|---|"]
    for family, fit in study.items():
        for budget, iso in sorted(fit.isofits.items()):
            where = "interior" if iso.interior else f"extend {iso.extend}"
            lines.append(f"| {family} | {budget:.3g} | {iso.best_size:,.0f} | {iso.best_loss:.4f} "
                         f"| {_fmt(iso.n_star)} | {where} |")
        if not fit.isofits:
            lines.append(f"| {family} | – | – | – | – | fewer than 3 sizes at every budget |")
    return "\n".join(lines)
