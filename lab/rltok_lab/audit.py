"""The compute-optimal study read the way an audit of its records asks, from the records alone:

- one reading at every budget, held-out budget included: each family's size chosen on the
  selection split (`best_by_choice`), its loss reported on the scored split;
- verdicts paired by seed at those sizes, pooled over budgets or corpora from cell means (one value
  per cell, a t interval over cells), never from pairs of cells that disagree as if one sample
  (under FLOPs as the kernels compute them the budgets' readings share cells, so their pooled
  mean is shown without an interval);
- a family-wise correction (Holm) over the verdicts a table reports, named in the table;
- FLOPs read twice: as the study charged them (causal pairs) and as the kernels compute them
  (every run's training FLOPs scaled by its forward kernel/causal ratio, one side's loss read at
  the other's point through its three nearest cells, a parabola in log FLOPs);
- total parameters and state memory beside N; runs made from uncommitted code marked.

`python -m rltok_lab audit` prints the tables; lab/reports/AUDIT.md is generated from it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from rltok.analysis.compare import reads_ahead
from rltok.analysis.paired_stats import mean_interval, paired_difference, t_cdf, t_quantile
from rltok.analysis.scaling_fit import best_by_choice, choice_loss, record_family, record_size
from rltok.config import ConfigError
from rltok_lab import records

CORPORA = ("docs-en", "code-py")
BUDGETS = (3e11, 6e11, 1e12, 3e12, 1e13)
# 1e11's optima sit at the smallest shapes (the study leaves it out of its fits); its cells only
# anchor the interpolation of the kernel-FLOPs reading at 3e11
ANCHOR = 1e11
HELD_OUT = 1e13
# the base rate multiplier each family trained at in the study (the hierarchies at twice the rule)
HIERARCHIES = ("uniform", "uniform_r0.1", "whitespace", "rl", "rl_r0.1")
LEARNED_PAIRS = (("rl", "uniform"), ("rl_r0.1", "uniform_r0.1"))
GROUPS = {"hierarchy": HIERARCHIES, "bytes": ("flat", "flat_ngram") + HIERARCHIES, "bpe": ("bpe1024", "bpe4096")}
VERDICTS = (("rl", "uniform"), ("rl_r0.1", "uniform_r0.1"), ("hierarchy", "flat"), ("bytes", "bpe"))
LEVEL = 0.95


def is_dirty(r: dict) -> bool:
    """Made from uncommitted code. A scored record without a commit is counted as such; a diverged
    one without it is not (older harnesses wrote no commit for a run that diverged)."""
    if r.get("commit"):
        return str(r["commit"]).endswith("+dirty")
    return r.get("bpb") is not None


def is_study_run(r: dict) -> bool:
    """Not a learning-rate check, and from committed code: a run of the study itself."""
    return r.get("point_kind") != "check" and not is_dirty(r)


def is_read(r: dict) -> bool:
    """A record a reading uses: a study run that was scored (not diverged)."""
    return r.get("bpb") is not None and is_study_run(r)


def study_runs(corpus: str, diverged: bool = False) -> list[dict]:
    """The runs of the study's one reading: every ladder, extension, optimum and verdict run, the
    held-out runs and the held-out profile's extra sizes, each at its family's own rate multiplier;
    not the learning-rate checks, not diverged runs (with `diverged`, those alone)."""
    main = records.load("scaling", corpus, "C*__*__N*__s*.json")
    mult = {record_family(r): r["lr_mult"] for r in main if r.get("point_kind") == "ladder"}
    extra = records.load("scaling_1e13_profile", corpus, "C*__*__N*__s*.json")
    out = []
    for r in main + extra:
        if r.get("point_kind") == "check" or (r.get("bpb") is None) != diverged:
            continue
        if r.get("lr_mult") != mult.get(record_family(r)):
            continue
        out.append(r)
    return out


@dataclasses.dataclass(frozen=True)
class Cell:
    """One family at its val-chosen size at one budget of one corpus."""
    family: str
    budget: float
    size: float  # N: non-embedding parameters
    test: dict  # {seed: scored bpb}
    params: float  # total parameters
    state_mb: float | None
    steps: float
    rate: float | None
    space_align: float | None
    kernel_ratio: float  # forward FLOPs as computed / as charged (causal pairs)
    dirty: int  # runs of this cell made from uncommitted code
    choice: float  # the selection split's mean over `choice_seeds`
    fitted_outside: float | None = None  # bytes a tokenizer was fitted on outside the budget
    reads_ahead: bool = False  # its cut at byte t depends on bytes after t (the rule cannot generate)
    choice_seeds: tuple = ()  # the seeds whose selection-split losses chose this size (every size ran them)
    diverged: tuple = ()  # seeds of this size whose runs diverged: absent from `test`, so every pairing is short of them

    @property
    def fresh(self) -> dict:
        """{seed: scored bpb} of the seeds that took no part in choosing the size: a lucky seed is
        lucky on both splits, so only these are free of the choice's optimism."""
        return {s: v for s, v in self.test.items() if s not in self.choice_seeds}

    @property
    def mean(self) -> float:
        return float(np.mean(list(self.test.values())))


