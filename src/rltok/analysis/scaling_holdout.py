"""A prediction held out from the fit, and its test.

`write_prediction` (`rltok scaling --predict`): each corpus's records of the grid's budgets
(never the holdout budgets) are fitted (`scaling_fit.fit_study`) and each family's envelope
predicts N* and L* with intervals at every holdout budget (`scaling_fit.predict`), written once to
OUT/prediction.json with the fitted budgets, the commit and the date. It is committed before any
run at those budgets and never rewritten: an existing file is an error.

`run_holdout` (`rltok scaling --holdout`): at each holdout budget each family runs at the rung of
its ladder there nearest the predicted N* (in log N), with the grid's `holdout_seeds`, into the
same corpus folder (resumable like every point); then `score_holdout` scores the prediction
(`scaling_fit.score_prediction`) into OUT/prediction_score.json, and `score_table` prints it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path

from rltok.analysis.scaling import (Grid, Point, _write_json, budget_ladders, corpus_split, read_records,
                                    run_points)
from rltok.config import ConfigError

PREDICTION = "prediction.json"
SCORE = "prediction_score.json"


def _key(budget: float) -> str:
    return repr(float(budget))  # as to_plain writes a float key


def predict_corpus(grid: Grid, folder: Path) -> dict:
    """{family: {holdout budget: the prediction, or {"error": why}}} from the corpus's records."""
    from rltok.analysis.scaling_fit import fit_study, predict, to_plain

    study = fit_study(read_records(folder), budgets=grid.budgets, n_boot=grid.n_boot, interior_only=grid.interior_only,
                      fit_from=grid.fit_from)
    out = {}
    for fam in grid.families:
        fit = study.get(fam.name)
        if fit is None or fit.envelope is None:
            why = "no runs" if fit is None else fit.envelope_error
            out[fam.name] = {_key(b): {"error": why} for b in grid.holdout_budgets}
            continue
        env = fit.envelope
        extra = {"fitted_budgets": [float(b) for b in env.budgets], "note": env.note}
        out[fam.name] = {_key(b): {**to_plain(predict(env, b)), **extra} for b in grid.holdout_budgets}
    return out


def write_prediction(grid: Grid, out: Path, log=print) -> Path:
    """Fit without the holdout budgets and write OUT/prediction.json; refuses to overwrite it."""
    from rltok.analysis.compare import git_commit

    path = out / PREDICTION
    if not grid.holdout_budgets:
        raise ConfigError("grid: --predict needs `holdout_budgets`")
    if path.exists():
        raise ConfigError(f"{path} exists: a prediction is written once, before the runs that test it, and "
                          "never rewritten (move it away to predict again)")
    corpora = {}
    for corpus in grid.corpora:
        if not (out / corpus).is_dir():
            raise ConfigError(f"{corpus}: no runs in {out / corpus} to fit")
        corpora[corpus] = predict_corpus(grid, out / corpus)
    top = max(grid.budgets)
    log("extrapolation: " + ", ".join(f"{b:.3g} is {b / top:.3g}x the largest fitted budget"
                                      for b in grid.holdout_budgets))
    _write_json(path, {"commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc)
                       .isoformat(timespec="seconds"), "fitted_budgets": list(grid.budgets),
                       "holdout_budgets": list(grid.holdout_budgets), "n_boot": grid.n_boot, "corpora": corpora})
    return path


def load_prediction(out: Path) -> dict:
    path = out / PREDICTION
    if not path.is_file():
        raise ConfigError(f"{path}: no prediction yet (run `rltok scaling --predict` first)")
    return json.loads(path.read_text())


def _prediction(d: dict):
    """A scaling_fit.Prediction from its JSON (None -> NaN, lists -> tuples)."""
    from rltok.analysis.scaling_fit import Prediction

    def value(v):
        if isinstance(v, list):
            return tuple(value(x) for x in v)
        return math.nan if v is None else v

    return Prediction(**{f.name: value(d[f.name]) for f in dataclasses.fields(Prediction)})


