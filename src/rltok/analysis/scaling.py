"""The compute-optimal (isoFLOP) study from a grid file (docs/SCALING.md): grid, points, records,
merge; every point trained by `compare.run_one`, then the fits, report and plots per corpus."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from pathlib import Path

from rltok.analysis.scaling_grid import LRRule, SizeRule, base_lr, family_sizes, point_lr, rules, run_base, unknown_keys
from rltok.analysis.table_cells import number, table
from rltok.config import ConfigError, load_config
from rltok.config.sections import MAX_FLOPS_BUDGET

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*(_[A-Za-z0-9.+-]+)*")  # a file-name part without "__"
RESULTS_GLOB = "C*__*__N*__s*.json"  # the run records of a corpus folder (not fits.json)
RECORD_LIMIT = 16 << 20  # a run record is kilobytes (its curve included)


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """One family of the grid (docs/SCALING.md, "The grid file")."""
    name: str
    method: str  # NAME or NAME+PIECE...: the shape keys are added per size as NAME@k=v,...
    overrides: tuple[str, ...]
    sizes: tuple[float, ...]  # empty: the grid's size_rule gives the sizes per budget
    size_coef: float | None = None
    lr_mult: float = 1.0
    centres: tuple[tuple[float, float], ...] = ()  # (budget, N): the size window's centre there
    aspect: float | None = None
    byte_ratio: float | None = None

    def centre_at(self, budget: float) -> float | None:
        return dict(self.centres).get(float(budget))


FAMILY_KEYS = {f.name for f in dataclasses.fields(FamilySpec)} | {"n_min", "n_max", "points"}


@dataclasses.dataclass(frozen=True)
class Grid:
    """A grid file's keys, parsed (docs/SCALING.md, "The grid file")."""
    corpora: dict  # name -> data spec (a folder with train/val/test)
    budgets: tuple[float, ...]
    families: tuple[FamilySpec, ...]
    seeds: tuple[int, ...] = (0,)
    split: str = "test"
    preset: str = "tiny"
    max_eval_windows: int = 0
    overrides: tuple[str, ...] = ()
    n_boot: int = 1000
    size_rule: SizeRule | None = None
    extend: int = 0
    lr_rule: LRRule | None = None  # None: the preset's rate
    warmup_frac: float | None = None
    optimum_seeds: tuple[int, ...] = ()
    holdout_budgets: tuple[float, ...] = ()  # never fitted nor run by a plain `rltok scaling`
    holdout_seeds: tuple[int, ...] = (0, 1, 2)
    holdout_overrides: tuple[str, ...] = ()  # of the held-out runs only, after every other override
    select_split: str | None = None  # None: the choices read `bpb`
    eval_context: int = 1
    groups: dict = dataclasses.field(default_factory=dict)  # name -> member family names
    crossovers: tuple[tuple[str, str], ...] = ()  # pairs of family or group names
    interior_only: bool = False
    fit_from: float | None = None
    verdict_seeds: tuple[int, ...] = ()
    verdict_families: tuple[str, ...] = ()
    verdict_budgets: tuple[float, ...] = ()  # none: every budget
    committed_only: bool = False
    lr_schedule: str | None = None  # None: the preset's
    cooldown_frac: float | None = None

    def verdict_seeds_at(self, family: str, budget: float) -> list[int]:
        """The verdict seeds a family runs at its best size at `budget` (none the grid's seeds or
        the optimum's seeds run already)."""
        if family not in self.verdict_families or (self.verdict_budgets and budget not in self.verdict_budgets):
            return []
        return [s for s in self.verdict_seeds if s not in self.seeds and s not in self.optimum_seeds]

    @property
    def branches(self) -> bool:
        """Whether a run goes on from the same model's run at a smaller budget ("wsd")."""
        return self.lr_schedule == "wsd"


GRID_KEYS = {f.name for f in dataclasses.fields(Grid)} - {"verdict_families", "verdict_budgets"}  # in verdict_seeds