def mean_of(rs: Sequence[dict], key: str) -> float | None:
    """The mean of `key` over the records that have it; None where none does."""
    vals = [float(r[key]) for r in rs if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def _check_choosable(here: list[dict], budget: float) -> None:
    """One record per (family, size, seed), and every record or none with a selection-split loss:
    either fault would let a choice read the wrong run or the scored split without a word."""
    seen = set()
    for r in here:
        key = (record_family(r), record_size(r), int(r["seed"]))
        if key in seen:
            raise ConfigError(f"two records of {key[0]} N={key[1]:,.0f} seed {key[2]} at {budget:.0e}: "
                              "move one aside (a choice would read only one of them)")
        seen.add(key)
    with_select = sum(r.get("bpb_select") is not None for r in here)
    if 0 < with_select < len(here):
        raise ConfigError(f"at {budget:.0e} {len(here) - with_select} of {len(here)} records have no selection-split "
                          "loss (bpb_select): their sizes would be chosen on the scored split")


def chosen_cells(runs: Iterable[dict], budget: float) -> dict[str, Cell]:
    """{family: its cell at the size chosen on the selection split} at `budget`. Raises ConfigError
    where a choice would misread the records (`_check_choosable`). Diverged records among `runs`
    choose nothing; each cell names those of its own size (`Cell.diverged`)."""
    runs = [r for r in runs if float(r["budget_flops"]) == budget]
    here = [r for r in runs if r.get("bpb") is not None]
    lost = [r for r in runs if r.get("bpb") is None]
    _check_choosable(here, budget)
    out = {}
    for family, size in best_by_choice(here).items():
        mine = [r for r in here if record_family(r) == family]
        sizes = {record_size(r) for r in mine}
        # the seeds best_by_choice compared the sizes on, by shared_seed_means' rule: those every size
        # ran, or each size's own where they share none; one size is no choice at all
        by_size = [{int(r["seed"]) for r in mine if record_size(r) == n} for n in sizes]
        chose = set() if len(sizes) == 1 else (set.intersection(*by_size) or set.union(*by_size))
        rs = [r for r in mine if record_size(r) == size]
        ratio = mean_of([{"x": r["forward_flops_per_byte_kernel"] / r["forward_flops_per_byte"]} for r in rs
                       if r.get("forward_flops_per_byte_kernel") and r.get("forward_flops_per_byte")], "x")
        out[family] = Cell(family, budget, size, {int(r["seed"]): float(r["bpb"]) for r in rs},
                           mean_of(rs, "params"), mean_of(rs, "state_mb"), mean_of(rs, "steps"), mean_of(rs, "rate"),
                           mean_of(rs, "space_align"), ratio or 1.0, sum(is_dirty(r) for r in rs),
                           float(np.mean([choice_loss(r) for r in rs if int(r["seed"]) in chose]
                                         or [choice_loss(r) for r in rs])), mean_of(rs, "tokenizer_fit_bytes"),
                           any(map(reads_ahead, rs)), tuple(sorted(chose)),
                           tuple(sorted(int(r["seed"]) for r in lost if record_family(r) == family and _same_rung(r, rs))))
    return out


def _same_rung(lost: dict, scored: list[dict]) -> bool:
    """Whether a diverged record ran the size of `scored`: by the ladder's size, since a diverged
    record's N is the ladder's (no model was kept) and a scored one's the built model's, which can
    differ; by N where a record has no ladder size."""
    ladder = {r.get("ladder_params") for r in scored} - {None}
    if lost.get("ladder_params") is not None and ladder:
        return lost["ladder_params"] in ladder
    return record_size(lost) in {record_size(r) for r in scored}


def group_cell(cells: dict[str, Cell], name: str, groups: dict = GROUPS) -> Cell | None:
    """A family's cell, or a group's best member by the selection loss."""
    if name not in groups:
        return cells.get(name)
    members = [cells[f] for f in groups[name] if f in cells]
    return min(members, key=lambda c: (c.choice, c.family)) if members else None


@dataclasses.dataclass(frozen=True)
class Verdict:
    corpus: str
    budget: float | str
    a: str
    b: str
    n: int
    mean: float
    lo: float
    hi: float
    p: float
    flops: str  # "charged" or "kernel"
    note: str = ""
    p_holm: float = math.nan

    @property
    def resolved(self) -> bool:
        return self.p_holm < 1 - LEVEL


def p_value(diffs: Sequence[float]) -> float:
    """Two-sided p of a zero mean (one-sample t over `diffs`)."""
    n = len(diffs)
    if n < 2:
        return 1.0
    sd = float(np.std(diffs, ddof=1))
    if sd == 0:
        return 0.0 if np.mean(diffs) != 0 else 1.0
    t = float(np.mean(diffs)) / (sd / math.sqrt(n))
    return 2.0 * (1.0 - t_cdf(abs(t), n - 1))


def paired(a: dict, b: dict) -> tuple[int, float, float, float, float] | None:
    """(n, mean, lo, hi, p) of a - b over the seeds both have."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    diffs = [a[s] - b[s] for s in seeds]
    d = paired_difference({s: a[s] for s in seeds}, {s: b[s] for s in seeds}, LEVEL)
    return len(seeds), d.mean, d.lo, d.hi, p_value(diffs)


def interpolated(cells_by_budget: dict[float, Cell], x: float) -> dict | None:
    """{seed: loss} of one family at kernel FLOPs `x`, read between its cells (their shared seeds);
    None outside them. Through the three cells nearest x, a parabola in log FLOPs: loss is convex
    in log FLOPs, so a chord between two cells overstates it (by up to about 0.005 bpb here) and
    would favour the side read at its own point; with two cells only, the chord."""
    pts = sorted(((c.budget * c.kernel_ratio, c) for c in cells_by_budget.values()), key=lambda p: p[0])
    for i, ((x0, _), (x1, _)) in enumerate(zip(pts, pts[1:])):
        if not x0 <= x <= x1:
            continue
        trios = [pts[j:j + 3] for j in (i - 1, i) if j >= 0 and j + 3 <= len(pts)]
        # of the two trios around the interval, the one reaching least far from x
        use = min(trios, key=lambda t: max(abs(math.log(p[0] / x)) for p in t)) if trios else pts[i:i + 2]
        u = [math.log(p[0]) for p in use]
        weights = [math.prod((math.log(x) - u[k]) / (u[j] - u[k]) for k in range(len(u)) if k != j)
                   for j in range(len(u))]  # Lagrange: exact on a line (two cells) or a parabola (three)
        seeds = set.intersection(*(set(p[1].test) for p in use))
        return {s: sum(w * p[1].test[s] for w, p in zip(weights, use)) for s in seeds} or None
    return None


def holm(verdicts: list[Verdict]) -> list[Verdict]:
    """Holm's step-down adjustment of the verdicts' p values (family-wise error at 1 - LEVEL)."""
    order = sorted(range(len(verdicts)), key=lambda i: verdicts[i].p)
    m = len(verdicts)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * verdicts[i].p))
        adjusted[i] = running
    return [dataclasses.replace(v, p_holm=q) for v, q in zip(verdicts, adjusted)]


@dataclasses.dataclass
class Study:
    """Every corpus's cells at every budget, and what the study compares."""
    cells: dict  # {corpus: {budget: {family: Cell}}}
    runs: dict  # {corpus: [records]}
    budgets: tuple = BUDGETS  # read, in order
    held_out: tuple = (HELD_OUT,)  # read, never pooled with the fitted budgets
    groups: dict = dataclasses.field(default_factory=lambda: dict(GROUPS))
    pairs: tuple = VERDICTS
    left_out: dict = dataclasses.field(default_factory=dict)  # {corpus: runs from uncommitted code}


def load_study(corpora: Sequence[str] = CORPORA, budgets: Sequence[float] = BUDGETS) -> Study:
    """The first compute-optimal study, from the lab's packed records."""
    return _study({c: study_runs(c) for c in corpora}, budgets, {c: study_runs(c, diverged=True) for c in corpora})


def _study(runs: dict, budgets: Sequence[float], diverged: dict | None = None, **kw) -> Study:
    """`runs`: {corpus: the records read}; `diverged`: {corpus: runs that diverged}, named by the
    cells of their size and read nowhere else."""
    lost = diverged or {}
    cells = {corpus: {b: chosen_cells([*rs, *lost.get(corpus, [])], b) for b in (ANCHOR, *budgets)}
             for corpus, rs in runs.items()}
    return Study(cells, runs, tuple(budgets), **kw)


def complete_budgets(status: list[dict], held: list[dict]) -> dict[str, list[float]]:
    """{corpus: the budgets with nothing left to run}, from a study's `study_status` rows (a grid
    budget whose dry run finds no point left; unknowable, so left out, where the corpus's data
    cannot be read) and `holdout_status` rows (a held-out budget once every run its prediction
    calls for is done)."""
    out: dict[str, list[float]] = {}
    for r in status:
        out.setdefault(r["corpus"], []).extend([r["budget"]] if r["complete"] else [])
    for r in held:
        out.setdefault(r["corpus"], []).extend([r["budget"]] if r["done"] == r["planned"] > 0 else [])
    return out


def grid_study(grid, folder: Path, budgets_read: dict[str, list[float]] | None = None) -> Study:
    """A grid's study from its results folder (`rltok scaling --out`): its budgets and held-out
    budgets, its groups, and its crossovers as the pairs; runs from uncommitted code and the
    learning-rate checks are left out of every cell (and counted by `left_out`). With
    `budgets_read` ({corpus: budgets}), only those budgets' runs are read."""
    from rltok.analysis.scaling import RESULTS_GLOB, read_record

    runs, left, lost = {}, {}, {}
    for corpus in grid.corpora:
        # every record, those `rltok scaling` marks excluded included, so that all are counted
        rs = [r for r in map(read_record, sorted((folder / corpus).glob(RESULTS_GLOB))) if r is not None]
        left[corpus] = sum(map(is_dirty, rs))
        rs = [r for r in rs if budgets_read is None or float(r["budget_flops"]) in budgets_read.get(corpus, ())]
        runs[corpus] = [r for r in rs if is_read(r)]
        lost[corpus] = [r for r in rs if r.get("bpb") is None and is_study_run(r)]
    budgets = tuple(sorted({*grid.budgets, *grid.holdout_budgets}))
    return _study(runs, budgets, lost, held_out=tuple(grid.holdout_budgets), groups={k: tuple(v) for k, v in grid.groups.items()},
                  pairs=tuple(tuple(p) for p in grid.crossovers), left_out=left)


def budget_verdicts(study: Study) -> list[Verdict]:
    """Each pair at each budget of each corpus, under charged and kernel FLOPs, plus each pair
    pooled over the fitted budgets from cell means (one per budget), under each count. A kernel
    reading draws on the neighbouring budgets' cells, so its pooled means are not independent: that
    row gives the mean alone (no interval, no p, outside every correction)."""
    out = []
    groups = study.groups
    for corpus, by_budget in study.cells.items():
        for a_name, b_name in study.pairs:
            pooled = {"charged": ([], []), "kernel": ([], [])}  # per count: one mean per fitted budget, and which
            caveats: list[str] = []  # what every pooled row must say that some budget's row says
            for budget in study.budgets:
                cells = by_budget.get(budget, {})
                a, b = group_cell(cells, a_name, groups), group_cell(cells, b_name, groups)
                if a is None or b is None:
                    continue
                r = paired(a.test, b.test)
                if r is None:
                    continue
                ahead = [c.family for c in (a, b) if c.reads_ahead]
                ahead_note = [f"{' and '.join(ahead)} cut reading bytes ahead"] if ahead else []
                dirty = a.dirty + b.dirty
                lost = _diverged_note(a, b)
                warn = [*([f"{dirty} runs from uncommitted code"] if dirty else []), *ahead_note, *lost]
                for w in [*ahead_note, *(["runs from uncommitted code"] if dirty else []),
                          *(["a budget's seed diverged"] if lost else [])]:
                    if w not in caveats:
                        caveats.append(w)
                members = [f"{a.family} vs {b.family}"] if (a_name in groups or b_name in groups) else []
                note = "; ".join([*members, *warn])
                out.append(Verdict(corpus, budget, a_name, b_name, *r, flops="charged", note=note))
                fitted = budget not in study.held_out
                if fitted:
                    pooled["charged"][0].append(r[1])
                    pooled["charged"][1].append(budget)
                kv = kernel_verdict(study, corpus, budget, a, b, a_name, b_name, note)
                out.append(kv)
                if fitted and kv.n:
                    pooled["kernel"][0].append(kv.mean)
                    pooled["kernel"][1].append(budget)
            for flops, (means, budgets) in pooled.items():
                if len(means) < 2:
                    continue
                span = f"{_short(budgets[0])}-{_short(budgets[-1])} (cell means)"
                if flops == "charged":
                    m, lo, hi = mean_interval(means, LEVEL)
                    out.append(Verdict(corpus, span, a_name, b_name, len(means), m, lo, hi, p_value(means), flops=flops,
                                       note="; ".join(caveats)))
                else:
                    out.append(Verdict(corpus, span, a_name, b_name, len(means), float(np.mean(means)), math.nan,
                                       math.nan, math.nan, flops=flops,
                                       note="; ".join(["the budgets' readings share cells: mean only", *caveats])))
    return out


def kernel_verdict(study: Study, corpus: str, budget: float, a: Cell, b: Cell, a_name: str, b_name: str,
                   note: str = "") -> Verdict:
    """a − b with FLOPs as the kernels compute them: each side's run sits at budget x its own
    kernel/charged ratio, so one side is read at the other's point along its family's cells
    (`interpolated`): b at a's point where b's cells reach it, else a at b's. A fitted budget reads
    only the fitted budgets' cells (and the anchor's), never a held-out one. `note`: the charged
    row's, kept in front of where each side was read."""
    by_budget = study.cells[corpus]
    usable = [bb for bb in by_budget if budget in study.held_out or bb not in study.held_out]

    def along(family: str) -> dict:
        return {bb: by_budget[bb][family] for bb in usable if family in by_budget[bb]}

    xa, xb = budget * a.kernel_ratio, budget * b.kernel_ratio
    b_at = interpolated(along(b.family), xa)
    if b_at and (r := paired(a.test, b_at)):
        return Verdict(corpus, budget, a_name, b_name, *r, flops="kernel", note=_join(note, f"{b.family} at {_flops(xa)}"))
    a_at = interpolated(along(a.family), xb)
    if a_at and (r := paired(a_at, b.test)):
        return Verdict(corpus, budget, a_name, b_name, *r, flops="kernel", note=_join(note, f"{a.family} at {_flops(xb)}"))
    return Verdict(corpus, budget, a_name, b_name, 0, math.nan, math.nan, math.nan, 1.0, flops="kernel",
                   note=_join(note, f"neither {_flops(xa)} nor {_flops(xb)} lies within the other family's budgets: not read"))


def _lost(seeds: Sequence[int]) -> str:
    """", seed 1 diverged" for the seeds that diverged; "" for none."""
    if not seeds:
        return ""
    return f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} diverged"


