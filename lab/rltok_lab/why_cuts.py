"""Why a study's boundary rules cut where they do, read on the checkpoints its tables choose.

For each hierarchy family of a scaling grid at one budget, at the size chosen on the selection split
(`audit.chosen_cells`, the same cell its tables report), every seed's checkpoint is read on one fixed
batch of held-out windows with the true-advantage instrument (`true_advantage.py`):

- where the rule cuts: its cut rate per byte class, over every candidate position of the batch;
- what a cut is worth there: D_t = L(b_t = 0) - L(b_t = 1), nats over the rest of the window, per class;
- placement: the mean D of the rule's cuts minus that of as many cuts placed at random over the
  candidates (> 0: the rule puts its cuts where a cut helps), and the most any placement at the class
  level could give with the same number of cuts (every cut in the classes whose D is highest).

A rule that cuts where D is high but gains little, because D hardly differs between classes, is read
apart from one that leaves value on the table. D is measured under each family's own model, which
has adapted to its own cuts: a reading of that model, not of the cuts alone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rltok.analysis.scaling_fit import record_family, record_size
from rltok.config import ConfigError
from rltok_lab.audit import chosen_cells, grid_study, mean_of
from rltok_lab.true_advantage import CLASSES, d_stats


@dataclasses.dataclass
class Reading:
    """One family at its chosen size: its seeds' checkpoints read on the same windows."""
    corpus: str
    family: str
    size: float
    seeds: list[int]
    rate: float | None  # the records' achieved rate on the scored split
    space_align: float | None
    classes: dict  # {class: {"candidates", "cut_rate", "cut_share", "mean_D", "se_D", "n"}}, seeds pooled
    mean_abs_d: float
    placement: float  # nats per cut over random placement, the mean over seeds
    best_placement: float  # the most a class-level placement gives with as many cuts (biased up: a max of noisy means)


def _point_runs(folder: Path, corpus: str, budget: float, family: str, size: float) -> list[tuple[dict, Path]]:
    """(record, newest-checkpoint run folder) of every seed of one cell."""
    from rltok.analysis.scaling import read_record

    out = []
    for path in sorted((folder / corpus).glob(f"C*__{family}__N*__s*.json")):
        r = read_record(path)
        if r is None or r.get("bpb") is None or r.get("point_kind") == "check":
            continue
        if float(r["budget_flops"]) != budget or record_family(r) != family or record_size(r) != size:
            continue
        runs = sorted(p for p in (folder / corpus / "runs" / path.stem).glob("*") if (p / "checkpoints").is_dir())
        if not runs:
            raise ConfigError(f"{path}: its run folder {folder / corpus / 'runs' / path.stem} has no checkpoints "
                              "(the instrument reads the trained model, which only the run folder keeps)")
        out.append((r, runs[-1]))
    return out


def placement_values(classes: dict) -> tuple[float, float]:
    """(the rule's placement value, the best class-level one) in nats per cut, from one reading's
    per-class candidates, cuts and mean D. Classes without a measured D count as D = 0."""
    d = {c: (s["mean_D"] or 0.0) for c, s in classes.items()}
    cand = {c: s["candidates"] for c, s in classes.items()}
    cuts = {c: s["cuts"] for c, s in classes.items()}
    n_cand, n_cuts = sum(cand.values()), sum(cuts.values())
    if not n_cand or not n_cuts:
        return 0.0, 0.0
    at_random = sum(cand[c] * d[c] for c in d) / n_cand
    taken = sum(cuts[c] * d[c] for c in d) / n_cuts
    left, best = n_cuts, 0.0
    for c in sorted(d, key=d.get, reverse=True):
        k = min(left, cand[c])
        best += k * d[c]
        left -= k
    return taken - at_random, best / n_cuts - at_random


def read_family(runs: list[tuple[dict, Path]], data: str | None, per_class: int, batch: int, seq_len: int,
                seed: int, device: str = "cpu") -> tuple[dict, float, float, float]:
    """Every seed's checkpoint on one fixed batch of `data`'s val windows (None: the data each run
    trained on) -> (classes pooled over seeds, mean |D|, placement, best placement)."""

    from rltok.data.corpus import run_split_bytes
    from rltok.data.windows import eval_windows
    from rltok.training.loading import load_checkpoint
    from rltok_lab.true_advantage import true_advantage

    d_by_class = {c: [] for c in CLASSES}
    totals = {c: {"candidates": 0, "cuts": 0} for c in CLASSES}
    placements, bests = [], []
    for record, run in runs:
        model, cfg, _, _ = load_checkpoint(run, device=device)
        if not getattr(model, "hierarchical", False) or model.cfg.stages != 1:
            raise ConfigError(f"{run}: the instrument reads one-stage hierarchies only")
        text = run_split_bytes(cfg.data, "val", source=data)
        x, y = eval_windows(text, seq_len or cfg.train.seq_len, batch)
        result = true_advantage(model.eval(), x.to(device), y.to(device), cfg.objective, n_per_class=per_class,
                                seed=seed)
        for rec in result["positions"]:
            d_by_class[rec["class"]].append(rec["D"])
        for c, st in result["classes"].items():
            totals[c]["candidates"] += st["candidates"]
            totals[c]["cuts"] += st["cuts"]
        placement, best = placement_values(result["classes"])
        placements.append(placement)
        bests.append(best)
        del model
    n_cand = sum(t["candidates"] for t in totals.values())
    n_cuts = sum(t["cuts"] for t in totals.values())
    classes = {}
    for c in CLASSES:
        st, t = d_stats(d_by_class[c]), totals[c]
        classes[c] = {"candidates": t["candidates"], "candidate_share": t["candidates"] / n_cand if n_cand else None,
                      "cuts": t["cuts"], "cut_rate": t["cuts"] / t["candidates"] if t["candidates"] else None,
                      "cut_share": t["cuts"] / n_cuts if n_cuts else None, "mean_D": st["mean_D"], "se_D": st["se_D"],
                      "n": st["n"]}
    mean_abs = d_stats([d for ds in d_by_class.values() for d in ds])["mean_abs_D"] or 0.0
    return classes, mean_abs, sum(placements) / len(placements), sum(bests) / len(bests)