def _family(d: dict, i: int, has_rule: bool) -> FamilySpec:
    from rltok.model.sizing import check_shape_knobs, geometric_sizes

    where = f"families[{i}]"
    unknown_keys(d, FAMILY_KEYS, where)
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
    elif "size_coef" in d or has_rule:
        sizes = []  # the grid's size_rule, per budget
    else:
        raise ConfigError(f"{where}: give `sizes`, or `n_min`, `n_max` and `points`, or a grid `size_rule`")
    if sizes and min(sizes) <= 0:
        raise ConfigError(f"{where}: sizes must be > 0")
    if "size_coef" in d and (sizes or not has_rule or float(d["size_coef"]) <= 0):
        raise ConfigError(f"{where}: `size_coef` (> 0) replaces the grid's size_rule coef: it needs the "
                          "size_rule and no sizes of the family's own")
    lr_mult = float(d.get("lr_mult", 1.0))
    if not 0 < lr_mult < math.inf:
        raise ConfigError(f"{where}: lr_mult must be > 0")
    coef = float(d["size_coef"]) if "size_coef" in d else None
    shape = {}
    for key in ("aspect", "byte_ratio"):
        if key in d:
            try:
                shape[key] = float(d[key])
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: `{key}` is a number, got {d[key]!r}") from None
    try:
        check_shape_knobs(**shape)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    return FamilySpec(_name(str(d.get("name", d["method"])), where), d["method"], tuple(d.get("overrides", ())),
                      tuple(sizes), coef, lr_mult, _centres(d.get("centres"), where, bool(sizes) or not has_rule),
                      **shape)


def _centres(d, where: str, no_rule: bool) -> tuple[tuple[float, float], ...]:
    """`centres = {"3e12" = 1.2e5}`: per budget, the size window's centre in non-embedding parameters."""
    if d is None:
        return ()
    if no_rule or not isinstance(d, dict):
        raise ConfigError(f"{where}: `centres` is a table {{\"budget\" = N}} that moves the size_rule's window; "
                          "it needs the size_rule and no sizes of the family's own")
    out = []
    for budget, centre in d.items():
        try:
            b, n = float(budget), float(centre)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.centres: budgets and sizes are numbers, got {budget!r} = {centre!r}") from None
        if not (b > 0 and n > 0 and math.isfinite(b) and math.isfinite(n)):
            raise ConfigError(f"{where}.centres: budgets and sizes must be > 0, got {budget!r} = {centre!r}")
        out.append((b, n))
    return tuple(sorted(out))


def _name(name: str, where: str) -> str:
    """A family or corpus name: part of file and folder names, so letters, digits, . + - and single _."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: name {name!r} must be letters, digits, '.', '+', '-' and single '_'")
    return name


def parse_grid(d: dict) -> Grid:
    """A Grid from the file's table; every problem is a ConfigError naming the key."""
    unknown_keys(d, GRID_KEYS, "grid")
    for key in ("corpora", "budgets", "families"):
        if not d.get(key):
            raise ConfigError(f"grid: `{key}` is required and may not be empty")
    corpora = d["corpora"]
    if not isinstance(corpora, dict):
        corpora = {Path(c).name: c for c in corpora}
    budgets = tuple(float(b) for b in d["budgets"])
    holdout = tuple(float(b) for b in d.get("holdout_budgets", ()))
    bad = [b for b in budgets + holdout if not 0 < b <= MAX_FLOPS_BUDGET]  # nan and inf included
    if bad:
        raise ConfigError(f"grid: budgets must be FLOPs in (0, {MAX_FLOPS_BUDGET:.0e}] (more is beyond any run a "
                          f"computer can finish), got {bad[0]}")
    if len({budget_tag(b) for b in budgets + holdout}) < len(budgets + holdout):
        raise ConfigError(f"grid: budgets and holdout_budgets must all differ in their first 4 digits: "
                          f"{list(budgets + holdout)}")
    extra = rules(d)
    families = tuple(_family(f, i, "size_rule" in extra) for i, f in enumerate(d["families"]))
    for fam in families:
        stray = [b for b, _ in fam.centres if b not in budgets + holdout]
        if stray:
            raise ConfigError(f"family {fam.name}: centres at {stray}: not budgets of the grid "
                              f"({list(budgets + holdout)})")
    names = [f.name for f in families]
    if len(set(names)) < len(names):
        raise ConfigError(f"grid: family names must differ: {names}")
    groups = _groups(d.get("groups", {}), names)
    return Grid({_name(str(k), "corpora"): str(v) for k, v in corpora.items()}, budgets, families,
                tuple(int(s) for s in d.get("seeds", (0,))), d.get("split", "test"), d.get("preset", "tiny"),
                int(d.get("max_eval_windows", 0)), tuple(d.get("overrides", ())), int(d.get("n_boot", 1000)),
                holdout_budgets=holdout, select_split=d.get("select_split"),
                groups=groups, holdout_overrides=_holdout_overrides(d.get("holdout_overrides", ())),
                crossovers=_crossovers(d.get("crossovers", ()), [*names, *groups]),
                **_verdict_seeds(d.get("verdict_seeds"), names, budgets), **extra)


UNCOMMITTED = "uncommitted code"  # a record's `excluded` reason: run from a tree with changes under src/


def check_committed(grid: Grid, allow_dirty: bool = False) -> None:
    """A grid with `committed_only` runs from committed code: one error line when src/ has
    uncommitted changes, unless `allow_dirty` (its records are then marked and left out)."""
    from rltok.analysis.compare import git_commit

    if grid.committed_only and git_commit().endswith("+dirty") and not allow_dirty:
        raise ConfigError(f"the grid asks for committed code (committed_only) and src/ differs from {git_commit()[:-6]}: "
                          "commit first, or pass --allow-dirty (its records are left out of every fit and table)")


# what the held-out runs may set differently from the fitted budgets' runs: how they compute and
# report, never what they train (a rate, a batch or a precision would make them another study)
HOLDOUT_KEYS = ("train.optimizer_kernel", "train.threads", "train.device", "train.compile", "train.log_every",
                "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints", "train.tensorboard",
                "train.wandb")


def _holdout_overrides(items) -> tuple[str, ...]:
    if isinstance(items, str) or not all(isinstance(x, str) for x in items):
        raise ConfigError(f"grid: holdout_overrides is a list of KEY=VALUE strings, got {items!r}")
    for item in items:
        key = item.partition("=")[0].strip()
        if key not in HOLDOUT_KEYS or "=" not in item:
            raise ConfigError(f"grid: holdout_overrides may set only {', '.join(HOLDOUT_KEYS)} (how the "
                              f"held-out runs compute, not what they train), got {item!r}")
    return tuple(items)


def _verdict_seeds(d, families: list[str], budgets: tuple[float, ...]) -> dict:
    """`verdict_seeds = {seeds = [...], families = [...], budgets = [...]}` (budgets optional: every
    budget): the Grid fields."""
    if d is None:
        return {}
    if not isinstance(d, dict) or not d.get("seeds") or not d.get("families"):
        raise ConfigError("grid: verdict_seeds is a table {seeds = [...], families = [...], budgets = [...]} "
                          "with seeds and families not empty")
    unknown_keys(d, {"seeds", "families", "budgets"}, "verdict_seeds")
    unknown = [f for f in d["families"] if f not in families]
    if unknown:
        raise ConfigError(f"verdict_seeds.families: unknown family name(s) {', '.join(map(str, unknown))}; "
                          f"families: {', '.join(families)}")
    at = tuple(float(b) for b in d.get("budgets", ()))
    if any(b not in budgets for b in at):
        raise ConfigError(f"verdict_seeds.budgets: each one of the grid's budgets {list(budgets)}, got {list(at)}")
    return {"verdict_seeds": tuple(int(s) for s in d["seeds"]), "verdict_families": tuple(map(str, d["families"])),
            "verdict_budgets": at}


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
    from rltok.config.files import read_json

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grid {path}: not a file")
    data = read_json(path, "grid", limit=1 << 20, kind="toml" if path.suffix == ".toml" else "json")
    try:
        return parse_grid(data)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"grid {path}: {e}") from None