def _diverged_note(a: Cell, b: Cell | None = None) -> list[str]:
    """What a pairing of a with b must say of the seeds that diverged: those the other side has
    (the pairing's n is short of them); of a alone, every one."""
    out = []
    for c, other in ((a, b), (b, a)) if b is not None else ((a, None),):
        seeds = tuple(s for s in c.diverged if other is None or s in other.test)
        if seeds:
            out.append(f"{c.family}{_lost(seeds)}")
    return out


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _flops(x: float) -> str:
    return f"{x:.2e}".replace("e+", "e")


def _short(budget: float) -> str:
    return f"{budget:.0e}".replace("e+", "e")


def corrected_interval(v: Verdict, m: int) -> tuple[float, float]:
    """The verdict's t interval at level 1 - (1 - LEVEL) / m (Bonferroni): the m intervals of a table
    hold together at LEVEL. Holm's step-down is the more powerful test, so a verdict it resolves can
    still have a corrected interval that reaches 0."""
    if v.n < 2 or not math.isfinite(v.lo):
        return math.nan, math.nan
    alpha = 1 - LEVEL
    widen = t_quantile(1 - alpha / (2 * m), v.n - 1) / t_quantile(1 - alpha / 2, v.n - 1)
    half = (v.hi - v.lo) / 2 * widen
    return v.mean - half, v.mean + half


