"""Fits of the isoFLOP study from run records, numpy only: per-budget parabolas, per-family envelopes,
crossovers and held-out predictions, each with a seeded bootstrap (docs/SCALING.md, "The fits")."""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class IsoProfile:
    """One family's runs at one budget: distinct sizes (ascending) and each size's seed losses."""
    budget: float
    sizes: np.ndarray
    losses: tuple  # of 1-d arrays, one per size, in seed order
    seeds: tuple  # of tuples, one per size

    @property
    def means(self) -> np.ndarray:
        return np.array([v.mean() for v in self.losses])

    @property
    def counts(self) -> np.ndarray:
        return np.array([len(v) for v in self.losses], dtype=float)


def record_family(r: dict) -> str:
    return r["family"] if r.get("family") is not None else r["method"]


def record_shape(r: dict) -> str | None:
    """A run's shape as its record states it ("32/48 × 1+1+1", "32 × 2"); None for a diverged run's."""
    if r.get("width") is None:
        return None
    return f"{r['width']} × {r.get('depth')}"


def record_size(r: dict) -> float:
    n = r.get("non_embedding_params")
    return float(n if n is not None else r["params"])


def choice_loss(rec: dict) -> float:
    """The loss the study's choices read: on the selection split where the record has one
    (`bpb_select`), so that the reported split only reports."""
    return float(rec.get("bpb_select", rec["bpb"]))


def shared_seed_means(cells: list[dict]) -> list[float]:
    """Per cell ({seed: loss}), the mean over the seeds every cell has (over all its own seeds
    where they share none)."""
    common = set.intersection(*(set(c) for c in cells)) if cells else set()
    return [float(np.mean([v for s, v in c.items() if not common or s in common])) for c in cells]


def best_by_choice(records: Iterable[dict], key=record_size) -> dict:
    """{family: the `key` (a run's size by default) with the lowest mean choice loss}, ties to the
    smaller key: the study's one rule for "the best size" (pass one budget's records). The means
    are over the seeds every size ran, so extra seeds at one size never move the choice."""
    cells: dict = {}
    for r in records:
        if r.get("bpb") is not None:
            cells.setdefault(record_family(r), {}).setdefault(key(r), {})[r["seed"]] = choice_loss(r)
    return {fam: min(zip(shared_seed_means(list(by_key.values())), by_key))[1] for fam, by_key in cells.items()}


def best_size_index(profile: IsoProfile) -> int:
    """The index of a profile's best size by `best_by_choice`'s rule."""
    means = shared_seed_means([dict(zip(seeds, map(float, losses))) for seeds, losses in zip(profile.seeds, profile.losses)])
    return int(np.argmin(means))


def choice_records(records: Iterable[dict]) -> list[dict]:
    """The records with their choice loss as `bpb`: profiles of these choose, never report."""
    return [{**r, "bpb": choice_loss(r)} for r in records if r.get("bpb") is not None]


def profiles_from_records(records: Iterable[dict], split: str | None = None) -> dict[str, dict[float, IsoProfile]]:
    """{family: {budget: IsoProfile}} of the records (of `split` only when given; diverged runs left out)."""
    records = [r for r in records if r.get("bpb") is not None and (split is None or r.get("split") == split)]
    splits = {r.get("split") for r in records}
    if len(splits) > 1:
        raise ValueError(f"records of several splits {sorted(map(str, splits))}: pass split=")
    table: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in records:
        cell = table[record_family(r)][float(r["budget_flops"])][record_size(r)]
        if r["seed"] in cell:
            raise ValueError(f"two runs of {record_family(r)} at budget {r['budget_flops']:g}, size "
                             f"{record_size(r):g}, seed {r['seed']}")
        cell[r["seed"]] = float(r["bpb"])
    out = {}
    for family, by_budget in table.items():
        out[family] = {}
        for budget in sorted(by_budget):
            sizes = sorted(by_budget[budget])
            cells = [by_budget[budget][n] for n in sizes]
            losses = tuple(np.array([c[s] for s in sorted(c)]) for c in cells)
            out[family][budget] = IsoProfile(budget, np.array(sizes), losses, tuple(tuple(sorted(c)) for c in cells))
    return out


