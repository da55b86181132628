"""Differences paired by seed, with a Student-t interval over seeds (math only, no scipy): runs with
the same seed share data order and initial draws, so the per-seed difference removes most spread."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

_EPS = 1e-15


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side; use symmetry on the other
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom (df = inf: the normal)."""
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df > 0 degrees of freedom (df = inf: the normal), by
    bisection on the exact CDF: t_quantile(0.975, 2) = 4.303, t_quantile(0.975, 4) = 2.776."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"df must be positive, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """Mean of (A - B) over shared seeds, its t interval, and what it resolves."""
    name_a: str
    name_b: str
    seeds: tuple
    mean: float
    sd: float | None  # of the per-seed differences (None with one seed)
    lo: float  # the interval at `level`; infinite with one seed
    hi: float
    level: float
    sign: int  # -1: A below B, +1: A above B, 0: the interval contains 0

    @property
    def verdict(self) -> str:
        if self.sign < 0:
            return f"{self.name_a} below {self.name_b}"
        if self.sign > 0:
            return f"{self.name_a} above {self.name_b}"
        return "no difference resolved"


def _pairs(a: Mapping | Sequence, b: Mapping | Sequence) -> tuple[tuple, list[float]]:
    """The shared seeds and the per-seed differences a - b (sequences pair by position)."""
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise ValueError("pass both losses as {seed: loss} or both as sequences in seed order")
    if isinstance(a, Mapping):
        seeds = tuple(sorted(set(a) & set(b)))
        return seeds, [float(a[s]) - float(b[s]) for s in seeds]
    if len(a) != len(b):
        raise ValueError(f"paired sequences differ in length: {len(a)} vs {len(b)}")
    return tuple(range(len(a))), [float(x) - float(y) for x, y in zip(a, b)]


def paired_difference(a: Mapping | Sequence, b: Mapping | Sequence, level: float = 0.95,
                      name_a: str = "A", name_b: str = "B") -> PairedDifference:
    """Compare two methods' per-seed losses ({seed: loss}, only shared seeds count; or two
    sequences in the same seed order): mean difference A - B with a two-sided t interval."""
    seeds, diffs = _pairs(a, b)
    if not diffs:
        raise ValueError("no seed is shared by both methods")
    mean, lo, hi = mean_interval(diffs, level)  # infinite with one seed, so no sign
    n = len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else None
    sign = -1 if hi < 0 else (1 if lo > 0 else 0)
    return PairedDifference(name_a, name_b, seeds, mean, sd, lo, hi, level, sign)


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of values and its two-sided t interval over them (infinite with one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n == 1:
        return mean, -math.inf, math.inf
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half
