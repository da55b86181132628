"""A prediction held out from the fit, and its test.

`write_prediction` (`rltok scaling --predict`): each corpus's records of the grid's budgets
(never the holdout budgets) are fitted (`scaling_fit.fit_study`) and each family's envelope
predicts N* and L* with intervals at every holdout budget (`scaling_fit.predict`), written once to
OUT/prediction.json with the fitted budgets, the commit and the date. It is committed before any
run at those budgets and never rewritten: an existing file is an error.

`run_holdout` (`rltok scaling --holdout`): at each holdout budget each family runs at its predicted
N* (the shape its shape rule builds for that size), with the grid's `holdout_seeds`, into the
same corpus folder (resumable like every point); then `score_holdout` scores the prediction
(`score_prediction`) into OUT/prediction_score.json, and `score_table` prints it.
The same runs give the grid's pairs their paired verdicts at the held-out budget
(`holdout_paired`: each side at its predicted size, a group as its best member there), written
beside the scores.

A forecast (`--predict --at B`, then `--holdout --at B`) does the same for a budget B of the
study's own ladders: fitted on the budgets below B and written to OUT/prediction_C<B>.json before
any run at B, then scored against B's isoFLOP fit once its ladders have run (`score_forecast`: the
predicted N* and L* against the parabola's, each with its interval). It trains nothing of its own,
and tests the extrapolation a whole stage before the held-out budget can.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
from collections.abc import Iterable
from pathlib import Path

from rltok.analysis.scaling import (Grid, Point, _write_json, budget_tag, corpus_split, family_rungs, grid_points,
                                    point_done, read_records, run_points)
from rltok.analysis.paired_stats import mean_interval
from rltok.analysis.scaling_fit import Prediction
from rltok.analysis.table_cells import number
from rltok.config import ConfigError

PREDICTION = "prediction.json"
SCORE = "prediction_score.json"


@dataclasses.dataclass(frozen=True)
class PredictionScore:
    """A measured result at the predicted budget against the prediction."""
    prediction: Prediction
    measured: float  # mean over seeds
    measured_interval: tuple[float, float]  # t interval over seeds
    error: float  # measured - predicted loss
    within: bool | None  # the measured mean lies inside the predicted loss interval (None: no interval)
    size: float | None  # the size that was run, when given
    size_ratio: float | None  # size / predicted N*
    size_within: bool | None


def estimate(x: float | None, lo_hi, fmt: str = ".3g") -> str:
    """`x (lo–hi)`: a number with its interval, each formatted as `number` does."""
    lo, hi = lo_hi
    return f"{number(x, fmt)} ({number(lo, fmt)}–{number(hi, fmt)})"


def in_interval(x: float, interval) -> bool | None:
    """x within [lo, hi]; None where the interval is unknown (a NaN end, as a null reads back)."""
    lo, hi = interval
    return None if not (math.isfinite(lo) and math.isfinite(hi)) else bool(lo <= x <= hi)


def score_prediction(pred: Prediction, losses: Iterable[float], size: float | None = None) -> PredictionScore:
    """How far a run at the predicted budget (its seeds' losses, and the size it used) lands."""
    losses = [float(v) for v in losses]
    mean, lo, hi = mean_interval(losses, pred.level)
    size_ratio = None if size is None else float(size) / pred.n_star
    size_within = None if size is None else in_interval(float(size), pred.n_star_interval)
    return PredictionScore(pred, mean, (lo, hi), mean - pred.l_star, in_interval(mean, pred.l_star_interval), size,
                           size_ratio, size_within)


def _key(budget: float) -> str:
    return repr(float(budget))  # as to_plain writes a float key


def prediction_name(at=None) -> str:
    """OUT/prediction.json for the grid's holdout budgets; prediction_C<B>.json for a forecast of
    the study's own budgets `at`."""
    return PREDICTION if not at else "prediction_" + "_".join(budget_tag(b) for b in sorted(at)) + ".json"


def score_name(at=None) -> str:
    return SCORE if not at else prediction_name(at).replace(".json", "_score.json")


def forecast_grid(grid: Grid, at) -> Grid:
    """The grid a forecast of its budgets `at` fits and predicts with: its budgets below the
    smallest of them fitted, `at` held out (matched to the grid's budgets as file names name them)."""
    own = {budget_tag(b): b for b in grid.budgets}
    stray = sorted({budget_tag(b) for b in at} - set(own))
    if stray:
        raise ConfigError(f"--at {', '.join(stray)}: a forecast is of the grid's own budgets "
                          f"({', '.join(own)}: add it to `budgets` first, and predict before any run there); "
                          "the held-out budgets need no --at")
    at = sorted({own[budget_tag(b)] for b in at})
    below = tuple(b for b in grid.budgets if b < at[0])
    if not below:
        raise ConfigError(f"--at {budget_tag(at[0])}: no budget of the grid below it to fit")
    return dataclasses.replace(grid, budgets=below, holdout_budgets=tuple(at))


class _Pending(Exception):
    """Raised by `pending_point`'s stand-in runner at the first point the study would still run."""


def pending_point(grid: Grid, out: Path) -> Point | None:
    """The first point `rltok scaling` would still run for the grid's budgets (a ladder point, an
    extension, a seed at an optimum or for a verdict), or None when they are complete: a dry run
    of the study whose runner stops at the first point it is handed. Read-only: the study makes a
    corpus's folder before handing its runner the first point, so a ladder point not done is
    found here first, as the study would find it, and the dry run is left the adaptive steps,
    whose ladders (and so their folders) exist."""
    from rltok.analysis.scaling_adapt import run_grid

    def stop(grid_, point, folder, split):
        raise _Pending(point)

    for corpus in grid.corpora:  # a corpus whose data cannot be read fails as the study would
        corpus_split(grid, corpus, log=lambda message: None)
    first = next((p for p in grid_points(grid, log=lambda message: None) if not point_done(out, p)), None)
    if first is not None:
        return first
    try:
        run_grid(grid, out, log=lambda message: None, runner=stop)
    except _Pending as pending:
        return pending.args[0]
    return None


def with_groups(records: list[dict], groups: dict) -> list[dict]:
    """The finished runs and, per group and budget, copies of its chosen member's runs labelled with
    the group's name: the report's rule (`scaling_report.choose_members`, on the selection split),
    so a group is predicted, and scored at a held-out budget, as its best member there."""
    from rltok.analysis.scaling_fit import choice_records, profiles_from_records
    from rltok.analysis.scaling_report import choose_members, group_records

    done = [r for r in records if r.get("bpb") is not None]
    if not groups or not done:
        return done
    chosen = profiles_from_records(choice_records(done))
    return done + group_records(done, choose_members(chosen, groups))


def _names(grid: Grid) -> list[str]:
    """The families, then the groups: every name a prediction covers."""
    return [f.name for f in grid.families] + list(grid.groups)


def predict_corpus(grid: Grid, folder: Path) -> dict:
    """{family or group: {holdout budget: the prediction, or {"error": why}}} from the corpus's
    records (a group's envelope fits its best member at each budget, as the report's does)."""
    from rltok.analysis.scaling_fit import choice_records, fit_study, predict, to_plain

    records = with_groups(read_records(folder), grid.groups)
    study = fit_study(records, budgets=grid.budgets, n_boot=grid.n_boot, interior_only=grid.interior_only,
                      fit_from=grid.fit_from)
    # where the grid has a selection split, the size to run is a choice like every other: N*(C) from
    # the envelope of the selection split's parabolas; the loss predicted stays the scored split's
    has_select = grid.select_split and any(r.get("bpb_select") is not None for r in records)
    chooser = fit_study(choice_records(records), budgets=grid.budgets, n_boot=grid.n_boot,
                        interior_only=grid.interior_only, fit_from=grid.fit_from) if has_select else {}
    out = {}
    for name in _names(grid):
        fit = study.get(name)
        if fit is None or fit.envelope is None:
            why = "no runs" if fit is None else fit.envelope_error
            out[name] = {_key(b): {"error": why} for b in grid.holdout_budgets}
            continue
        env = fit.envelope
        extra = {"fitted_budgets": [float(b) for b in env.budgets], "note": env.note}
        out[name] = {_key(b): {**to_plain(predict(env, b)), **extra} for b in grid.holdout_budgets}
        chosen = getattr(chooser.get(name), "envelope", None)
        for b in grid.holdout_budgets if has_select else ():
            if chosen is None:  # said in the prediction: its size then comes from the scored split
                why = chooser[name].envelope_error if name in chooser else "no runs"
                out[name][_key(b)].update(size_split=grid.split, size_note=f"no {grid.select_split} envelope: {why}")
                continue
            size = to_plain(predict(chosen, b))
            out[name][_key(b)].update(n_star=size["n_star"], n_star_interval=size["n_star_interval"],
                                      size_split=grid.select_split, n_star_scored_split=out[name][_key(b)]["n_star"])
    return out


def write_prediction(grid: Grid, out: Path, log=print, name: str = PREDICTION) -> Path:
    """Fit without the holdout budgets and write OUT/`name`; refuses to overwrite it, and refuses
    once any run at a holdout budget exists (a prediction comes before the runs that test it)."""
    from rltok.analysis.compare import git_commit

    path = out / name
    if not grid.holdout_budgets:
        raise ConfigError("grid: --predict needs `holdout_budgets`")
    if path.exists():
        raise ConfigError(f"{path} exists: a prediction is written once, before the runs that test it, and "
                          "never rewritten (move it away to predict again)")
    corpora = {}
    held_tags = {budget_tag(b) for b in grid.holdout_budgets}
    for corpus in grid.corpora:
        if not (out / corpus).is_dir():
            raise ConfigError(f"{corpus}: no runs in {out / corpus} to fit")
        # a finished run leaves its record, one under way its run folder
        found = [*(out / corpus).glob("C*__*"), *(out / corpus / "runs").glob("C*__*")]
        started = {p.name.split("__")[0] for p in found} & held_tags
        if started:
            raise ConfigError(f"{corpus}: runs at {', '.join(sorted(started))} exist already: a prediction is "
                              "written before any run at the budget it predicts")
    pending = pending_point(grid, out)
    if pending is not None:
        raise ConfigError(f"the fitted budgets are not complete: `rltok scaling` would still run {pending.corpus} "
                          f"{pending.stem} ({pending.kind}); a prediction is fitted on finished budgets only")
    fitted = set()
    for corpus in grid.corpora:
        corpora[corpus] = predict_corpus(grid, out / corpus)
        fitted |= {b for fam in corpora[corpus].values() for p in fam.values() for b in p.get("fitted_budgets", ())}
    top = max(grid.budgets)
    log("extrapolation: " + ", ".join(f"{b:.3g} is {b / top:.3g}x the largest fitted budget"
                                      for b in grid.holdout_budgets))
    _write_json(path, {"commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc)
                       .isoformat(timespec="seconds"), "budgets": list(grid.budgets),
                       "fitted_budgets": sorted(fitted),  # those some family's envelope fitted
                       "holdout_budgets": list(grid.holdout_budgets), "n_boot": grid.n_boot, "corpora": corpora})
    return path


def load_prediction(out: Path, name: str = PREDICTION) -> dict:
    path = out / name
    if not path.is_file():
        raise ConfigError(f"{path}: no prediction yet (run `rltok scaling --predict` first, with the same --at)")
    return json.loads(path.read_text())


def _prediction(d: dict):
    """A scaling_fit.Prediction from its JSON (None -> NaN, lists -> tuples)."""
    from rltok.analysis.scaling_fit import Prediction

    def value(v):
        if isinstance(v, list):
            return tuple(value(x) for x in v)
        return math.nan if v is None else v

    return Prediction(**{f.name: value(d[f.name]) for f in dataclasses.fields(Prediction)})


BUILD_FACTOR = 2.0  # a predicted N* whose nearest buildable model is further off than this is not run


def two_point_l_star(records: list[dict], family: str, fitted, budget: float) -> float | None:
    """The naive forecast a fitted law has to beat: the power law L = a·C^(−b) through the family's
    isoFLOP parabola L* (the envelope's own inputs) at the two largest budgets its envelope fitted,
    read at `budget`; None with fewer than two such budgets or a non-positive L*."""
    from rltok.analysis.scaling_fit import fit_isoflop, profiles_from_records

    fitted = sorted(float(b) for b in fitted)[-2:]
    profiles = profiles_from_records([r for r in records if float(r["budget_flops"]) in fitted]).get(family, {})
    if len(fitted) < 2 or any(b not in profiles for b in fitted):
        return None
    (c1, l1), (c2, l2) = [(b, fit_isoflop(profiles[b], n_boot=0).l_star) for b in fitted]
    if not (l1 > 0 and l2 > 0 and math.isfinite(l1) and math.isfinite(l2)):
        return None
    return l2 * (budget / c2) ** (-math.log(l1 / l2) / math.log(c2 / c1))


def holdout_points(grid: Grid, prediction: dict, log=print) -> list[Point]:
    """Per corpus, family and holdout budget with a predicted N*: the holdout seeds at the predicted
    N* itself, built by the family's shape rule (`family_rungs`: the nearest shape), not at the
    nearest rung of a size window, whose centre at a budget never run can lie far from N*. A
    prediction whose nearest buildable model is more than BUILD_FACTOR off (an N* below the
    smallest shape, or one too large to train) is logged and not run."""
    points = []
    for fam in grid.families:
        for corpus in grid.corpora:
            for budget in grid.holdout_budgets:
                pred = prediction["corpora"].get(corpus, {}).get(fam.name, {}).get(_key(budget), {})
                if pred.get("n_star") is None or not math.isfinite(pred["n_star"]) or pred["n_star"] <= 0:
                    log(f"{corpus} {fam.name} at {budget:.3g}: no prediction ({pred.get('error', 'missing')})")
                    continue
                target = round(pred["n_star"])
                try:
                    rung = family_rungs(grid, fam, [target])[target]
                except ConfigError as e:
                    log(f"{corpus} {fam.name} at {budget:.3g}: predicted N* {target:,} cannot be built ({e}): not run")
                    continue
                if not 1 / BUILD_FACTOR <= rung.achieved / target <= BUILD_FACTOR:
                    log(f"{corpus} {fam.name} at {budget:.3g}: predicted N* {target:,} cannot be built within "
                        f"{BUILD_FACTOR:g}x (the shape rule's nearest: {rung.achieved:,}): not run")
                    continue
                points += [Point(corpus, budget, fam, rung, s, "holdout") for s in grid.holdout_seeds]
    return points


def _unscored(row: dict, pred, diverged: int) -> dict:
    """A held-out score row whose every run diverged: the prediction, no measurement, the count."""
    from rltok.analysis.scaling_fit import to_plain

    return {**row, "seeds": [], "prediction": to_plain(pred), "measured": None, "measured_interval": None,
            "error": None, "within": None, "size": None, "size_ratio": None, "size_within": None,
            "diverged_seeds": diverged, "baseline_error": None}


def score_holdout(grid: Grid, out: Path, points: list[Point], prediction: dict) -> list[dict]:
    """Each (corpus, family, holdout budget) run: its prediction scored against its seeds; then each
    group's prediction against its best member's held-out runs there (chosen on the selection
    split, as the report chooses, among the members that ran: `members_run`)."""
    from rltok.analysis.scaling_fit import to_plain

    cells: dict = {}
    for p in points:
        cells.setdefault((p.corpus, p.family.name, p.budget), []).append(out / p.corpus / f"{p.stem}.json")
    scores = []
    for (corpus, family, budget), paths in cells.items():
        every = [json.loads(path.read_text()) for path in paths if path.exists()]
        recs = [r for r in every if r.get("bpb") is not None]  # a diverged seed has no loss: counted below
        plain = prediction["corpora"][corpus][family][_key(budget)]
        pred = _prediction(plain)
        baseline = two_point_l_star(read_records(out / corpus), family, plain.get("fitted_budgets", ()), budget)
        if not recs:
            if every:  # every seed diverged: the prediction is not scored, and the table says why
                scores.append(_unscored({"corpus": corpus, "family": family, "budget": budget,
                                         "baseline_l_star": baseline}, pred, len(every)))
            continue
        size = sum(r["non_embedding_params"] for r in recs) / len(recs)
        score = score_prediction(pred, [r["bpb"] for r in recs], size)
        scores.append({"corpus": corpus, "family": family, "budget": budget, "seeds": [r["seed"] for r in recs],
                       **to_plain(score), "diverged_seeds": len(every) - len(recs), "baseline_l_star": baseline,
                       "baseline_error": None if baseline is None else score.measured - baseline})
    for corpus in [c for c in grid.corpora if any(key[0] == c for key in cells)]:
        held = [json.loads(path.read_text()) for (c, _, _), paths in cells.items() if c == corpus
                for path in paths if path.exists()]
        records = with_groups(read_records(out / corpus), grid.groups)
        for group, members in grid.groups.items():
            for budget in grid.holdout_budgets:
                plain = prediction["corpora"].get(corpus, {}).get(group, {}).get(_key(budget), {})
                ran = [r for r in held if r["family"] in members and float(r["budget_flops"]) == budget]
                if plain.get("n_star") is None or not ran:
                    continue
                pred = _prediction(plain)
                baseline = two_point_l_star(records, group, plain.get("fitted_budgets", ()), budget)
                row = {"corpus": corpus, "family": group, "budget": budget,
                       "members_run": sorted({r["family"] for r in ran}), "baseline_l_star": baseline}
                member_runs = [r for r in with_groups(ran, {group: members}) if r["family"] == group]
                if not member_runs:  # every member's every seed diverged: unscored, with the count
                    scores.append(_unscored({**row, "member": None}, pred, len(ran)))
                    continue
                member = member_runs[0]["group_member"]
                size = sum(r["non_embedding_params"] for r in member_runs) / len(member_runs)
                score = score_prediction(pred, [r["bpb"] for r in member_runs], size)
                lost = sum(1 for r in ran if r["family"] == member and r.get("bpb") is None)
                scores.append({**row, "member": member, "seeds": sorted(r["seed"] for r in member_runs),
                               **to_plain(score), "diverged_seeds": lost,
                               "baseline_error": None if baseline is None else score.measured - baseline})
    return scores


def holdout_paired(grid: Grid, folder: Path) -> list[dict]:
    """Per pair of the grid's `crossovers` (families or groups) and holdout budget both sides ran,
    in one corpus folder: a's held-out runs minus b's, paired by seed (t interval), each side at the
    size it ran there, its predicted N*; a group as its best member there on the selection split
    (`with_groups`). Rows as fits.json's `paired`, so `scaling_summary.paired_table` tables them."""
    from rltok.analysis.scaling_fit import choice_records, profiles_from_records, to_plain
    from rltok.analysis.scaling_report import paired_verdicts

    held = {float(b) for b in grid.holdout_budgets}
    every = [r for r in read_records(folder) if float(r["budget_flops"]) in held]
    records = with_groups(every, grid.groups)
    profiles, chosen = profiles_from_records(records), profiles_from_records(choice_records(records))
    rows = [{**to_plain(v), "verdict": v.difference.verdict if v.difference else None}
            for a, b in grid.crossovers for v in paired_verdicts(profiles, a, b, chosen)]
    # a side that ran there but whose every seed diverged: the pair keeps a row that says so
    ran = {name: {float(r["budget_flops"]) for r in every if r["family"] in grid.groups.get(name, (name,))}
           for pair in grid.crossovers for name in pair}
    paired = {(r["a"], r["b"], r["budget"]) for r in rows}
    for a, b in grid.crossovers:
        for budget in sorted(held & ran[a] & ran[b]):
            if (a, b, budget) not in paired:  # both ran, yet no pair: a side has no finished seed
                lost = [n for n in (a, b) if budget not in profiles.get(n, {})]
                rows.append({"a": a, "b": b, "budget": budget, "size_a": None, "size_b": None, "difference": None,
                             "reason": f"{', '.join(lost)}: every held-out seed diverged", "verdict": None})
    return rows


def run_holdout(grid: Grid, out: Path, log=print, runner=None) -> tuple[list[dict], dict[str, list[dict]]]:
    """Run the predicted optima at the holdout budgets (skipping those done), score them and pair
    the grid's pairs there (`holdout_paired`), and write both to OUT/prediction_score.json; the
    scores and {corpus: paired rows}."""
    prediction = load_prediction(out)
    splits = {c: corpus_split(grid, c, log) for c in grid.corpora}
    points = holdout_points(grid, prediction, log)
    log(f"{len(points)} holdout points")
    run_points(grid, points, out, splits, log, runner)
    scores = score_holdout(grid, out, points, prediction)
    paired = {c: holdout_paired(grid, out / c) for c in grid.corpora if (out / c).is_dir()}
    _write_scores(out / SCORE, grid, prediction, scores, paired)
    plot_scores(out / SCORE, log)
    return scores, paired


def plot_scores(path: Path, log=print) -> Path | None:
    """The score file's plot beside it (every corpus it holds, `study_plots.plot_prediction_scores`);
    without matplotlib, a note instead."""
    from rltok_lab.study_plots import plot_prediction_scores

    pred = json.loads(path.read_text())
    budgets = sorted({float(s["budget"]) for s in pred["scores"]})
    try:
        return plot_prediction_scores(pred["scores"], path.with_suffix(".png"),
                                      ", ".join(budget_tag(b) for b in budgets))
    except RuntimeError as e:
        log(f"note: no plot of {path.name}: {e}")
        return None


@contextlib.contextmanager
def _exclusive(path: Path):
    """Hold an exclusive advisory lock on `path` (created) while the block runs; waits for another
    process holding it. Without fcntl (Windows) nothing is locked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_scores(path: Path, grid: Grid, prediction: dict, scores: list[dict],
                  paired: dict[str, list[dict]] | None = None) -> None:
    """One process per corpus may score its part: keep the other corpora's scores (and paired rows)
    in `path` (read and rewritten under a lock, so two corpora finishing together do not drop each
    other's)."""
    with _exclusive(path.with_name("." + path.name + ".lock")):
        old = json.loads(path.read_text()) if path.exists() else {}
        kept = [s for s in old.get("scores", []) if s["corpus"] not in grid.corpora]
        body = {"prediction_commit": prediction["commit"], "scores": kept + scores}
        if paired is not None:
            body["paired"] = {**{c: rows for c, rows in old.get("paired", {}).items() if c not in grid.corpora},
                              **paired}
        _write_json(path, body)


BASELINE_NOTE = ("Two-point error: the same measured (or fitted) L* minus a naive forecast, the power law through "
                 "the family's parabola L* at the two largest budgets its envelope fitted; the law earns its keep "
                 "where its |error| is the smaller.")
LOSS_FMT, SIZE_FMT = ".4f", ",.0f"  # how the tables print losses (bpb) and sizes (parameters)


def _yes(x) -> str:
    return "–" if x is None else ("yes" if x else "no")


def _name(score: dict) -> str:
    """A family, or a group with the member that stood for it."""
    return score["family"] + (f" ({score['member']})" if score.get("member") else "")


def diverged(score: dict) -> str:
    n = score.get("diverged_seeds") or 0
    return f"; {n} diverged" if n else ""


def score_table(scores: list[dict]) -> str:
    """Predicted against measured L* per corpus, family and holdout budget."""
    lines = ["| corpus | family | budget | predicted L* (interval) | measured L* (seeds) | error | within "
             "| N run / N* | two-point error |", "|---|---|---|---|---|---|---|---|---|"]
    for s in scores:
        p = s["prediction"]
        lines.append(f"| {s['corpus']} | {_name(s)} | {s['budget']:.3g} "
                     f"| {estimate(p['l_star'], p['l_star_interval'], LOSS_FMT)} "
                     f"| {number(s['measured'], LOSS_FMT)} ({len(s['seeds'])}{diverged(s)}) "
                     f"| {number(s['error'], '+.4f')} | {_yes(s['within'])} | {number(s['size_ratio'], '.2f')} "
                     f"| {number(s.get('baseline_error'), '+.4f')} |")
    return "\n".join(lines)


def score_forecast(grid: Grid, out: Path, at, prediction: dict) -> list[dict]:
    """A forecast of the study's budgets `at` against their isoFLOP fits: per corpus and family,
    the predicted N* and L* (with intervals) beside the parabola's N* and L* at that budget (with
    the bootstrap intervals of its seeds), the error in L*, and whether each measured optimum lies
    inside the predicted interval. A budget whose optimum is not interior is scored and flagged
    (its parabola's optimum is then an extrapolation of its own)."""
    from rltok.analysis.scaling_fit import choice_records, fit_study, to_plain

    at = sorted(float(b) for b in at)
    scores = []
    for corpus in grid.corpora:
        records = with_groups(read_records(out / corpus), grid.groups)
        study = fit_study(records, budgets=at, n_boot=grid.n_boot)
        # a size predicted on the selection split is scored against that split's parabola
        chooser = fit_study(choice_records(records), budgets=at, n_boot=grid.n_boot) if grid.select_split else {}
        for name in _names(grid):
            for budget in at:
                pred = prediction["corpora"].get(corpus, {}).get(name, {}).get(_key(budget), {})
                iso = study[name].isofits.get(budget) if name in study else None
                if pred.get("n_star") is None or iso is None:
                    continue
                p = _prediction(pred)
                (lo, hi), (nlo, nhi) = p.l_star_interval, p.n_star_interval
                minimum = math.isfinite(iso.n_star)  # a parabola opening downwards has none: nothing to score
                sized = iso
                if pred.get("size_split") == grid.select_split and name in chooser:
                    sized = chooser[name].isofits.get(budget) or iso
                size_min = math.isfinite(sized.n_star)
                baseline = two_point_l_star(records, name, pred.get("fitted_budgets", ()), budget)
                member = next((r["group_member"] for r in records if r["family"] == name and "group_member" in r
                               and float(r["budget_flops"]) == budget), None)
                scores.append(to_plain({
                    "corpus": corpus, "family": name, "budget": budget, "member": member, "prediction": p,
                    "l_star": iso.l_star, "l_star_interval": iso.l_star_interval, "n_star": sized.n_star,
                    "n_star_interval": sized.n_star_interval, "interior": iso.interior, "minimum": minimum,
                    "best_size": iso.best_size, "best_loss": iso.best_loss,
                    "error": iso.l_star - p.l_star if minimum else None,
                    "within": in_interval(iso.l_star, (lo, hi)) if minimum else None,
                    "size_ratio": sized.n_star / p.n_star if size_min else None,
                    "size_within": in_interval(sized.n_star, (nlo, nhi)) if size_min else None, "baseline_l_star": baseline,
                    "baseline_error": iso.l_star - baseline if minimum and baseline is not None else None}))
    return scores


def run_forecast_score(grid: Grid, out: Path, at, log=print) -> list[dict]:
    """`rltok scaling --holdout --at B`: score OUT/prediction_C<B>.json against the study's runs
    at B (trains nothing) into OUT/prediction_C<B>_score.json, keeping other corpora's scores."""
    prediction = load_prediction(out, prediction_name(at))
    upto = dataclasses.replace(grid, budgets=tuple(b for b in grid.budgets if b <= max(float(x) for x in at)))
    pending = pending_point(upto, out)
    if pending is not None:
        raise ConfigError(f"{budget_tag(pending.budget)} is not complete: `rltok scaling` would still run "
                          f"{pending.corpus} {pending.stem} ({pending.kind}); a forecast is scored once the budget "
                          "it forecasts is complete")
    scores = score_forecast(grid, out, at, prediction)
    if not scores:
        log(f"no family has an isoFLOP fit at {', '.join(f'{b:.3g}' for b in at)} yet: nothing scored")
    _write_scores(out / score_name(at), grid, prediction, scores)
    plot_scores(out / score_name(at), log)
    return scores


def forecast_table(scores: list[dict]) -> str:
    """Predicted against fitted optima per corpus, family and forecast budget."""
    lines = ["| corpus | family | budget | predicted L* (interval) | fitted L* (interval) | error | within "
             "| predicted N* (interval) | fitted N* | N* within | two-point error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in scores:
        p = s["prediction"]
        flag = "" if s["interior"] else " (edge)"
        if not s["minimum"]:
            flag = " (no minimum)"
        lines.append(f"| {s['corpus']} | {_name(s)} | {budget_tag(s['budget'])} "
                     f"| {estimate(p['l_star'], p['l_star_interval'], LOSS_FMT)} "
                     f"| {estimate(s['l_star'], s['l_star_interval'], LOSS_FMT)}{flag} | {number(s['error'], '+.4f')} "
                     f"| {_yes(s['within'])} | {estimate(p['n_star'], p['n_star_interval'], SIZE_FMT)} "
                     f"| {number(s['n_star'], SIZE_FMT)}{flag} | {_yes(s['size_within'])} "
                     f"| {number(s.get('baseline_error'), '+.4f')} |")
    return "\n".join(lines)


def prediction_table(prediction: dict) -> str:
    """A prediction file's numbers: per corpus, family and predicted budget, N* and L* with their
    intervals and the budgets fitted (or why there is no prediction)."""
    lines = ["| corpus | family | budget | predicted N* (interval) | predicted L* (interval) | fitted budgets |",
             "|---|---|---|---|---|---|"]
    for corpus, families in prediction["corpora"].items():
        for family, budgets in families.items():
            for key, p in budgets.items():
                budget = budget_tag(float(key))
                if p.get("n_star") is None:
                    lines.append(f"| {corpus} | {family} | {budget} | – | – | {p.get('error', 'no prediction')} |")
                    continue
                fitted = ", ".join(budget_tag(b) for b in p.get("fitted_budgets", []))
                lines.append(f"| {corpus} | {family} | {budget} | {estimate(p['n_star'], p['n_star_interval'], SIZE_FMT)} "
                             f"| {estimate(p['l_star'], p['l_star_interval'], LOSS_FMT)} | {fitted} |")
    return "\n".join(lines)


def predictions_block(out: Path) -> str:
    """Every prediction file of a study folder (the held-out budgets' and any forecast of its own
    budgets) with its score once its runs exist: markdown, or "" when there is none."""
    parts = []
    for path in sorted(out.glob("prediction*.json")):
        if path.name.endswith("_score.json"):
            continue
        pred = json.loads(path.read_text())
        held = ", ".join(budget_tag(b) for b in pred["holdout_budgets"])
        kind = "the held-out budgets" if path.name == PREDICTION else "a forecast of the study's own budget"
        parts.append(f"#### `{path.name}`: {kind} {held}\n\nWritten at commit `{pred['commit']}` on {pred['date']}, "
                     f"before any run at {held}; fitted on {', '.join(budget_tag(b) for b in pred['fitted_budgets'])}."
                     f"\n\n{prediction_table(pred)}")
        score = path.with_name(path.name.replace(".json", "_score.json"))
        if not score.exists():
            at = "" if path.name == PREDICTION else " --at " + " ".join(f"{b:g}" for b in pred["holdout_budgets"])
            parts.append(f"Not scored yet (`rltok scaling --grid GRID --out DIR --holdout{at}`).")
            continue
        scores = json.loads(score.read_text())["scores"]
        if path.name == PREDICTION:
            parts.append(f"Scored against {held}'s runs at the predicted sizes:\n\n{score_table(scores)}\n\n{BASELINE_NOTE}")
        else:
            parts.append(f"Scored against {held}'s isoFLOP fits:\n\n{forecast_table(scores)}\n\n{BASELINE_NOTE}")
    return "\n\n".join(parts)
