"""The grid's rules for the compute-optimal study (docs/SCALING.md, "Sizes per budget", "Learning rate
and warm-up"): the sizes a family runs at a budget, the step that extends a ladder, and the learning
rate, warm-up and schedule of every run."""

from __future__ import annotations

import dataclasses
import math

from rltok.config import ConfigError
from rltok.config.sections import LR_SCHEDULES


def unknown_keys(keys, allowed: set, where: str) -> None:
    extra = sorted(set(keys) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _numbers(d: dict, rule: type, where: str) -> dict:
    """The table's values as floats; every field of `rule` required and finite."""
    keys = {f.name for f in dataclasses.fields(rule)}
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: a table with {', '.join(sorted(keys))}")
    unknown_keys(d, keys, where)
    missing = sorted(keys - set(d))
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    out = {k: float(d[k]) for k in keys}
    if not all(math.isfinite(v) for v in out.values()):
        raise ConfigError(f"{where}: values must be finite numbers")
    return out


@dataclasses.dataclass(frozen=True)
class SizeRule:
    """A window of `points` sizes, `span` times either side of coef * C^exponent (geometric)."""
    coef: float
    exponent: float
    span: float
    points: int

    @classmethod
    def parse(cls, d: dict) -> SizeRule:
        v = _numbers(d, cls, "size_rule")
        if v["coef"] <= 0 or v["span"] < 1 or v["points"] < 1 or not v["points"].is_integer():
            raise ConfigError("size_rule: coef > 0, span >= 1 and points a whole number >= 1")
        if v["points"] > 1 and v["span"] == 1:
            raise ConfigError("size_rule: span must be > 1 for more than one point")
        return cls(v["coef"], v["exponent"], v["span"], int(v["points"]))

    def centre(self, budget: float, coef: float | None = None) -> float:
        return (self.coef if coef is None else coef) * budget ** self.exponent

    def window(self, budget: float, coef: float | None = None, centre: float | None = None) -> list[int]:
        from rltok.model.sizing import geometric_sizes

        mid = self.centre(budget, coef) if centre is None else centre
        return geometric_sizes(mid / self.span, mid * self.span, self.points)

    @property
    def step(self) -> float:
        """The ratio of neighbouring sizes in a window (span itself for a one-point window)."""
        return self.span ** (2 / (self.points - 1)) if self.points > 1 else self.span


@dataclasses.dataclass(frozen=True)
class LRRule:
    """train.lr = lr_ref (N / n_ref)^-exponent."""
    lr_ref: float
    n_ref: float
    exponent: float

    @classmethod
    def parse(cls, d: dict) -> LRRule:
        v = _numbers(d, cls, "lr_rule")
        if v["lr_ref"] <= 0 or v["n_ref"] <= 0:
            raise ConfigError("lr_rule: lr_ref and n_ref must be > 0")
        return cls(v["lr_ref"], v["n_ref"], v["exponent"])

    def lr(self, n: float) -> float:
        return self.lr_ref * (n / self.n_ref) ** (-self.exponent)


def rules(d: dict) -> dict:
    """The Grid fields of a grid table's rules and optional settings (those present)."""
    out = {}
    if "size_rule" in d:
        out["size_rule"] = SizeRule.parse(d["size_rule"])
    if "lr_rule" in d:
        out["lr_rule"] = LRRule.parse(d["lr_rule"])
    if "warmup_frac" in d:
        frac = float(d["warmup_frac"])
        if not 0 <= frac < 1:
            raise ConfigError(f"grid: warmup_frac must be in [0, 1), got {frac}")
        out["warmup_frac"] = frac
    if "lr_schedule" in d:
        if d["lr_schedule"] not in LR_SCHEDULES:
            raise ConfigError(f"grid: lr_schedule must be {' or '.join(LR_SCHEDULES)}, got {d['lr_schedule']!r}")
        out["lr_schedule"] = d["lr_schedule"]
    if "cooldown_frac" in d:
        frac = float(d["cooldown_frac"])
        if out.get("lr_schedule") != "wsd" or not 0 < frac <= 1:
            raise ConfigError(f"grid: cooldown_frac (in (0, 1]) is the cool-down of lr_schedule = \"wsd\", got {frac}")
        out["cooldown_frac"] = frac
    if "extend" in d:
        out["extend"] = int(d["extend"])
        if out["extend"] < 0:
            raise ConfigError("grid: extend must be >= 0")
    for key in ("interior_only", "committed_only"):
        if key in d:
            if not isinstance(d[key], bool):
                raise ConfigError(f"grid: {key} is true or false, got {d[key]!r}")
            out[key] = d[key]
    if "fit_from" in d:
        out["fit_from"] = float(d["fit_from"])
        if not out["fit_from"] > 0:
            raise ConfigError(f"grid: fit_from is a budget in FLOPs (> 0), got {d['fit_from']!r}")
    if "eval_context" in d:
        if not isinstance(d["eval_context"], int) or d["eval_context"] < 1:
            raise ConfigError("grid: eval_context must be an integer >= 1 (bytes of context before the scored ones), "
                              f"got {d['eval_context']!r}")
        out["eval_context"] = d["eval_context"]
    for key in ("optimum_seeds", "holdout_seeds"):
        if key in d:
            out[key] = tuple(int(s) for s in d[key])
    return out


def family_sizes(grid, fam, budget: float) -> list[float]:
    """The target sizes of a family at a budget: its own ladder, or the grid's window there."""
    if fam.sizes:
        return list(fam.sizes)
    return [float(n) for n in grid.size_rule.window(budget, fam.size_coef, fam.centre_at(budget))]


def step_ratio(grid, fam) -> float:
    """The ratio by which a family's ladder is extended: its window's step, or the mean step of
    its own sizes (2 for a single size)."""
    if not fam.sizes:
        return grid.size_rule.step
    lo, hi, n = min(fam.sizes), max(fam.sizes), len(set(fam.sizes))
    return (hi / lo) ** (1 / (n - 1)) if n > 1 and hi > lo else 2.0


def point_lr(grid, fam, n: float) -> float | None:
    """The learning rate of a run of `fam` at N non-embedding parameters; None: the config's own
    (no lr_rule and lr_mult 1, so nothing is added to the overrides)."""
    if grid.lr_rule is not None:
        return grid.lr_rule.lr(n) * fam.lr_mult
    if fam.lr_mult == 1:
        return None
    return base_lr(grid, fam) * fam.lr_mult


def base_lr(grid, fam) -> float:
    """The learning rate a family's runs have without a rule: the preset's after the grid's, the
    family's and its method's overrides (which may set its rule's own settings)."""
    from rltok.analysis.compare import method_overrides
    from rltok.config import load_config

    return load_config(grid.preset, overrides=[*run_base(grid, fam), *method_overrides(fam.method)]).train.lr


def run_base(grid, fam) -> list[str]:
    """The base overrides a family's runs train with: the grid's warm-up share and schedule, then
    the grid's overrides, then the family's (later ones win)."""
    warmup = [] if grid.warmup_frac is None else [f"train.warmup_frac={grid.warmup_frac!r}"]
    schedule = [] if grid.lr_schedule is None else [f"train.lr_schedule={grid.lr_schedule}"]
    schedule += [] if grid.cooldown_frac is None else [f"train.cooldown_frac={grid.cooldown_frac!r}"]
    return [*warmup, *schedule, *grid.overrides, *fam.overrides]