# ---------------------------------------------------------------- the points of the grid

def one_corpus(grid: Grid, corpus: str) -> Grid:
    """The grid with only `corpus` (one process per corpus runs a grid's corpora side by side)."""
    if corpus not in grid.corpora:
        raise ConfigError(f"--corpus {corpus}: the grid's corpora are {', '.join(grid.corpora)}")
    return dataclasses.replace(grid, corpora={corpus: grid.corpora[corpus]})


def budget_tag(budget: float) -> str:
    """A budget in a file name: 1e8 -> C1e08, 3.162e14 -> C3.162e14."""
    return "C" + f"{budget:.4g}".replace("e+", "e")


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of the grid; `kind` says why it runs: "ladder", "extension", "optimum", "verdict"
    (docs/SCALING.md) or "holdout" (at a held-out budget, the size its prediction names)."""
    corpus: str
    budget: float
    family: FamilySpec
    rung: object  # rltok.model.sizing.Rung
    seed: int
    kind: str = "ladder"

    @property
    def stem(self) -> str:
        return f"{budget_tag(self.budget)}__{self.family.name}__N{round(self.rung.target)}__s{self.seed}"


def family_rungs(grid: Grid, fam: FamilySpec, targets) -> dict[int, object]:
    """round(target) -> its rung (rltok.model.sizing.ladder), for every target at once: the shape
    search runs once."""
    from rltok.analysis.compare import method_overrides
    from rltok.model.sizing import ladder

    try:
        method = method_overrides(fam.method)
        _refuse_replaced(fam, run_base(grid, fam), method)
        base = [*run_base(grid, fam), *method]  # as method_config orders them
        arch = load_config(grid.preset, overrides=base).model.arch
        shape = {k: v for k, v in (("aspect", fam.aspect), ("byte_ratio", fam.byte_ratio)) if v is not None}
        rungs = ladder(arch, sorted({float(t) for t in targets}), base, grid.preset, **shape)
        for o in run_base(grid, fam):  # the rung's shape comes last too: a key it sets otherwise is replaced
            key, _, value = (part.strip() for part in o.partition("="))
            if any(k.strip() == key and v.strip() != value for r in rungs for k, _, v in (x.partition("=") for x in r.overrides)):
                raise ConfigError(f"{o!r} sets a key the size ladder sets at each size, so it would be silently "
                                  "replaced; shape the ladder with the family's aspect and byte_ratio")
    except ValueError as e:
        raise ConfigError(f"family {fam.name}: {e}") from None
    return {round(r.target): r for r in rungs}


def _refuse_replaced(fam: FamilySpec, base: list[str], method: list[str]) -> None:
    """The method's own overrides come after the grid's and the family's, so a key it sets would
    silently replace theirs (a family of method `uniform` with `model.chunker=whitespace` would
    train uniform cuts): refused, unless both say the same."""
    def name(key: str) -> str:  # `model.chunker.kind=X` chooses the kind as `model.chunker=X` does
        key = key.strip()
        return key.removesuffix(".kind")

    said = {name(k): v.strip() for k, _, v in (o.partition("=") for o in method)}
    for o in base:
        key, value = name(o.partition("=")[0]), o.partition("=")[2].strip()
        if key in said and said[key] != value:
            raise ConfigError(f"its method {fam.method!r} sets {key}={said[key]} itself, "
                              f"after the grid's and the family's overrides, so {o!r} would be silently "
                              f"replaced; name the method that says it (a rule or family by its name, or "
                              f"NAME@{key}={value})")


def budget_ladders(grid: Grid, fam: FamilySpec, budgets, log=print) -> dict[float, list]:
    """Each budget's rungs of a family (its own ladder, or the size rule's window), less any whose
    shape repeats an earlier one's there (one model twice would be one point twice in the fit)."""
    targets = {b: family_sizes(grid, fam, b) for b in budgets}
    by_target = family_rungs(grid, fam, [t for ts in targets.values() for t in ts])
    said, out = set(), {}  # each dropped target logged once
    for b, ts in targets.items():
        out[b], seen = [], {}
        for rung in (by_target[round(t)] for t in ts):
            key = tuple(rung.overrides)
            if key not in seen:
                seen[key] = rung.target
                out[b].append(rung)
            elif rung.target not in said:
                said.add(rung.target)
                log(f"{fam.name}: target N {rung.target:g} builds the same model as {seen[key]:g} "
                    f"(N {rung.achieved:,}): skipped")
    return out