# ---------------------------------------------------------------- the isoFLOP parabola

@dataclasses.dataclass(frozen=True)
class Parabola:
    """loss = c0 + c1 (x - x0) + c2 (x - x0)^2 in x = ln N."""
    c0: float
    c1: float
    c2: float
    x0: float

    def __call__(self, n) -> np.ndarray:
        d = np.log(np.asarray(n, dtype=float)) - self.x0
        return self.c0 + self.c1 * d + self.c2 * d * d

    @property
    def convex(self) -> bool:
        return self.c2 > 0

    @property
    def optimum(self) -> tuple[float, float]:
        """(N*, L*), NaN where the parabola has no minimum."""
        if not self.convex:
            return math.nan, math.nan
        dx = -self.c1 / (2 * self.c2)
        return math.exp(self.x0 + dx), self.c0 - self.c1 * self.c1 / (4 * self.c2)


def parabola_optima(sizes: np.ndarray, means: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(N*, L*) of the parabolas fitted to every row of `means` (replicates x sizes) at once; NaN
    where a row's parabola has no minimum."""
    c0, c1, c2, x0 = _fit_rows(sizes, np.atleast_2d(means), weights)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a near-flat replicate: N* = inf
        dx = -c1 / (2 * c2)
        out = np.stack([np.exp(x0 + dx), c0 - c1 * c1 / (4 * c2)], axis=1)
    return np.where((c2 > 0)[:, None], out, np.nan)


def _fit_rows(sizes: np.ndarray, means: np.ndarray, weights: np.ndarray | None):
    """Weighted least squares of each row of means on (1, d, d^2), d = ln N - x0, x0 the
    weighted mean of ln N: (c0, c1, c2) arrays and x0."""
    x = np.log(np.asarray(sizes, dtype=float))
    if len(np.unique(x)) < 3:
        raise ValueError(f"a parabola needs 3 or more distinct sizes, got {len(np.unique(x))}")
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    x0 = float(np.sum(w * x) / np.sum(w))
    d = x - x0
    root = np.sqrt(w)
    solve = np.linalg.pinv(np.stack([np.ones_like(d), d, d * d], axis=1) * root[:, None])
    coef = (np.asarray(means, dtype=float) * root) @ solve.T
    return coef[:, 0], coef[:, 1], coef[:, 2], x0


def fit_parabola(sizes: np.ndarray, means: np.ndarray, weights: np.ndarray | None = None) -> Parabola:
    """Weighted least squares of means on (1, x, x^2), x = ln sizes centred at their weighted mean."""
    c0, c1, c2, x0 = _fit_rows(sizes, np.asarray(means, dtype=float)[None, :], weights)
    return Parabola(float(c0[0]), float(c1[0]), float(c2[0]), x0)


def extend_side(profile: IsoProfile, parabola: Parabola) -> str | None:
    """None when the optimum is interior (the best size is neither end of the ladder and the
    parabola's minimum lies within it), else "smaller" or "larger": where the ladder must grow."""
    if not parabola.convex:  # no minimum: the curve falls towards its lower end
        return "smaller" if profile.means[0] <= profile.means[-1] else "larger"
    best, n_star, sizes = best_size_index(profile), parabola.optimum[0], profile.sizes
    if best == 0 or n_star < sizes[0]:
        return "smaller"
    if best == len(sizes) - 1 or n_star > sizes[-1]:
        return "larger"
    return None


def _percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    samples = np.asarray(samples, dtype=float)
    samples = samples[np.isfinite(samples)]
    if len(samples) == 0:
        return math.nan, math.nan
    lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def _draw_means(profile: IsoProfile, parabola: Parabola, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """n_boot bootstrap replicates of a profile's seed means (n_boot x sizes), drawn as its
    `resample_mode` says."""
    mode = resample_mode(profile)
    if mode == "unavailable":
        return np.full((n_boot, len(profile.sizes)), np.nan)
    if mode == "residuals":
        m, fitted = len(profile.sizes), parabola(profile.sizes)
        return fitted + rng.choice((profile.means - fitted) * math.sqrt(m / (m - 3)), (n_boot, m))
    cols = []
    for v in profile.losses:
        n, m = len(v), v.mean()
        if n == 1:  # "pooled": a normal draw with the profile's pooled seed sd
            cols.append(m + rng.normal(0.0, pooled_within_sd(profile.losses), n_boot))
            continue
        # the drawn seeds' spread about the mean widened by sqrt(n / (n - 1)): a plain
        # resample of n seeds understates the mean's variance by (n - 1) / n, a half with two
        cols.append(m + (v[rng.integers(0, n, (n_boot, n))] - m).mean(axis=1) * math.sqrt(n / (n - 1)))
    return np.stack(cols, axis=1)


def resample_mode(profile: IsoProfile) -> str:
    """How one profile's bootstrap draws its seed means: "seeds" when every size has two or more
    seeds; else "residuals" with 4 or more sizes (a parabola through 3 leaves none); else "pooled"
    where some size has two seeds to give a seed sd; else "unavailable". Chosen per profile, so one
    budget's lost seed never changes how another budget is resampled."""
    if all(len(v) >= 2 for v in profile.losses):
        return "seeds"
    if len(profile.sizes) > 3:
        return "residuals"
    return "pooled" if pooled_within_sd(profile.losses) else "unavailable"


@dataclasses.dataclass(frozen=True)
class IsoFit:
    """One family's isoFLOP profile at one budget, fitted."""
    budget: float
    sizes: np.ndarray
    means: np.ndarray
    counts: np.ndarray
    parabola: Parabola
    n_star: float  # NaN when the parabola has no minimum
    l_star: float
    residual_sd: float | None  # of the seed means about the parabola (m - 3 dof); None with 3 sizes
    seed_sd: float | None  # pooled within-size sd of the seeds; None with single seeds
    best_size: float  # measured
    best_loss: float
    interior: bool
    extend: str | None  # "smaller" / "larger" when not interior
    n_star_interval: tuple[float, float]
    l_star_interval: tuple[float, float]
    level: float
    resample: str
    boot_valid: float  # share of bootstrap replicates with a minimum


def pooled_within_sd(groups: Iterable[Sequence[float]]) -> float | None:
    """The sd of one value about its group's mean (a group: one size's seed losses), pooled over
    groups; None where no group has two values."""
    arrays = [np.asarray(g, dtype=float) for g in groups]
    dof = sum(len(v) - 1 for v in arrays if len(v))
    ss = sum(float(np.sum((v - v.mean()) ** 2)) for v in arrays if len(v))
    return math.sqrt(ss / dof) if dof > 0 else None


def _choice(profile: IsoProfile, parabola: Parabola, chosen: IsoProfile | None) -> tuple[IsoProfile, str | None]:
    """The profile a choice reads (`chosen`, the choice split's, where given: measured at the same
    sizes) and `extend_side` read on its own parabola (`parabola`, the reported one's, without it)."""
    if chosen is None:
        return profile, extend_side(profile, parabola)
    if not np.array_equal(chosen.sizes, profile.sizes):
        raise ValueError(f"the choice profile at budget {profile.budget:g} has other sizes than the reported one")
    return chosen, extend_side(chosen, fit_parabola(chosen.sizes, chosen.means, chosen.counts))


def fit_isoflop(profile: IsoProfile, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                chosen: IsoProfile | None = None) -> IsoFit:
    """The parabola of one profile, its optimum, whether it is interior, and bootstrap intervals
    of N* and L*. `chosen`: the same runs' profile on the choice split, which then decides the
    best size and whether the optimum is interior (the reported split only reports)."""
    parabola = fit_parabola(profile.sizes, profile.means, profile.counts)
    n_star, l_star = parabola.optimum
    chooser, side = _choice(profile, parabola, chosen)
    draws = _draw_means(profile, parabola, np.random.default_rng(seed), n_boot)
    optima = parabola_optima(profile.sizes, draws, profile.counts) if n_boot else np.zeros((0, 2))
    valid = np.isfinite(optima[:, 0])
    m = len(profile.sizes)
    residual_sd = float(math.sqrt(np.sum((profile.means - parabola(profile.sizes)) ** 2) / (m - 3))) if m > 3 else None
    best = best_size_index(chooser)
    return IsoFit(profile.budget, profile.sizes, profile.means, profile.counts, parabola, n_star, l_star,
                  residual_sd, pooled_within_sd(profile.losses), float(profile.sizes[best]), float(profile.means[best]),
                  side is None, side,
                  _percentile_interval(optima[valid, 0], level), _percentile_interval(optima[valid, 1], level),
                  level, resample_mode(profile), float(valid.mean()) if n_boot else math.nan)


# ---------------------------------------------------------------- the envelope L*(C), N*(C)

ALPHA_GRID = np.geomspace(1e-3, 3.0, 600)


def _solve_linear(f: np.ndarray, y: np.ndarray, fix_e: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each row of f (one alpha each), least squares of y on E + A f with E >= 0 (or fixed):
    (E, A, sse) per row; sse is inf where A <= 0 (the loss would not fall with compute)."""
    if fix_e is not None:
        e = np.full(len(f), float(fix_e))
        a = np.sum(f * (y - fix_e), axis=1) / np.sum(f * f, axis=1)
    else:
        n, sf, sff, sy, sfy = len(y), f.sum(1), (f * f).sum(1), y.sum(), (f * y).sum(1)
        with np.errstate(divide="ignore", invalid="ignore"):
            det = n * sff - sf * sf
            e = (sff * sy - sf * sfy) / det
            a = (n * sfy - sf * sy) / det
        neg = ~(e >= 0)  # negative, or undetermined (alpha -> 0 makes f constant)
        e = np.where(neg, 0.0, e)
        a = np.where(neg, sfy / sff, a)
    sse = np.sum((y - e[:, None] - a[:, None] * f) ** 2, axis=1)
    return e, a, np.where((a > 0) & np.isfinite(sse), sse, np.inf)


def fit_power_law(log_c: np.ndarray, y: np.ndarray, fix_e: float | None = None) -> tuple[float, float, float, bool]:
    """L = E + A exp(-alpha log_c), least squares: (E, log A, alpha, alpha_at_grid_bound).
    log_c should be centred (conditioning); the caller shifts log A back."""
    _, _, sse = _solve_linear(np.exp(-np.outer(ALPHA_GRID, log_c)), y, fix_e)
    i = int(np.argmin(sse))
    if not np.isfinite(sse[i]):
        raise ValueError("the optima do not fall with compute: no E + A C^-alpha with A > 0 fits")

    def cost(alpha: float) -> float:
        return float(_solve_linear(np.exp(-alpha * log_c)[None, :], y, fix_e)[2][0])

    lo, hi = ALPHA_GRID[max(i - 1, 0)], ALPHA_GRID[min(i + 1, len(ALPHA_GRID) - 1)]
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = cost(a), cost(b)
    for _ in range(40):  # golden section between the grid neighbours of the best grid point
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = cost(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = cost(b)
    alpha = a if fa < fb else b
    alpha = alpha if min(fa, fb) <= sse[i] else float(ALPHA_GRID[i])
    e, amp, _ = _solve_linear(np.exp(-alpha * log_c)[None, :], y, fix_e)
    return float(e[0]), math.log(amp[0]), float(alpha), i in (0, len(ALPHA_GRID) - 1)


@dataclasses.dataclass(frozen=True)
class PowerParams:
    """L*(C) = E + exp(log_a) C^-alpha and N*(C) = exp(log_k) C^a (each field a float, or an
    array of bootstrap replicates)."""
    e: float | np.ndarray
    log_a: float | np.ndarray
    alpha: float | np.ndarray
    log_k: float | np.ndarray
    a: float | np.ndarray

    def _shaped(self, c, *fields):
        lc = np.log(np.asarray(c, dtype=float))
        arrays = [np.asarray(v, dtype=float) for v in fields]
        shape = arrays[0].shape + (1,) * lc.ndim  # replicates first, then the shape of c
        return lc, [v.reshape(shape) for v in arrays]

    def loss(self, c) -> np.ndarray:
        lc, (e, log_a, alpha) = self._shaped(c, self.e, self.log_a, self.alpha)
        return e + np.exp(log_a - alpha * lc)

    def size(self, c) -> np.ndarray:
        lc, (log_k, a) = self._shaped(c, self.log_k, self.a)
        return np.exp(log_k + a * lc)

    def map(self, fn) -> PowerParams:
        """The law with `fn` applied to each field as an array (a slice of the replicates, a reshape)."""
        return PowerParams(*(fn(np.asarray(v, dtype=float)) for v in (self.e, self.log_a, self.alpha, self.log_k,
                                                                          self.a)))


def fit_power_params(budgets: np.ndarray, l_star: np.ndarray, n_star: np.ndarray,
                     fix_e: float | None) -> tuple[PowerParams, bool]:
    """Both envelopes from per-budget optima; and whether alpha sits at its grid's bound."""
    budgets = np.asarray(budgets, dtype=float)
    if len(budgets) < (2 if fix_e is not None else 3):
        raise ValueError(f"{len(budgets)} budgets with a minimum: too few for the envelope "
                         f"({'2' if fix_e is not None else '3, or fix E'} needed)")
    lc = np.log(budgets)
    c0 = float(lc.mean())
    e, log_a, alpha, at_bound = fit_power_law(lc - c0, np.asarray(l_star, dtype=float), fix_e)
    a, log_k = np.polyfit(lc, np.log(n_star), 1)
    return PowerParams(e, log_a + alpha * c0, alpha, float(log_k), float(a)), at_bound


@dataclasses.dataclass(frozen=True)
class Envelope:
    """One family's compute-optimal frontier: the fit, its bootstrap replicates and intervals."""
    family: str
    budgets: np.ndarray  # the budgets fitted
    l_star: np.ndarray  # their parabolas' optima
    n_star: np.ndarray
    params: PowerParams
    boot: PowerParams  # one array entry per successful replicate
    intervals: dict  # "E", "A", "alpha", "k", "a": percentile intervals at `level`
    e_fixed: float | None  # E held at this value (not fitted) when set
    alpha_at_bound: bool  # alpha at the end of its search grid: the fit is not determined
    excluded: tuple  # budgets left out: no minimum (or, with interior_only, not interior; or below fit_from)
    non_interior: tuple  # fitted budgets whose optimum is not interior
    level: float
    n_boot: int
    boot_failed: int
    resample: str

    @property
    def fitted_range(self) -> tuple[float, float]:
        return float(self.budgets.min()), float(self.budgets.max())

    @property
    def note(self) -> str:
        notes = [f"E fixed at {self.e_fixed:g}, not fitted" if self.e_fixed is not None else "E fitted (E >= 0)"]
        if self.alpha_at_bound:
            notes.append("alpha at its search bound: undetermined")
        if self.non_interior:
            notes.append("optimum not interior at " + ", ".join(f"{b:.3g}" for b in self.non_interior))
        if self.excluded:
            notes.append("left out: " + ", ".join(f"{b:.3g}" for b in self.excluded))
        return "; ".join(notes)

    def band(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise percentile band of the replicates' values (`self.boot.loss(c)`, `.size(c)`)."""
        return tuple(np.percentile(values, [50 * (1 - self.level), 50 * (1 + self.level)], axis=0))


def _replicates(profiles: list[IsoProfile], parabolas: list[Parabola], n_boot: int, rng: np.random.Generator,
                fix_e: float | None) -> tuple[list[tuple], int]:
    """Refit everything on n_boot resampled data sets: (E, log A, alpha, log k, a) per success."""
    budgets = np.array([p.budget for p in profiles])
    optima_by_budget = [parabola_optima(p.sizes, _draw_means(p, q, rng, n_boot), p.counts)
                        for p, q in zip(profiles, parabolas)]  # each n_boot x (N*, L*)
    out = []
    for i in range(n_boot):  # a replicate fails without a minimum at every budget or a falling envelope
        optima = np.array([o[i] for o in optima_by_budget])
        if np.all(np.isfinite(optima)):
            try:
                params, _ = fit_power_params(budgets, optima[:, 1], optima[:, 0], fix_e)
                out.append((params.e, params.log_a, params.alpha, params.log_k, params.a))
            except ValueError:
                pass
    return out, n_boot - len(out)


def _family_rng(seed: int, family: str) -> np.random.Generator:
    """Each family its own stream, fixed by (seed, family name): replicates of two families are independent."""
    return np.random.default_rng([seed, zlib.crc32(family.encode())])


def fit_envelope(family: str, profiles: dict[float, IsoProfile], n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95, fix_e: float | None = None, interior_only: bool = False,
                 fit_from: float | None = None, chosen: dict[float, IsoProfile] | None = None) -> Envelope:
    """L*(C) and N*(C) of one family from its isoFLOP profiles, with bootstrap intervals
    (`interior_only`: only budgets whose optimum is interior; `fit_from`: only budgets from it up;
    `chosen`: the same runs' profiles on the choice split, which decide what is interior)."""
    used, parabolas, excluded, non_interior = [], [], [], []
    for budget, p in sorted(profiles.items()):
        if len(p.sizes) < 3 or (fit_from is not None and budget < fit_from):
            excluded.append(budget)
            continue
        q = fit_parabola(p.sizes, p.means, p.counts)
        interior = _choice(p, q, (chosen or {}).get(budget))[1] is None
        if not q.convex or (interior_only and not interior):
            excluded.append(budget)
            continue
        used.append(p)
        parabolas.append(q)
        if not interior:
            non_interior.append(budget)
    budgets = np.array([p.budget for p in used])
    optima = np.array([q.optimum for q in parabolas]).reshape(-1, 2)
    params, at_bound = fit_power_params(budgets, optima[:, 1], optima[:, 0], fix_e)
    reps, failed = _replicates(used, parabolas, n_boot, _family_rng(seed, family), fix_e)
    cols = np.array(reps, dtype=float).reshape(-1, 5)
    boot = PowerParams(*(cols[:, i] for i in range(5)))
    intervals = {"E": _percentile_interval(cols[:, 0], level), "alpha": _percentile_interval(cols[:, 2], level),
                 "a": _percentile_interval(cols[:, 4], level),
                 "A": tuple(math.exp(v) for v in _percentile_interval(cols[:, 1], level)),
                 "k": tuple(math.exp(v) for v in _percentile_interval(cols[:, 3], level))}
    return Envelope(family, budgets, optima[:, 1], optima[:, 0], params, boot, intervals, fix_e, at_bound,
                    tuple(excluded), tuple(non_interior), level, n_boot, failed,
                    ", ".join(sorted({resample_mode(p) for p in used})))


# ---------------------------------------------------------------- crossovers

def _loss_at(p: PowerParams, lc) -> np.ndarray:
    """L*(exp(lc)) elementwise: params and lc broadcast against each other."""
    return np.asarray(p.e) + np.exp(np.asarray(p.log_a) - np.asarray(p.alpha) * lc)


def _bisect(pa: PowerParams, pb: PowerParams, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The root of L_a - L_b in log C between left and right (a sign change there), elementwise."""
    f_left = _loss_at(pa, left) - _loss_at(pb, left)
    for _ in range(60):
        mid = 0.5 * (left + right)
        f_mid = _loss_at(pa, mid) - _loss_at(pb, mid)
        same = np.sign(f_mid) == np.sign(f_left)
        left, f_left = np.where(same, mid, left), np.where(same, f_mid, f_left)
        right = np.where(same, right, mid)
    return np.exp(0.5 * (left + right))


def _sign_changes(pa: PowerParams, pb: PowerParams, lo: float, hi: float, n_grid: int) -> tuple[np.ndarray, np.ndarray]:
    """The log-C grid on [lo, hi] and where L_a - L_b changes sign between neighbours (rows: replicates)."""
    grid = np.linspace(math.log(lo), math.log(hi), n_grid)
    pa, pb = (p.map(lambda v: v.reshape(-1, 1)) for p in (pa, pb))
    diff = _loss_at(pa, grid) - _loss_at(pb, grid)  # (replicates, grid)
    change = (np.sign(diff[:, :-1]) != np.sign(diff[:, 1:])) & (diff[:, :-1] != 0)
    return grid, change


def first_crossings(pa: PowerParams, pb: PowerParams, lo: float, hi: float, n_grid: int = 512) -> np.ndarray:
    """Per replicate (or for scalar params, a 1-element array): the smallest C in [lo, hi] where
    the two envelopes cross, NaN where they do not."""
    grid, change = _sign_changes(pa, pb, lo, hi, n_grid)
    has = change.any(axis=1)
    j = np.argmax(change, axis=1)
    c = _bisect(*(p.map(lambda v: np.broadcast_to(v, (len(j),))) for p in (pa, pb)), grid[j], grid[j + 1])
    return np.where(has, c, np.nan)


def all_crossings(pa: PowerParams, pb: PowerParams, lo: float, hi: float, n_grid: int = 2048) -> tuple[float, ...]:
    """Every C in [lo, hi] where two single (point-estimate) envelopes cross, ascending."""
    grid, change = _sign_changes(pa, pb, lo, hi, n_grid)
    j = np.flatnonzero(change[0])
    return tuple(float(c) for c in _bisect(pa, pb, grid[j], grid[j + 1]))


@dataclasses.dataclass(frozen=True)
class Crossover:
    """Where two families' fitted L*(C) cross: within the range both were fitted on, and
    extrapolated up to `below`."""
    family_a: str
    family_b: str
    fitted_range: tuple[float, float]  # the budgets both families were fitted on
    crossings: tuple  # of the point estimates, within the fitted range, ascending
    interval: tuple[float, float]  # of the first crossing, over replicates that cross in range
    fraction: float  # of replicates that cross within the fitted range
    lower_first: str  # the family with the lower fitted L* at the low end of the range
    below: float | None
    crossings_below: tuple  # of the point estimates, beyond the fitted range up to `below`
    interval_below: tuple[float, float]
    fraction_below: float  # of replicates that cross beyond the fitted range, before `below`
    level: float

    @property
    def c_cross(self) -> float | None:
        return self.crossings[0] if self.crossings else None

    @property
    def verdict(self) -> str:
        if not self.crossings:
            return (f"no crossover within the fitted range ({self.fitted_range[0]:.3g}–{self.fitted_range[1]:.3g} "
                    f"FLOPs; {self.fraction:.0%} of bootstrap replicates cross there)")
        lo, hi = self.interval
        return (f"{self.family_a} and {self.family_b} cross at {self.c_cross:.3g} FLOPs ({self.level:.0%} "
                f"interval {lo:.3g}–{hi:.3g}; {self.fraction:.0%} of replicates cross in range); "
                f"{self.lower_first} is lower below it")

    @property
    def verdict_below(self) -> str | None:
        if self.below is None:
            return None
        if not self.crossings_below:
            return (f"the extrapolated fits do not cross between {self.fitted_range[1]:.3g} and {self.below:.3g} "
                    f"FLOPs ({self.fraction_below:.0%} of replicates do)")
        lo, hi = self.interval_below
        return (f"the extrapolated fits cross at {self.crossings_below[0]:.3g} FLOPs, between the fitted range's "
                f"top {self.fitted_range[1]:.3g} and {self.below:.3g} "
                f"({self.level:.0%} interval {lo:.3g}–{hi:.3g}; {self.fraction_below:.0%} of replicates cross)")


def crossover(a: Envelope, b: Envelope, below: float | None = None, level: float | None = None) -> Crossover:
    """The compute where a's and b's fitted L* curves cross, with a bootstrap interval (percentiles
    of the first crossing among the replicates that cross); `below`: also search the
    extrapolated curves from the fitted range's top up to that compute (e.g. 3e18); crossings
    inside the range are the first search's, never reported as extrapolated."""
    level = a.level if level is None else level
    lo = max(a.fitted_range[0], b.fitted_range[0])
    hi = min(a.fitted_range[1], b.fitted_range[1])
    if lo >= hi:
        raise ValueError(f"{a.family} and {b.family} share no fitted range of budgets")
    # the two families' replicates side by side (independent draws; the shorter count wins)
    m = min(len(np.atleast_1d(a.boot.e)), len(np.atleast_1d(b.boot.e)))
    ra, rb = (env.boot.map(lambda v: v[:m]) for env in (a, b))

    def search(start: float, top: float) -> tuple[tuple, tuple[float, float], float]:
        crossings = all_crossings(a.params, b.params, start, top)
        firsts = first_crossings(ra, rb, start, top) if len(np.atleast_1d(ra.e)) else np.array([])
        fraction = float(np.mean(np.isfinite(firsts))) if len(firsts) else math.nan
        return crossings, _percentile_interval(firsts, level), fraction

    crossings, interval, fraction = search(lo, hi)
    below_result = search(hi, below) if below is not None and below > hi else ((), (math.nan, math.nan), math.nan)
    lower = a.family if float(a.params.loss(lo)) < float(b.params.loss(lo)) else b.family
    return Crossover(a.family, b.family, (lo, hi), crossings, interval, fraction, lower, below, *below_result, level)


# ---------------------------------------------------------------- predictions at a held-out budget

@dataclasses.dataclass(frozen=True)
class Prediction:
    """A family's predicted compute-optimal size and loss at a budget, from its envelope."""
    family: str
    budget: float
    n_star: float
    n_star_interval: tuple[float, float]
    l_star: float
    l_star_interval: tuple[float, float]
    level: float
    extrapolation: float  # budget / the largest budget fitted
    e_fixed: float | None


def predict(env: Envelope, budget: float) -> Prediction:
    """Optimal size and loss at `budget`, with percentile intervals over the envelope's replicates."""
    n_band = _percentile_interval(env.boot.size(budget), env.level)
    l_band = _percentile_interval(env.boot.loss(budget), env.level)
    return Prediction(env.family, float(budget), float(env.params.size(budget)), n_band,
                      float(env.params.loss(budget)), l_band, env.level, float(budget) / env.fitted_range[1], env.e_fixed)


# ---------------------------------------------------------------- the whole study

@dataclasses.dataclass(frozen=True)
class FamilyFit:
    """One family: its isoFLOP fits per budget and its envelope (None, with the reason, when
    too few budgets have a minimum)."""
    family: str
    isofits: dict  # budget -> IsoFit
    envelope: Envelope | None
    envelope_error: str | None


def fit_study(records: Iterable[dict], split: str | None = None, budgets: Iterable[float] | None = None,
              n_boot: int = 1000, seed: int = 0, level: float = 0.95, fix_e: float | None = None,
              interior_only: bool = False, fit_from: float | None = None) -> dict[str, FamilyFit]:
    """Fit every family of the records: isoFLOP parabolas and envelopes (only `budgets` when
    given, e.g. to hold one out for a prediction)."""
    keep = None if budgets is None else {float(b) for b in budgets}
    records = list(records)
    chosen_all = profiles_from_records(choice_records(records), split)  # what the choices read
    out = {}
    for family, profiles in sorted(profiles_from_records(records, split).items()):
        profiles = {b: p for b, p in profiles.items() if keep is None or b in keep}
        chosen = chosen_all.get(family, {})
        isofits = {b: fit_isoflop(p, n_boot, seed, level, chosen=chosen.get(b))
                   for b, p in profiles.items() if len(p.sizes) >= 3}
        try:
            env, err = fit_envelope(family, profiles, n_boot, seed, level, fix_e, interior_only, fit_from,
                                    chosen), None
        except ValueError as e:
            env, err = None, str(e)
        out[family] = FamilyFit(family, isofits, env, err)
    return out


def to_plain(obj):
    """A JSON-ready copy of a result: dataclasses as dicts, arrays as lists, NaN/inf as None."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {(str(k) if not isinstance(k, (int, float)) else repr(float(k))): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj
