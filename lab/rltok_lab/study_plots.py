"""The study's own plots: the learned rule's gap against the run's optimizer steps, and a
prediction's scores against its intervals (the fits' plots are rltok.analysis.scaling_plots)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rltok.analysis.scaling_plots import _pyplot, _save


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