def grid_points(grid: Grid, log=print) -> list[Point]:
    """The ladder points of every corpus, budget (holdout budgets excepted), family and seed."""
    ladders = {fam.name: budget_ladders(grid, fam, grid.budgets, log) for fam in grid.families}
    return [Point(corpus, budget, fam, rung, seed) for corpus in grid.corpora for budget in grid.budgets
            for fam in grid.families for rung in ladders[fam.name][budget] for seed in grid.seeds]


# ---------------------------------------------------------------- running

ATTEMPTS = "interrupted_s.json"  # in a point's run folder: the seconds its interrupted attempts ran


def run_point(grid: Grid, p: Point, folder: Path, split: str) -> dict:
    """Train and evaluate one point; its record with the study's fields added, among them
    `point_wall_s`: the point's whole wall-clock time, interrupted attempts included (`wall_s` is
    this attempt's training only)."""
    run_root = folder / "runs" / p.stem
    t0 = time.time()
    try:
        rec = _run_point(grid, p, folder, split, run_root)
    except KeyboardInterrupt:  # the run is checkpointed and resumes later: keep the time it ran
        run_root.mkdir(parents=True, exist_ok=True)
        _write_json(run_root / ATTEMPTS, {"seconds": _interrupted_s(run_root) + time.time() - t0})
        raise
    rec["point_wall_s"] = _interrupted_s(run_root) + time.time() - t0
    if getattr(grid, "committed_only", False) and str(rec.get("commit", "")).endswith("+dirty"):
        rec["excluded"] = UNCOMMITTED
    return rec


def _interrupted_s(run_root: Path) -> float:
    rec = read_record(run_root / ATTEMPTS, warn=False) if (run_root / ATTEMPTS).is_file() else None
    seconds = (rec or {}).get("seconds", 0.0)  # a damaged note only loses the interrupted attempts' time
    return float(seconds) if isinstance(seconds, (int, float)) and math.isfinite(seconds) else 0.0


def point_base(grid: Grid, p: Point) -> list[str]:
    """The base overrides a point trains with: its family's, its size's learning rate, and for a
    held-out point the grid's `holdout_overrides`, last."""
    lr = point_lr(grid, p.family, p.rung.achieved)
    return [*run_base(grid, p.family), *([] if lr is None else [f"train.lr={lr!r}"]),
            *(grid.holdout_overrides if p.kind == "holdout" else ())]


def _run_point(grid: Grid, p: Point, folder: Path, split: str, run_root: Path) -> dict:
    from rltok.analysis.compare import method_slug, run_one
    from rltok.model.sizing import method_spec
    from rltok.training.loading import load_checkpoint

    method = method_spec(p.family.method, p.rung.overrides)
    args = (method, p.seed, grid.corpora[p.corpus], run_root, p.budget, point_base(grid, p), grid.preset, split,
            grid.max_eval_windows, grid.eval_context)
    rec = run_one(*args) if not grid.branches else _run_branched(grid, p, folder, method, args)
    model = load_checkpoint(run_root / f"{method_slug(method)}_s{p.seed}")[0]  # N asked of the trained model
    rec.update(corpus=p.corpus, family=p.family.name, family_method=p.family.method, target_size=p.rung.target,
               ladder_params=p.rung.achieved, non_embedding_params=model.non_embedding_params(),
               budget_flops=p.budget, seed=p.seed, split=split, lr=rec["config"]["train"]["lr"],
               lr_mult=p.family.lr_mult, point_kind=p.kind)
    if grid.select_split and grid.select_split != split:
        seq_len = rec["config"]["train"]["seq_len"]  # the run's own windows
        rec.update(select_split=grid.select_split, bpb_select=_score(model, grid, p.corpus, grid.select_split, seq_len))
    return rec


