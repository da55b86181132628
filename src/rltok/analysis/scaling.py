"""The compute-optimal (isoFLOP) study from a grid file: every corpus x budget x family x size x
seed trained to its FLOPs budget (`rltok.analysis.compare.run_one`), one JSON per run, then the
fits (`scaling_fit.fit_study`) and plots (`scaling_plots.plot_study`) per corpus.

The grid (TOML or JSON; schema in docs/SCALING.md):
  corpora: {name: data folder} (or a list of folders, named by their last component);
  budgets: training FLOPs; seeds; split (the held-out split scored, "test" by default);
  preset; max_eval_windows; overrides (base config overrides of every run); n_boot;
  families: a list of {name, method, overrides, n_min, n_max, points | sizes}: `method` an
  `rltok compare` method (NAME or NAME+PIECE...), `overrides` this family's base overrides, and
  the size ladder in non-embedding parameters (`rltok.model.sizing`); groups: {name: [family, ...]}
  and crossovers: [[a, b], ...], the report's groups and pairs (`rltok.analysis.scaling_report`).

Layout: `OUT/<corpus>/<budget>__<family>__N<target>__s<seed>.json` per run (written as soon as it
exists; a point whose JSON exists is skipped, an interrupted one resumes from its checkpoint under
`OUT/<corpus>/runs/`), `OUT/<corpus>/fits.json`, `report.md` and the PNGs from the fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

from rltok.config import ConfigError, load_config

GRID_KEYS = {"corpora", "budgets", "families", "seeds", "split", "preset", "max_eval_windows", "overrides",
             "n_boot", "groups", "crossovers"}
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
    groups: dict = dataclasses.field(default_factory=dict)  # name -> member family names
    crossovers: tuple[tuple[str, str], ...] = ()  # pairs of family or group names


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
    groups = _groups(d.get("groups", {}), names)
    return Grid({_name(str(k), "corpora"): str(v) for k, v in corpora.items()}, budgets, families,
                tuple(int(s) for s in d.get("seeds", (0,))), d.get("split", "test"), d.get("preset", "tiny"),
                int(d.get("max_eval_windows", 0)), tuple(d.get("overrides", ())), int(d.get("n_boot", 1000)),
                groups, _crossovers(d.get("crossovers", ()), [*names, *groups]))


def _groups(d, families: list[str]) -> dict:
    """`groups = {name = [family, ...]}`: each group is fitted as its best member per budget."""
    if not isinstance(d, dict):
        raise ConfigError("grid: `groups` is a table {name = [family, ...]}")
    out = {}
    for name, members in d.items():
        where = f"groups.{name}"
        if _name(str(name), where) in families:
            raise ConfigError(f"{where}: a group may not take a family's name")
        if isinstance(members, str) or not members:
            raise ConfigError(f"{where}: a list of one or more family names")
        unknown = [m for m in members if m not in families]
        if unknown:
            raise ConfigError(f"{where}: unknown family name(s) {', '.join(map(str, unknown))}; families: "
                              f"{', '.join(families)}")
        out[str(name)] = tuple(members)
    return out


def _crossovers(pairs, names: list[str]) -> tuple[tuple[str, str], ...]:
    """`crossovers = [[a, b], ...]`: pairs of family or group names."""
    out = []
    for i, pair in enumerate(pairs):
        where = f"crossovers[{i}]"
        if isinstance(pair, str) or len(pair) != 2 or pair[0] == pair[1]:
            raise ConfigError(f"{where}: a pair of two different family or group names, got {pair!r}")
        unknown = [n for n in pair if n not in names]
        if unknown:
            raise ConfigError(f"{where}: unknown family or group name(s) {', '.join(map(str, unknown))}; "
                              f"known: {', '.join(names)}")
        out.append((str(pair[0]), str(pair[1])))
    return tuple(out)


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


def fit_corpus(folder: Path, n_boot: int = 1000, groups: dict | None = None, crossovers=(),
               command: str | None = None) -> dict:
    """Fit every record in a corpus folder (families and `groups`, the `crossovers` pairs); write
    fits.json, the plots and report.md there (`scaling_report`); the study (family or group ->
    FamilyFit)."""
    from rltok.analysis.compare import git_commit
    from rltok.analysis.scaling_plots import plot_inference, plot_study
    from rltok.analysis.scaling_report import build_report, report_markdown, report_plain

    folder = Path(folder)
    rep = build_report(read_records(folder), groups, crossovers, folder.name, n_boot)
    _write_json(folder / "fits.json", report_plain(rep, command, git_commit()))
    crossings = [c for p in rep.crossovers if p.crossover for c in p.crossover.crossings]
    plots = plot_study(rep.study, folder, crossings=crossings)
    inference = plot_inference(list(rep.records), folder / f"inference_{folder.name}.png", folder.name)
    md = report_markdown(rep, command, git_commit(), [p.name for p in plots], inference and inference.name)
    (folder / "report.md").write_text(md)
    return rep.study


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