def verdicts_table(verdicts: list[Verdict]) -> str:
    def tested(v: Verdict) -> bool:  # read, with a p (a mean-only row is shown, never corrected)
        return bool(v.n) and math.isfinite(v.p)
    read = iter(holm([v for v in verdicts if tested(v)]))
    verdicts = [next(read) if tested(v) else v for v in verdicts]  # the table's order, Holm over the rows read
    m = sum(map(tested, verdicts))
    head = (f"| corpus | budget | A − B | FLOPs | n | mean | {LEVEL:.0%} interval | corrected interval | p | "
            f"p (Holm, m = {m}) | resolved | note |\n"
            "|---|---|---|---|---:|---:|---|---|---:|---:|---|---|")
    rows = []
    for v in verdicts:
        budget = v.budget if isinstance(v.budget, str) else _short(v.budget)
        if not v.n:
            rows.append(f"| {v.corpus} | {budget} | {v.a} − {v.b} | {v.flops} | 0 | — | — | — | — | — | — | {v.note} |")
            continue
        if not tested(v):
            rows.append(f"| {v.corpus} | {budget} | {v.a} − {v.b} | {v.flops} | {v.n} | {v.mean:+.3f} | — | — | — | — | — "
                        f"| {v.note} |")
            continue
        interval = f"[{v.lo:+.3f}, {v.hi:+.3f}]" if math.isfinite(v.lo) else "—"
        lo, hi = corrected_interval(v, m)
        joint = f"[{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) else "—"
        rows.append(f"| {v.corpus} | {budget} | {v.a} − {v.b} | {v.flops} | {v.n} | {v.mean:+.3f} | {interval} | {joint} | "
                    f"{v.p:.3f} | {v.p_holm:.3f} | {'yes' if v.resolved else 'no'} | {v.note} |")
    return "\n".join([head, *rows])