def branch_source(folder: Path, p: Point, method: str) -> tuple[str, Path] | None:
    """(stem, run folder) of the run this point can go on from: the same family, `method` and seed
    at the largest smaller budget whose run kept a branch checkpoint; or None."""
    from rltok.analysis.compare import method_slug
    from rltok.training.checkpoint import list_checkpoints
    from rltok.training.run_folder import branch_root

    found = []
    for path in folder.glob(f"C*__{p.family.name}__N*__s{p.seed}.json"):
        r = read_record(path, warn=False)
        if r is None or (r.get("family"), r.get("method"), r.get("seed")) != (p.family.name, method, p.seed):
            continue
        run = folder / "runs" / path.stem / f"{method_slug(method)}_s{p.seed}"
        if r.get("budget_flops", math.inf) < p.budget and list_checkpoints(branch_root(run)):
            found.append((r["budget_flops"], path.stem, run))
    return max(found)[1:] if found else None


def _run_branched(grid: Grid, p: Point, folder: Path, method: str, args: tuple) -> dict:
    """run_one under "wsd", with the smallest budget's warm-up (so every budget has it), going on
    from branch_source where there is one; the record adds `branched_from`, `own_flops` (the FLOPs
    this run spent) and, where the checks refused the branch and it ran from scratch, why."""
    from rltok.analysis.compare import run_one

    source, refused = branch_source(folder, p, method), None
    if source is not None:
        try:
            rec = run_one(*args, branch_from=source[1], warmup_at=min(grid.budgets))
            return {**rec, "branched_from": source[0]}  # run_one's record has its own_flops
        except ConfigError as e:
            refused = str(e)
    rec = run_one(*args, warmup_at=min(grid.budgets))
    return {**rec, "branched_from": None, "own_flops": rec["train_flops"],
            **({} if refused is None else {"branch_refused": refused})}


def _score(model, grid: Grid, corpus: str, split: str, seq_len: int) -> float:
    """bpb of a trained model on `split` of a corpus, windows as the scored split's."""
    from rltok.data.corpus import load_eval_bytes
    from rltok.data.windows import eval_windows
    from rltok.eval.evaluate import evaluate

    x, y = eval_windows(load_eval_bytes(grid.corpora[corpus], split), seq_len, grid.max_eval_windows,
                        context=grid.eval_context)
    return float(evaluate(model, x, y, batch_size=16, mode="sample", seed=0, context=grid.eval_context)["bpb"])


def diverged_record(grid: Grid, p: Point, split: str, why: str, wall_s: float) -> dict:
    """The record of a run that diverged: the study's fields (N is the ladder's: no model was
    kept), the rate it trained with, no bpb (fits and choices leave it out), why, and the code it
    ran (so that a reader can tell a diverged run from one made from uncommitted code)."""
    from rltok.analysis.compare import git_commit

    lr = point_lr(grid, p.family, p.rung.achieved)
    return {"corpus": p.corpus, "family": p.family.name, "family_method": p.family.method,
            "target_size": p.rung.target, "ladder_params": p.rung.achieved, "non_embedding_params": p.rung.achieved,
            "budget_flops": p.budget, "seed": p.seed, "split": split, "point_kind": p.kind, "bpb": None,
            "lr": lr if lr is not None else base_lr(grid, p.family),
            "lr_mult": p.family.lr_mult, "eval_context": grid.eval_context, "diverged": why, "wall_s": wall_s,
            "commit": git_commit()}


def _write_json(path: Path, obj) -> None:
    from rltok.config.files import write_atomic

    write_atomic(path, json.dumps(obj, indent=2))  # a JSON that exists is complete, power loss or not: a rerun skips it