def holdout_points(grid: Grid, prediction: dict, log=print) -> list[Point]:
    """Per corpus, family and holdout budget with a predicted N*: the holdout seeds at the rung of
    the family's ladder there whose N is nearest N* in log."""
    points = []
    for fam in grid.families:
        ladders = budget_ladders(grid, fam, grid.holdout_budgets, log)
        for corpus in grid.corpora:
            for budget in grid.holdout_budgets:
                pred = prediction["corpora"].get(corpus, {}).get(fam.name, {}).get(_key(budget), {})
                if pred.get("n_star") is None:
                    log(f"{corpus} {fam.name} at {budget:.3g}: no prediction ({pred.get('error', 'missing')})")
                    continue
                rung = min(ladders[budget], key=lambda r: abs(math.log(r.achieved / pred["n_star"])))
                points += [Point(corpus, budget, fam, rung, s, "holdout") for s in grid.holdout_seeds]
    return points


def score_holdout(grid: Grid, out: Path, points: list[Point], prediction: dict) -> list[dict]:
    """Each (corpus, family, holdout budget) run: its prediction scored against its seeds."""
    from rltok.analysis.scaling_fit import score_prediction, to_plain

    groups: dict = {}
    for p in points:
        groups.setdefault((p.corpus, p.family.name, p.budget), []).append(out / p.corpus / f"{p.stem}.json")
    scores = []
    for (corpus, family, budget), paths in groups.items():
        every = [json.loads(path.read_text()) for path in paths if path.exists()]
        recs = [r for r in every if r.get("bpb") is not None]  # a diverged seed has no loss: counted below
        if not recs:
            continue
        pred = _prediction(prediction["corpora"][corpus][family][_key(budget)])
        size = sum(r["non_embedding_params"] for r in recs) / len(recs)
        score = score_prediction(pred, [r["bpb"] for r in recs], size)
        scores.append({"corpus": corpus, "family": family, "budget": budget, "seeds": [r["seed"] for r in recs],
                       **to_plain(score), "diverged_seeds": len(every) - len(recs)})
    return scores


def run_holdout(grid: Grid, out: Path, log=print, runner=None) -> list[dict]:
    """Run the predicted optima at the holdout budgets (skipping those done), score them, and
    write OUT/prediction_score.json; the scores."""
    prediction = load_prediction(out)
    splits = {c: corpus_split(grid, c, log) for c in grid.corpora}
    points = holdout_points(grid, prediction, log)
    log(f"{len(points)} holdout points")
    run_points(grid, points, out, splits, log, runner)
    scores = score_holdout(grid, out, points, prediction)
    # one process per corpus may run its held-out points: keep the other corpora's scores
    kept = [s for s in (json.loads((out / SCORE).read_text())["scores"] if (out / SCORE).exists() else [])
            if s["corpus"] not in grid.corpora]
    _write_json(out / SCORE, {"prediction_commit": prediction["commit"], "scores": kept + scores})
    return scores


def _f(x, fmt: str = ".4f") -> str:
    return "–" if x is None else format(x, fmt)


def score_table(scores: list[dict]) -> str:
    """Predicted against measured L* per corpus, family and holdout budget."""
    lines = ["| corpus | family | budget | predicted L* (interval) | measured L* (seeds) | error | within "
             "| N run / N* |", "|---|---|---|---|---|---|---|---|"]
    for s in scores:
        p = s["prediction"]
        lo, hi = p["l_star_interval"]
        lines.append(f"| {s['corpus']} | {s['family']} | {s['budget']:.3g} | {_f(p['l_star'])} ({_f(lo)}–{_f(hi)}) "
                     f"| {_f(s['measured'])} ({len(s['seeds'])}) | {_f(s['error'], '+.4f')} "
                     f"| {'yes' if s['within'] else 'no'} | {_f(s['size_ratio'], '.2f')} |")
    return "\n".join(lines)
