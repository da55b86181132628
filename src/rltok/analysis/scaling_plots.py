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


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


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
    return _save(fig, ax, Path(folder) / f"isoflop_{_slug(fit.family)}.png")


def _range(envelopes: list[Envelope], extend_to: float | None) -> np.ndarray:
    lo = min(e.fitted_range[0] for e in envelopes)
    hi = max([e.fitted_range[1] for e in envelopes] + ([extend_to] if extend_to else []))
    return np.geomspace(lo, hi, 200)


def plot_envelopes(envelopes: list[Envelope], folder: Path, extend_to: float | None = None,
                   crossings: list[float] = ()) -> Path:
    """L*(C) of every family: the per-budget optima, the fitted curve (dashed beyond the fitted
    range), its bootstrap band, and the given crossover computes as vertical lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    c = _range(envelopes, extend_to)
    for env in envelopes:
        inside = (c >= env.fitted_range[0]) & (c <= env.fitted_range[1])
        line, = ax.plot(c[inside], env.loss(c[inside]), label=env.family)
        ax.plot(c[~inside], env.loss(c[~inside]), ls="--", color=line.get_color())
        if len(np.atleast_1d(env.boot.e)):
            lo, hi = env.loss_band(c)
            ax.fill_between(c, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
        ax.scatter(env.budgets, env.l_star, color=line.get_color(), s=16)
    for x in crossings:
        ax.axvline(x, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set(xlabel="training FLOPs C", ylabel="compute-optimal bpb L*", title="envelopes")
    return _save(fig, ax, Path(folder) / "envelopes.png")


def plot_sizes(envelopes: list[Envelope], folder: Path, extend_to: float | None = None) -> Path:
    """N*(C) of every family: the per-budget optima, the log-log line and its bootstrap band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    c = _range(envelopes, extend_to)
    for env in envelopes:
        line, = ax.plot(c, env.size(c), label=env.family)
        if len(np.atleast_1d(env.boot.e)):
            lo, hi = env.size_band(c)
            ax.fill_between(c, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
        ax.scatter(env.budgets, env.n_star, color=line.get_color(), s=16)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel="training FLOPs C", ylabel="optimal non-embedding parameters N*", title="optimal size")
    return _save(fig, ax, Path(folder) / "optimal_sizes.png")


def plot_study(study: dict[str, FamilyFit], folder: Path, extend_to: float | None = None,
               crossings: list[float] = ()) -> list[Path]:
    """Every plot of a fitted study (see scaling_fit.fit_study): one isoFLOP PNG per family, the
    envelopes and the optimal sizes."""
    paths = [plot_isoflops(fit, folder) for fit in study.values() if fit.isofits]
    envelopes = [fit.envelope for fit in study.values() if fit.envelope is not None]
    if envelopes:
        paths += [plot_envelopes(envelopes, folder, extend_to, crossings), plot_sizes(envelopes, folder, extend_to)]
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


def plot_gap_by_steps(cells: list[tuple[float, float, str, float]], path: Path, bins: int = 4,
                      title: str = "") -> Path:
    """A difference between two families at the same shape (`cells`: optimizer steps, A − B, corpus,
    budget) against the runs' optimizer steps: one point per cell (colour: budget, marker: corpus),
    the mean of each of `bins` groups of about equal count (sorted by steps) at its mean steps, and
    zero. Whether a gap is paid in steps reads off the line."""
    if not cells:
        raise ValueError("no cells to plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    budgets = sorted({c[3] for c in cells})
    markers = dict(zip(sorted({c[2] for c in cells}), "os^vD"))
    for colour, budget in zip(plt.cm.viridis(np.linspace(0, 0.9, len(budgets))), budgets):
        for corpus, marker in markers.items():
            mine = [c for c in cells if c[3] == budget and c[2] == corpus]
            if mine:
                ax.scatter([c[0] for c in mine], [c[1] for c in mine], color=colour, marker=marker, alpha=0.7,
                           s=22, label=f"{corpus}, {budget:.3g}")
    ordered = sorted(cells, key=lambda c: c[0])
    groups = [ordered[round(i * len(ordered) / bins):round((i + 1) * len(ordered) / bins)] for i in range(bins)]
    groups = [g for g in groups if g]
    ax.plot([np.mean([c[0] for c in g]) for g in groups], [np.mean([c[1] for c in g]) for g in groups],
            color="black", marker="s", lw=1.5, label=f"mean of {len(groups)} groups by steps")
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    lo, hi = min(c[0] for c in cells), max(c[0] for c in cells)
    ticks = [t for d in (1, 10, 100, 1000, 10000, 100000) for t in (d, 2 * d, 5 * d) if lo / 1.5 <= t <= hi * 1.5]
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.set(xlabel="optimizer steps of the run", ylabel="A − B (bpb), same shape, paired by seed", title=title)
    return _save(fig, ax, Path(path))


def _interval_bars(values: list, intervals: list) -> tuple[np.ndarray, np.ndarray]:
    """(values, [below, above] error-bar lengths) with NaN for a missing value and 0 for a missing
    interval end."""
    v = np.array([np.nan if x is None else float(x) for x in values])
    lo = np.array([np.nan if not i or i[0] is None else float(i[0]) for i in intervals])
    hi = np.array([np.nan if not i or i[1] is None else float(i[1]) for i in intervals])
    return v, np.nan_to_num(np.vstack([v - lo, hi - v]), nan=0.0).clip(min=0.0)


def plot_prediction_scores(scores: list[dict], path: Path, title: str = "") -> Path | None:
    """A prediction against what came of it, one panel per corpus and one column per family (or
    group, with the member that stood for it): the predicted L* with its interval beside the
    outcome with its own, the held-out runs' mean (a held-out score's `measured`) or the budget's
    isoFLOP fit (a forecast's `l_star`). None when no row has a prediction."""
    rows = [s for s in scores if (s.get("prediction") or {}).get("l_star") is not None]
    if not rows:
        return None
    held_out = any("measured" in s for s in rows)
    outcome, outcome_interval = ("measured", "measured_interval") if held_out else ("l_star", "l_star_interval")
    corpora = list(dict.fromkeys(s["corpus"] for s in rows))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(corpora), figsize=(5.6 * len(corpora), 4.4), squeeze=False)
    for ax, corpus in zip(axes[0], corpora):
        mine = [s for s in rows if s["corpus"] == corpus]
        x = np.arange(len(mine))
        pred, pred_bars = _interval_bars([s["prediction"]["l_star"] for s in mine],
                                         [s["prediction"].get("l_star_interval") for s in mine])
        got, got_bars = _interval_bars([s.get(outcome) for s in mine], [s.get(outcome_interval) for s in mine])
        ax.errorbar(x - 0.12, pred, yerr=pred_bars, fmt="o", color="tab:blue", capsize=3,
                    label="predicted L* (95% interval)")
        ax.errorbar(x + 0.12, got, yerr=got_bars, fmt="s", color="tab:red", capsize=3,
                    label="held-out runs, mean of seeds" if held_out else "the budget's isoFLOP fit")
        names = [s["family"] + (f" ({s['member']})" if s.get("member") else "") for s in mine]
        ax.set_xticks(x, names, rotation=40, ha="right", fontsize=7)
        ax.set(ylabel="bpb", title=f"{corpus}{': ' + title if title else ''}")
        ax.legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