def read_record(path: Path, warn: bool = True) -> dict | None:
    """The run record in `path`, or None when the file does not hold one (empty, truncated, `[]`,
    nested too deeply): reported as a warning naming it (`warn`), never fatal to a study."""
    from rltok.config import files

    return files.read_record(path, "run record", RECORD_LIMIT, warn, "left out (`rltok scaling` without --fit-only runs that point again)")


def corpus_split(grid: Grid, corpus: str, log=print) -> str:
    from rltok.data.corpus import load_eval_bytes, resolve_split

    split = resolve_split(grid.corpora[corpus], grid.split, fallback=True)
    load_eval_bytes(grid.corpora[corpus], split, max_bytes=1)  # a corpus that is not there fails before any run
    if split != grid.split:
        log(f"note: {corpus} has no {grid.split!r} split: evaluating on {split!r}")
    if grid.select_split:  # a missing selection split fails here too, not after the first run
        load_eval_bytes(grid.corpora[corpus], resolve_split(grid.corpora[corpus], grid.select_split), max_bytes=1)
        if grid.select_split == split:
            log(f"note: {corpus}: the selection split is the scored one ({split!r}): choices read it")
    return split


def point_done(out: Path, p: Point) -> bool:
    """Whether the point's record is there (one that does not parse is replaced by the next run)."""
    path = out / p.corpus / f"{p.stem}.json"
    rec = read_record(path, warn=False) if path.exists() else None
    if rec is not None and rec.get("excluded") == UNCOMMITTED:  # rerun once the tree is committed
        from rltok.analysis.compare import git_commit

        return git_commit().endswith("+dirty")
    return rec is not None