def per_corpus(study: Study, budgets: Sequence[float] | Mapping[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    """{corpus: budgets}: the same budgets for every corpus, or each corpus its own."""
    return dict(budgets) if isinstance(budgets, Mapping) else {c: budgets for c in study.cells}


def _cell_text(c: Cell) -> tuple[str, str, str, str]:
    """A cell's test bpb (± sd over seeds, and their number), rate, whitespace alignment and state MB,
    as every table prints them ("—" where a family has none)."""
    sd = f" ± {np.std(list(c.test.values()), ddof=1):.3f}" if len(c.test) > 1 else ""
    return (f"{c.mean:.3f}{sd} ({len(c.test)}{_lost(c.diverged)})", f"{c.rate:.3f}" if c.rate is not None else "—",
            f"{c.space_align:.2f}" if c.space_align is not None else "—",
            f"{c.state_mb:.1f}" if c.state_mb is not None else "—")


def cells_table(study: Study, budgets: Sequence[float] | Mapping[str, Sequence[float]] = (3e12, HELD_OUT)) -> str:
    head = ("| corpus | budget | family | N | total params | state MB | steps | test bpb (seeds) | rate | "
            "whitespace alignment | kernel/charged FLOPs | tokenizer fitted outside the budget | cuts read ahead | "
            "uncommitted runs |\n"
            "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|---|---:|")
    rows = []
    shown = per_corpus(study, budgets)
    for corpus, by_budget in study.cells.items():
        for budget in shown.get(corpus, ()):
            for fam, c in sorted(by_budget.get(budget, {}).items(), key=lambda kv: kv[1].mean):
                bpb, rate, align, state = _cell_text(c)
                rows.append(f"| {corpus} | {budget:.0e} | {fam} | {c.size:,.0f} | {c.params:,.0f} | {state} | "
                            f"{c.steps:,.0f} | {bpb} | {rate} | {align} | "
                            f"{c.kernel_ratio:.2f} | {_fitted(c)} | {'yes' if c.reads_ahead else 'no'} | "
                            f"{c.dirty} |".replace("e+", "e"))
    return "\n".join([head, *rows])


def reference_form(study: Study, against: str, budgets: Sequence[float] | Mapping[str, Sequence[float]]) -> str:
    """The reference's table against one family: at each of `budgets`, every family the study pairs
    with `against` (a group by its members), at its val-chosen size, with its test bpb, achieved rate,
    whitespace alignment, N, total parameters and state memory, and its difference from `against`
    paired by seed (FLOPs as charged), Holm's correction and the corrected intervals taken over each
    budget's planned rows (every family paired with `against`, on every corpus, shown or not): a
    row not read yet counts as p = 1, so a reading made before the budget is complete is an upper
    bound that later rows can only lower (Holm's adjusted p is monotone in each p), and a later
    budget's rows never change an earlier budget's. Beside it, the difference over the seeds that
    took no part in choosing either size (the optimum seeds): free of the choice's optimism."""
    names = []
    for pair in study.pairs:
        if against in pair:  # either way round: each row is read as row − reference
            other = pair[0] if pair[1] == against else pair[1]
            names += [m for m in study.groups.get(other, (other,)) if m not in names and m != against]
    if not names:
        raise ConfigError(f"--reference {against}: no pair in the grid's crossovers names it "
                          f"(pairs: {', '.join(f'{a}/{b}' for a, b in study.pairs) or 'none'})")

    def verdicts_at(corpus: str, budget: float) -> dict:
        """{family: its verdict against the reference, or None without a shared seed} where both ran."""
        cells = study.cells[corpus].get(budget, {})
        ref = cells.get(against)
        out = {}
        for name in names if ref is not None else ():
            if name in cells:
                r = paired(cells[name].test, ref.test)
                out[name] = Verdict(corpus, budget, name, against, *r, "charged") if r else None
        return out

    shown = per_corpus(study, budgets)
    planned = len(names) * len(study.cells)
    adjusted, read = {}, {}  # {(corpus, budget, family): verdict with p_holm}; {budget: rows read}
    for budget in sorted({b for bs in shown.values() for b in bs}):
        family = [v for corpus in study.cells for v in verdicts_at(corpus, budget).values() if v is not None]
        placeholders = [Verdict("", budget, "", "", 0, math.nan, math.nan, math.nan, 1.0, "charged")] * (planned - len(family))
        for v in holm(family + placeholders)[:len(family)]:
            adjusted[(v.corpus, budget, v.a)] = v
        read[budget] = len(family)
    entries = []  # (corpus, budget, cell, verdict or None)
    for corpus, by_budget in study.cells.items():
        for budget in shown.get(corpus, ()):
            cells = by_budget.get(budget, {})
            if against not in cells:
                continue
            for name in [against, *names]:
                if name in cells:
                    entries.append((corpus, budget, cells[name], adjusted.get((corpus, budget, name))))
    family = ", ".join(f"{planned} at {_short(b)}" + (f" ({n} read)" if n < planned else "") for b, n in read.items())
    head = (f"| corpus | budget | family | test bpb (seeds) | rate | whitespace alignment | N | total params | "
            f"state MB | − {against} | corrected interval | p (Holm over the budget's rows on every corpus, a row "
            f"not read as p = 1: m = {family}) | resolved | − {against}, seeds that chose neither size (n) | note |\n"
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---|")
    refs = {(e[0], e[1]): e[2] for e in entries if e[2].family == against}
    rows = []
    for corpus, budget, c, v in sorted(entries, key=lambda e: (list(study.cells).index(e[0]), e[1], e[2].mean)):
        bpb, rate, align, state = _cell_text(c)
        cols = [bpb, rate, align, f"{c.size:,.0f}", f"{c.params:,.0f}", state]
        if v is None:
            diff = ["reference" if c.family == against else "no shared seed", "—", "—", "—", "—"]
        else:
            lo, hi = corrected_interval(v, planned)  # every budget's family has the planned size
            ref_fresh = refs[(corpus, budget)].fresh
            fresh = sorted(set(c.fresh) & set(ref_fresh))
            diff = [f"{v.mean:+.3f}", f"[{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) else "—", f"{v.p_holm:.3f}",
                    "yes" if v.resolved else "no",
                    f"{np.mean([c.fresh[s] - ref_fresh[s] for s in fresh]):+.3f} ({len(fresh)})" if fresh else "—"]
        ref = refs[(corpus, budget)]
        note = "; ".join([*(["cuts read ahead"] if c.reads_ahead else []),
                          *_diverged_note(*([c] if c is ref else [c, ref])),
                          *([f"tokenizer fitted outside the budget on {c.fitted_outside / 1e6:.1f}M bytes"]
                            if c.fitted_outside else []),
                          *([f"{c.dirty} runs from uncommitted code"] if c.dirty else [])])
        rows.append(f"| {corpus} | {_short(budget)} | {c.family} | " + " | ".join(cols + diff) + f" | {note} |")
    return "\n".join([head, *rows])


def _fitted(c: Cell) -> str:
    return f"yes, on {c.fitted_outside / 1e6:.1f}M bytes" if c.fitted_outside else "no"


# ------------------------------------------------------------------ the steps trend

@dataclasses.dataclass(frozen=True)
class Trend:
    label: str
    cells: int
    slope: float  # bpb per decade of optimizer steps
    se: float
    mean_gap: float
    lo: float
    hi: float


def matched_cells(runs: Sequence[dict], a: str, b: str, budgets: Sequence[float]) -> list[dict]:
    """Cells (budget, size rung) where both families ran the same shape: the learned run's steps,
    the mean gap a - b over their shared seeds, and whether the rung is its budget's largest."""
    out = []
    for budget in budgets:
        here = [r for r in runs if float(r["budget_flops"]) == budget and r.get("point_kind") != "holdout"]
        by = {}
        for r in here:
            if record_family(r) in (a, b):
                by.setdefault((r["target_size"], r.get("width"), r.get("depth")), {}).setdefault(
                    record_family(r), {})[int(r["seed"])] = r
        rungs = sorted({k[0] for k in by})
        for key, fams in by.items():
            if a not in fams or b not in fams:
                continue
            seeds = sorted(set(fams[a]) & set(fams[b]))
            gaps = [fams[a][s]["bpb"] - fams[b][s]["bpb"] for s in seeds]
            steps = float(np.mean([fams[a][s]["steps"] for s in seeds]))
            out.append({"budget": budget, "size": key[0], "gap": float(np.mean(gaps)), "steps": steps,
                        "largest": key[0] == rungs[-1], "seeds": len(seeds)})
    return out


def trend(cells: Sequence[dict], label: str) -> Trend | None:
    """Least-squares slope of the cell gaps against log10(steps), one point per cell."""
    if len(cells) < 3:
        return None
    x = np.log10([c["steps"] for c in cells])
    y = np.array([c["gap"] for c in cells])
    xm = x - x.mean()
    slope = float((xm * (y - y.mean())).sum() / (xm ** 2).sum())
    resid = y - y.mean() - slope * xm
    se = float(math.sqrt((resid ** 2).sum() / (len(x) - 2) / (xm ** 2).sum()))
    half = t_quantile(0.5 + LEVEL / 2, len(x) - 2) * se
    return Trend(label, len(cells), slope, se, float(y.mean()), slope - half, slope + half)


def steps_trends(study: Study, budgets: Sequence[float] = (3e11, 6e11, 1e12, 3e12)) -> list[Trend]:
    out = []
    cells = []
    for corpus, runs in study.runs.items():
        for a, b in LEARNED_PAIRS:
            cells += matched_cells(runs, a, b, budgets)
    for label, subset in (("every matched cell", cells),
                          ("without each budget's largest rung", [c for c in cells if not c["largest"]]),
                          ("each budget's largest rung only", [c for c in cells if c["largest"]])):
        t = trend(subset, label)
        if t:
            out.append(t)
    return out


def trends_table(trends: Sequence[Trend]) -> str:
    head = ("| cells (learned − uniform, both rates, both corpora, 3e11-3e12) | n | mean gap | slope per decade "
            f"of steps | {LEVEL:.0%} interval |\n|---|---:|---:|---:|---|")
    return "\n".join([head, *(f"| {t.label} | {t.cells} | {t.mean_gap:+.3f} | {t.slope:+.3f} ± {t.se:.3f} | "
                              f"[{t.lo:+.3f}, {t.hi:+.3f}] |" for t in trends)])


# ------------------------------------------------------------------ bytes against BPE at equal parameters

def equal_params_verdicts(study: Study, budgets: Sequence[float] = BUDGETS) -> list[Verdict]:
    """The best byte model whose total parameters are at most the val-chosen BPE model's, against it."""
    out = []
    for corpus, by_budget in study.cells.items():
        for budget in budgets:
            bpe = group_cell(by_budget.get(budget, {}), "bpe")
            if bpe is None:
                continue
            here = [r for r in study.runs[corpus] if float(r["budget_flops"]) == budget
                    and record_family(r) in GROUPS["bytes"] and r["params"] <= bpe.params]
            if not here:
                out.append(Verdict(corpus, budget, "bytes (≤ BPE's params)", "bpe", 0, math.nan, math.nan, math.nan,
                                   1.0, "charged", note="no byte run this small"))
                continue
            best = min(chosen_cells(here, budget).values(), key=lambda c: (c.choice, c.family))
            r = paired(best.test, bpe.test)
            if r:
                out.append(Verdict(corpus, budget, "bytes (≤ BPE's params)", "bpe", *r, flops="charged",
                                   note=f"{best.family} {best.params:,.0f} vs {bpe.family} {bpe.params:,.0f} params"))
    return out


def report() -> str:
    study = load_study()
    verdicts = budget_verdicts(study)
    parts = ["## Each family at its val-chosen size", cells_table(study),
             "## Verdicts at val-chosen sizes, FLOPs as charged (causal pairs)",
             verdicts_table([v for v in verdicts if v.flops == "charged"]),
             "## The same verdicts, FLOPs as the kernels compute them",
             verdicts_table([v for v in verdicts if v.flops == "kernel"]),
             "## Learned − uniform cuts against optimizer steps (shape-matched cells)", trends_table(steps_trends(study))]
    equal = equal_params_verdicts(study)
    parts += ["## Bytes against BPE tokens at equal total parameters", verdicts_table(equal)]
    return "\n\n".join(parts) + "\n"


def grid_report(grid, folder: Path, complete_only: bool = False, references: Sequence[str] = ()) -> str:
    """A grid's study in the reference's form: each family at its val-chosen size at the largest
    fitted budget with runs and at the held-out budgets, then its crossovers as paired verdicts
    under both FLOP counts, each table corrected with Holm over its own verdicts; first, for each
    family in `references`, the reference's table against it (`reference_form`). With
    `complete_only`, where the study stands first, and only its complete budgets read."""
    parts = []
    budgets_read = None
    if complete_only:
        from rltok_lab.scaling_status import holdout_status, holdout_table, status_table, study_status

        status, held = study_status(grid, folder), holdout_status(grid, folder)
        budgets_read = complete_budgets(status, held)
        said = "; ".join(f"{c}: {', '.join(map(_short, bs)) or 'none yet'}" for c, bs in budgets_read.items())
        parts += ["## Where the study stands", status_table(status)]
        parts += [holdout_table(held)] if held else []
        parts += [f"Budgets read below, those with nothing left to run: {said}. A budget with runs still to "
                  "come is read nowhere: no verdict before its ladders, extensions and optimum seeds are done."]
    study = grid_study(grid, folder, budgets_read)
    shown = {}  # per corpus: its largest fitted budget read, and its held-out budgets read
    for corpus, by_budget in study.cells.items():
        read = [b for b in study.budgets if by_budget.get(b)]
        fitted = [b for b in read if b not in study.held_out]
        shown[corpus] = ([fitted[-1]] if fitted else []) + [b for b in read if b in study.held_out]
    verdicts = budget_verdicts(study)
    parts += [f"Runs from uncommitted code left out: {', '.join(f'{c} {n}' for c, n in study.left_out.items())}."]
    for ref in references:
        parts += [f"## In the reference's form: against {ref}", reference_form(study, ref, shown)]
    parts += [
             "## Each family at its val-chosen size", cells_table(study, shown),
             "## Paired verdicts, FLOPs as charged (causal pairs)", verdicts_table([v for v in verdicts if v.flops == "charged"]),
             "## The same verdicts, FLOPs as the kernels compute them",
             verdicts_table([v for v in verdicts if v.flops == "kernel"])]
    return "\n\n".join(parts) + "\n"


def splice(doc: Path, text: str, marker: str = "audit") -> None:
    """Replace what stands between the `marker` markers of `doc` (<!-- audit:begin --> ...) with `text`."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    old = doc.read_text()
    if begin not in old or end not in old:
        raise ConfigError(f"{doc}: no {begin} ... {end} block to write the tables into")
    head, rest = old.split(begin, 1)
    tail = rest.split(end, 1)[1]
    doc.write_text(f"{head}{begin}\n\n{text}\n{end}{tail}")
