"""Plots of the compute-optimal study's fits (PNG): isoFLOP curves per family, the envelopes
L*(C) with their bootstrap bands, and N*(C). matplotlib is optional: asking for a plot without
it raises a RuntimeError that says so."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rltok.analysis.scaling_fit import Envelope, FamilyFit


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("the scaling plots need matplotlib: pip install matplotlib") from e
    return plt


def _save(fig, ax, path: Path) -> Path:
    """The legend, then the figure written to `path` and closed."""
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def plot_isoflops(fit: FamilyFit, folder: Path) -> Path:
    """Loss against size at every budget of one family: the seed means, the fitted parabola and
    its optimum (a star, hollow where it is not interior)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    colours = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(fit.isofits))))
    for colour, (budget, f) in zip(colours, sorted(fit.isofits.items())):
        ax.scatter(f.sizes, f.means, color=colour, s=18, label=f"{budget:.2g} FLOPs")
        grid = np.geomspace(f.sizes.min() / 1.3, f.sizes.max() * 1.3, 100)
        ax.plot(grid, f.parabola(grid), color=colour, lw=1)
        if np.isfinite(f.n_star):
            ax.scatter([f.n_star], [f.l_star], marker="*", s=90, color=colour if f.interior else "none",
                       edgecolors=colour)
    ax.set_xscale("log")
    ax.set(xlabel="non-embedding parameters N", ylabel="bpb", title=f"isoFLOP profiles: {fit.family}")
    return _save(fig, ax, Path(folder) / f"isoflop_{re.sub(r'[^A-Za-z0-9._-]+', '_', fit.family)}.png")


def plot_envelopes(envelopes: list[Envelope], folder: Path, extend_to: float | None = None,
                   crossings: list[float] = (), size: bool = False) -> Path:
    """L*(C) of every family: the per-budget optima, the fitted curve (dashed beyond the fitted
    range), its bootstrap band, and the given crossover computes as vertical lines; `size`: N*(C)
    in log-log, its optima, line and band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    top = max([e.fitted_range[1] for e in envelopes] + ([extend_to] if extend_to else []))
    c = np.geomspace(min(e.fitted_range[0] for e in envelopes), top, 200)
    for env in envelopes:
        law, boot, optima = ((env.params.size, env.boot.size, env.n_star) if size
                             else (env.params.loss, env.boot.loss, env.l_star))
        inside = np.full(c.shape, True) if size else (c >= env.fitted_range[0]) & (c <= env.fitted_range[1])
        line, = ax.plot(c[inside], law(c[inside]), label=env.family)
        if not size:
            ax.plot(c[~inside], law(c[~inside]), ls="--", color=line.get_color())
        if len(np.atleast_1d(env.boot.e)):
            lo, hi = env.band(boot(c))
            ax.fill_between(c, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
        ax.scatter(env.budgets, optima, color=line.get_color(), s=16)
    for x in crossings:
        ax.axvline(x, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    if size:
        ax.set_yscale("log")
        ax.set(xlabel="training FLOPs C", ylabel="optimal non-embedding parameters N*", title="optimal size")
        return _save(fig, ax, Path(folder) / "optimal_sizes.png")
    ax.set(xlabel="training FLOPs C", ylabel="compute-optimal bpb L*", title="envelopes")
    return _save(fig, ax, Path(folder) / "envelopes.png")


def plot_study(study: dict[str, FamilyFit], folder: Path, extend_to: float | None = None,
               crossings: list[float] = ()) -> list[Path]:
    """Every plot of a fitted study (see scaling_fit.fit_study): one isoFLOP PNG per family, the
    envelopes and the optimal sizes."""
    paths = [plot_isoflops(fit, folder) for fit in study.values() if fit.isofits]
    envelopes = [fit.envelope for fit in study.values() if fit.envelope is not None]
    if envelopes:
        paths += [plot_envelopes(envelopes, folder, extend_to, crossings),
                  plot_envelopes(envelopes, folder, extend_to, size=True)]
    return paths


def inference_runs(records: list[dict]) -> tuple[float | None, list[dict]]:
    """The largest budget at which every family of the runs that report `forward_flops_per_byte`
    has runs (a budget still under way would show only its first families), and those runs at
    it; the largest budget outright when no budget has them all."""
    from rltok.analysis.scaling_fit import record_family

    runs = [r for r in records if r.get("forward_flops_per_byte")]
    if not runs:
        return None, []
    families: dict[float, set] = {}
    for r in runs:
        families.setdefault(float(r["budget_flops"]), set()).add(record_family(r))
    every = set().union(*families.values())
    complete = [b for b, present in families.items() if present == every]
    top = max(complete or families)
    return top, [r for r in runs if float(r["budget_flops"]) == top]


def plot_inference(records: list[dict], path: Path, title: str = "") -> Path | None:
    """bpb against inference (forward) FLOPs per byte of every run at the largest budget
    (`inference_runs`): one colour per family, marker area growing with log N. None when no run
    reports the field."""
    from rltok.analysis.scaling_fit import record_family, record_size

    top, runs = inference_runs(records)
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    log_n = np.log10([record_size(r) for r in runs])
    span = max(float(log_n.max() - log_n.min()), 1e-9)
    area = dict(zip(map(id, runs), 15 + 120 * (log_n - log_n.min()) / span))
    families = sorted({record_family(r) for r in runs})
    for colour, family in zip(plt.cm.tab10(np.arange(len(families)) % 10), families):
        mine = [r for r in runs if record_family(r) == family]
        ax.scatter([r["forward_flops_per_byte"] for r in mine], [r["bpb"] for r in mine],
                   s=[area[id(r)] for r in mine], color=colour, alpha=0.75, label=family)
    ax.set_xscale("log")
    ax.set(xlabel="inference FLOPs per byte (forward pass)", ylabel="bpb",
           title=f"{title + ': ' if title else ''}{top:.3g} training FLOPs (marker area: log N)")
    return _save(fig, ax, Path(path))