def why_cuts(grid, folder: Path, budget: float, corpora: list[str] | None = None, families: list[str] | None = None,
             data_root: Path | None = None, per_class: int = 64, batch: int = 8, seq_len: int = 0, seed: int = 0,
             per_seed: bool = False, log=print) -> list[Reading]:
    """Each hierarchy family's chosen checkpoints at `budget`, read with the true advantage, its
    seeds pooled (or, with `per_seed`, a reading per seed). `data_root`: a folder holding each
    corpus by its name (default: the data each run trained on)."""
    study = grid_study(grid, Path(folder))
    readings = []
    for corpus in corpora or list(grid.corpora):
        if corpus not in study.runs:
            raise ConfigError(f"corpus {corpus!r} is not in the grid (it has {', '.join(study.runs)})")
        cells = chosen_cells(study.runs[corpus], budget)
        if not cells:
            raise ConfigError(f"no finished runs of {corpus} at budget {budget:g} in {folder}")
        for family, cell in cells.items():
            if families and family not in families:
                continue
            if cell.rate is None:  # flat bytes, BPE tokens: no boundaries to read
                continue
            runs = _point_runs(Path(folder), corpus, budget, family, cell.size)
            log(f"{corpus} {family} N {cell.size:,.0f}: {len(runs)} seeds")
            data = str(Path(data_root) / corpus) if data_root else None
            groups = [(f"{family} s{r['seed']}", [(r, run)]) for r, run in runs] if per_seed else [(family, runs)]
            for label, group in groups:
                classes, mean_abs, placement, best = read_family(group, data, per_class, batch, seq_len, seed)
                rate = mean_of([r for r, _ in group], "rate") if per_seed else cell.rate
                align = mean_of([r for r, _ in group], "space_align") if per_seed else cell.space_align
                readings.append(Reading(corpus, label, cell.size, sorted(int(r["seed"]) for r, _ in group), rate,
                                        align, classes, mean_abs, placement, best))
    return readings


def _f(v, spec: str = ".3f") -> str:
    return "–" if v is None else format(v, spec)


def _d(st: dict) -> str:
    if st["mean_D"] is None:
        return "–"
    return f"{st['mean_D']:+.4f}" + (f" ± {st['se_D']:.4f}" if st["se_D"] is not None else "")


# the classes the tables show, in the order a reader scans a word: its end, the space, its start, inside
SHOWN = ("before_whitespace", "whitespace", "indentation", "after_whitespace", "punctuation", "mid_word", "other")


def report(readings: list[Reading], budget: float) -> str:
    """Markdown: a summary row per family, then cut rates and D per byte class."""
    parts = []
    for corpus in dict.fromkeys(r.corpus for r in readings):
        rs = [r for r in readings if r.corpus == corpus]
        head = [f"### {corpus} at {budget:.0e}: each hierarchy at its val-chosen size, seeds' checkpoints "
                "on one batch of val windows", "",
                "| family | N | seeds | rate | whitespace alignment | mean abs D (nats) | placement (nats/cut) "
                "| best class-level placement |", "|---|---|---|---|---|---|---|---|"]
        head += [f"| {r.family} | {r.size:,.0f} | {len(r.seeds)} | {_f(r.rate)} | {_f(r.space_align, '.2f')} "
                 f"| {r.mean_abs_d:.4f} | {r.placement:+.4f} | {r.best_placement:+.4f} |" for r in rs]
        cut = ["", "Cut rate per byte class (share of the class's candidates where the rule cuts):", "",
               "| family | " + " | ".join(SHOWN) + " |", "|---|" + "---|" * len(SHOWN)]
        cut += [f"| {r.family} | " + " | ".join(_f(r.classes[c]["cut_rate"], ".2f") for c in SHOWN) + " |"
                for r in rs]
        share = rs[0].classes
        cut.append("| (share of candidates) | " + " | ".join(_f(share[c]["candidate_share"], ".2f") for c in SHOWN)
                   + " |")
        dt = ["", "Mean D per byte class, nats (± s.e.; > 0: a cut there lowers the loss):", "",
              "| family | " + " | ".join(SHOWN) + " |", "|---|" + "---|" * len(SHOWN)]
        dt += [f"| {r.family} | " + " | ".join(_d(r.classes[c]) for c in SHOWN) + " |" for r in rs]
        parts.append("\n".join(head + cut + dt))
    return "\n\n".join(parts) + "\n"


def to_plain(readings: list[Reading]) -> list[dict]:
    return [dataclasses.asdict(r) for r in readings]