def _refuse_another_rate(grid: Grid, todo: list[Point], out: Path) -> None:
    """A run folder left behind by a point about to run resumes from its checkpoint; one trained
    at another learning rate than the grid now gives (a family whose rate changed, its record
    moved aside but not its run folder) would go on at the new rate from the old one's state:
    refused, naming the folder to move aside. (A point's record names no rate: a changed family
    reruns only the points whose records are moved aside.)"""
    for p in todo:
        lr = point_lr(grid, p.family, p.rung.achieved)
        for saved in sorted((out / p.corpus / "runs" / p.stem).glob("*/config.json")) if lr is not None else ():
            try:
                was = json.loads(saved.read_text())["train"]["lr"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # the trainer's own resume checks say what is wrong with it
            if isinstance(was, (int, float)) and not math.isclose(was, lr, rel_tol=1e-9):
                raise ConfigError(f"{saved.parent} was trained at lr {was:.6g}, but the grid now gives {p.family.name} "
                                  f"lr {lr:.6g} there: move {out / p.corpus / 'runs' / p.stem} aside to run the "
                                  "point at the new rate")


def run_points(grid: Grid, points: list[Point], out: Path, splits: dict, log=print, runner=None) -> int:
    """Run each point whose JSON does not exist yet (`runner`: run_point, or a stand-in with its
    signature); the number run."""
    from rltok.training.trainer import TrainingDiverged

    runner = runner or run_point
    todo = [p for p in points if not point_done(out, p)]
    _refuse_another_rate(grid, todo, out)
    for i, p in enumerate(todo, 1):
        folder = out / p.corpus
        folder.mkdir(parents=True, exist_ok=True)
        what = "" if p.kind == "ladder" else f" ({p.kind})"
        log(f"[{i}/{len(todo)}] {p.corpus} {p.stem}{what} ...")
        t0 = time.time()
        try:
            rec = runner(grid, p, folder, splits[p.corpus])
        except TrainingDiverged as e:  # a result of the study (too large a rate for the size): recorded, not fatal
            rec = diverged_record(grid, p, splits[p.corpus], str(e), time.time() - t0)
        bad = [k for k in ("bpb", "bpb_select") if rec.get(k) is not None and not math.isfinite(rec[k])]
        if bad:  # a NaN loss would pass every reader's "has a bpb" test: recorded as diverged instead
            rec = diverged_record(grid, p, splits[p.corpus], f"evaluation gave a non-finite {', '.join(bad)}",
                                  rec.get("point_wall_s", rec.get("wall_s", time.time() - t0)))
        _write_json(folder / f"{p.stem}.json", rec)
        what = "diverged" if rec["bpb"] is None else f"bpb {rec['bpb']:.4f}"
        log(f"[{i}/{len(todo)}] {p.corpus} {p.stem}: N {rec['non_embedding_params']:,} {what} "
            f"({rec.get('point_wall_s', rec['wall_s']):.0f} s)")
    return len(todo)


# ---------------------------------------------------------------- fitting

def read_records(folder: Path, pattern: str = RESULTS_GLOB) -> list[dict]:
    """The run records in a corpus folder whose file names match `pattern`, less those marked `excluded`."""
    records = (read_record(p) for p in sorted(Path(folder).glob(pattern)))
    return [r for r in records if r is not None and not r.get("excluded")]


def merge_records(sources: list[Path], out: Path, log=print) -> int:
    """Copy the run records of other results folders (shards run elsewhere) into `out`; the number
    copied. A different record already there is an error: two runs of one point are never chosen between."""
    copied = 0
    for source in map(Path, sources):
        if not source.is_dir():
            raise ConfigError(f"--merge {source}: not a folder")
        for path in sorted(source.glob(f"*/{RESULTS_GLOB}")):
            target = out / path.parent.name / path.name
            rec = read_record(path)
            if rec is None:
                continue
            old = read_record(target, warn=False) if target.exists() else None
            if old is not None:  # (a damaged one is replaced)
                if json.dumps(old, sort_keys=True) != json.dumps(rec, sort_keys=True):
                    raise ConfigError(f"--merge: {path} differs from {target} (the same point run twice)")
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_json(target, rec)
            copied += 1
    log(f"merged {copied} records into {out}")
    return copied


def fit_corpus(folder: Path, n_boot: int = 1000, groups: dict | None = None, crossovers=(),
               command: str | None = None, budgets=None, interior_only: bool = False,
               fit_from: float | None = None) -> dict:
    """Fit every record in a corpus folder at `budgets` (the grid's: held-out budgets stay out); write
    fits.json, the plots and report.md there (`scaling_report`); the study (family or group -> FamilyFit)."""
    from rltok.analysis.compare import git_commit
    from rltok.analysis.scaling_plots import plot_inference, plot_study
    from rltok.analysis.scaling_report import build_report, report_markdown, report_plain

    folder = Path(folder)
    records = read_records(folder)
    splits = sorted({str(r.get("split")) for r in records if r.get("bpb") is not None})
    if len(splits) > 1:  # one study scores one split: runs scored on two cannot share a parabola
        raise ConfigError(f"{folder} holds runs scored on several splits ({', '.join(splits)}): a study fits "
                          "one; move the others' records out")
    rep = build_report(records, groups, crossovers, folder.name, n_boot, budgets=budgets,
                       interior_only=interior_only, fit_from=fit_from)
    _write_json(folder / "fits.json", report_plain(rep, command, git_commit()))
    crossings = [c for p in rep.crossovers if p.crossover for c in p.crossover.crossings]
    plots = plot_study(rep.study, folder, crossings=crossings)
    inference = plot_inference(list(rep.records), folder / f"inference_{folder.name}.png", folder.name)
    (folder / "report.md").write_text(report_markdown(rep, command, git_commit(), [p.name for p in plots],
                                                      inference and inference.name))
    return rep.study


def study_table(study: dict) -> str:
    """Per family and budget: the best measured size and its loss, the fitted N*, and whether the
    optimum is interior."""
    rows = []
    for family, fit in study.items():
        rows += [f"| {family} | {budget:.3g} | {iso.best_size:,.0f} | {iso.best_loss:.4f} | {number(iso.n_star)} "
                 f"| {'interior' if iso.interior else f'extend {iso.extend}'} |"
                 for budget, iso in sorted(fit.isofits.items())]
        if not fit.isofits:
            rows.append(f"| {family} | – | – | – | – | fewer than 3 sizes at every budget |")
    return table(["family", "budget", "best N", "best bpb", "fitted N*", "optimum"], rows)
