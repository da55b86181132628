"""The compute-optimal study's report for one corpus, from its run records (docs/SCALING.md, "The
fits"): `build_report` computes it, `report_plain` is its fits.json, `report_markdown` its report.md."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from rltok.analysis.paired_stats import PairedDifference, paired_difference
from rltok.analysis.scaling_fit import (Crossover, FamilyFit, IsoProfile, best_size_index, choice_records,
                                        crossover, fit_study, predict, profiles_from_records, record_family,
                                        record_shape, record_size, shared_seed_means, to_plain)
from rltok.analysis.scaling_plots import inference_runs
from rltok.analysis.table_cells import interval, number, table


@dataclasses.dataclass(frozen=True)
class ReferenceScale:
    """The scale the published reference models train at, which the fits are extrapolated to."""
    flops: float = 3e18
    params: float = 147e6
    bytes: float = 6e9


REFERENCE = ReferenceScale()


# ---------------------------------------------------------------- groups

@dataclasses.dataclass(frozen=True)
class GroupChoice:
    """The member that stands for a group at one budget, and the loss it was chosen by."""
    group: str
    budget: float
    member: str
    loss: float
    basis: str  # how the member was chosen, shown in the group table: always "best measured" (see below)


def choose_members(profiles: Mapping[str, Mapping[float, IsoProfile]],
                   groups: Mapping[str, Sequence[str]]) -> list[GroupChoice]:
    """Per group and budget (any budget where a member has runs), the member whose best measured
    size has the lowest mean loss over the seeds the members' best sizes all ran (ties to the
    alphabetically first), on the choice losses' `profiles`. Not the fitted L*: a parabola that fits
    badly puts its optimum far below every run it has."""
    out = []
    for group, members in groups.items():
        for budget in sorted({b for m in members for b in profiles.get(m, {})}):
            present = [m for m in members if budget in profiles.get(m, {})]
            best = [_best_size(profiles[m][budget])[1] for m in present]  # {seed: loss} at each one's best size
            loss, member = min(zip(shared_seed_means(best), present))
            out.append(GroupChoice(group, budget, member, float(loss), "best measured"))
    return out


def group_records(records: Iterable[dict], choices: Iterable[GroupChoice]) -> list[dict]:
    """Copies of each chosen member's runs at its budget, labelled with the group's name (and `group_member`)."""
    records = list(records)
    out = []
    for c in choices:
        out += [{**r, "family": c.group, "group_member": c.member} for r in records
                if record_family(r) == c.member and float(r["budget_flops"]) == c.budget]
    return out


# ---------------------------------------------------------------- crossovers and paired verdicts

@dataclasses.dataclass(frozen=True)
class PairCrossover:
    """A pair's crossover (`scaling_fit.crossover`, searched up to the reference's compute), or
    why none was computed."""
    a: str
    b: str
    crossover: Crossover | None
    reason: str | None


def pair_crossover(study: Mapping[str, FamilyFit], a: str, b: str, below: float = REFERENCE.flops) -> PairCrossover:
    for name in (a, b):
        if name not in study:
            return PairCrossover(a, b, None, f"{name}: no runs")
        if study[name].envelope is None:
            return PairCrossover(a, b, None, f"{name}: no envelope ({study[name].envelope_error})")
    try:
        return PairCrossover(a, b, crossover(study[a].envelope, study[b].envelope, below=below), None)
    except ValueError as e:
        return PairCrossover(a, b, None, str(e))


@dataclasses.dataclass(frozen=True)
class PairedBudget:
    """At one budget: the loss of a's best measured size minus b's, paired by seed."""
    a: str
    b: str
    budget: float
    size_a: float
    size_b: float
    difference: PairedDifference | None
    reason: str | None  # why there is no difference (no seed shared)


def _at_size(profile: IsoProfile, size: float) -> dict:
    """{seed: loss} of one size of a profile."""
    i = int(np.flatnonzero(profile.sizes == size)[0])
    return dict(zip(profile.seeds[i], (float(v) for v in profile.losses[i])))


def _best_size(profile: IsoProfile) -> tuple[float, dict]:
    """The best size (`best_size_index`) and its {seed: loss} over all its seeds."""
    size = float(profile.sizes[best_size_index(profile)])
    return size, _at_size(profile, size)


def paired_verdicts(profiles: Mapping[str, Mapping[float, IsoProfile]], a: str, b: str,
                    chosen: Mapping[str, Mapping[float, IsoProfile]] | None = None) -> list[PairedBudget]:
    """Per budget both have runs at: a's best size against b's, paired by seed (t interval), the
    sizes chosen on `chosen` (the choice losses' profiles; default `profiles`)."""
    chosen = profiles if chosen is None else chosen
    out = []
    for budget in sorted(set(profiles.get(a, {})) & set(profiles.get(b, {}))):
        size_a, size_b = _best_size(chosen[a][budget])[0], _best_size(chosen[b][budget])[0]
        loss_a, loss_b = _at_size(profiles[a][budget], size_a), _at_size(profiles[b][budget], size_b)
        try:
            diff, reason = paired_difference(loss_a, loss_b, name_a=a, name_b=b), None
        except ValueError as e:
            diff, reason = None, str(e)
        out.append(PairedBudget(a, b, budget, size_a, size_b, diff, reason))
    return out


# ---------------------------------------------------------------- the whole report

@dataclasses.dataclass(frozen=True)
class MachineTime:
    """The runs' wall-clock time, summed; the runs without a time, and those timed by training alone."""
    runs: int
    hours: float
    without_time: int
    training_only: int = 0


def record_seconds(r: dict) -> tuple[float | None, bool]:
    """(a run's wall-clock seconds, whether that is its training alone): `point_wall_s`, else `wall_s`."""
    if r.get("point_wall_s") is not None:
        return float(r["point_wall_s"]), False
    return (None, False) if r.get("wall_s") is None else (float(r["wall_s"]), "diverged" not in r)


def machine_time(records: Sequence[dict]) -> MachineTime:
    timed = [record_seconds(r) for r in records]
    secs = [s for s, _ in timed if s is not None]
    return MachineTime(len(records), sum(secs) / 3600.0, len(records) - len(secs), sum(only for _, only in timed))


@dataclasses.dataclass(frozen=True)
class StudyReport:
    """Everything report.md and fits.json say about one corpus."""
    corpus: str
    study: dict  # family or group -> FamilyFit
    profiles: dict  # family or group -> {budget: IsoProfile}
    groups: dict  # group -> its member families
    choices: tuple  # GroupChoice, per group and budget
    crossovers: tuple  # PairCrossover, per pair
    paired: tuple  # PairedBudget, per pair and budget
    reference: tuple  # Prediction at the reference's compute, per envelope
    reference_scale: ReferenceScale
    machine: MachineTime
    records: tuple  # the runs read (members only): the inference plot reads them
    chosen: dict = dataclasses.field(default_factory=dict)  # as `profiles`, of the choice losses (selection split)


def build_report(records: Iterable[dict], groups: Mapping[str, Sequence[str]] | None = None,
                 pairs: Iterable[Sequence[str]] = (), corpus: str = "", n_boot: int = 1000, seed: int = 0,
                 budgets: Iterable[float] | None = None, reference: ReferenceScale = REFERENCE,
                 interior_only: bool = False, fit_from: float | None = None) -> StudyReport:
    """Fit the records' families and the groups, and compute every part of the report (from the
    scored records at `budgets` when given; the machine time counts every record)."""
    every = list(records)
    keep = None if budgets is None else {float(b) for b in budgets}
    records = [r for r in every if r.get("bpb") is not None and (keep is None or float(r["budget_flops"]) in keep)]
    fit_kw = dict(n_boot=n_boot, seed=seed, interior_only=interior_only, fit_from=fit_from)
    study = fit_study(records, **fit_kw)
    profiles = profiles_from_records(records)
    chosen = profiles_from_records(choice_records(records))  # what the choices read: the selection split
    groups = {g: tuple(m) for g, m in (groups or {}).items()}
    choices = choose_members(chosen, groups)
    grouped = group_records(records, choices)  # each group fitted, profiled and chosen on like a family
    if grouped:
        study.update(fit_study(grouped, **fit_kw))
        profiles.update(profiles_from_records(grouped))
        chosen.update(profiles_from_records(choice_records(grouped)))
    pairs = [tuple(p) for p in pairs]
    crossings = [pair_crossover(study, a, b, reference.flops) for a, b in pairs]
    paired = [v for a, b in pairs for v in paired_verdicts(profiles, a, b, chosen)]
    preds = [predict(f.envelope, reference.flops) for f in study.values() if f.envelope is not None]
    return StudyReport(corpus, study, profiles, groups, tuple(choices), tuple(crossings), tuple(paired),
                       tuple(preds), reference, machine_time(every), tuple(records), chosen)


def report_plain(rep: StudyReport, command: str | None = None, commit: str | None = None) -> dict:
    """fits.json: the fits of every family and group, and every other part of the report."""
    crossovers = []
    for p in rep.crossovers:
        row = to_plain(p)
        if p.crossover is not None:  # with the verdicts, which are properties to_plain leaves out
            row["crossover"] = {**to_plain(p.crossover), "verdict": p.crossover.verdict,
                                "verdict_below": p.crossover.verdict_below}
        crossovers.append(row)
    paired = [{**to_plain(v), "verdict": v.difference.verdict if v.difference else None} for v in rep.paired]
    return {"corpus": rep.corpus, "command": command, "commit": commit, "families": to_plain(rep.study),
            "groups": {g: {"members": list(m), "choices": [to_plain(c) for c in rep.choices if c.group == g]}
                       for g, m in rep.groups.items()},
            "crossovers": crossovers, "paired": paired,
            "reference": {**to_plain(rep.reference_scale), "predictions": to_plain(list(rep.reference))},
            "machine": to_plain(rep.machine)}


# ---------------------------------------------------------------- report.md

def best_index(rep: StudyReport, family: str, budget: float) -> int:
    """The index in the reported profile of the size with the lowest mean choice loss."""
    profile = rep.profiles[family][budget]
    chosen = rep.chosen.get(family, {}).get(budget)
    if chosen is None:
        return best_size_index(profile)
    size = float(chosen.sizes[best_size_index(chosen)])
    return int(np.flatnonzero(profile.sizes == size)[0])


def best_shape(rep: StudyReport, family: str, budget: float, size: float) -> str:
    """`record_shape` of a family's (or a group's member's) runs of `size` at `budget`; "–" where none says."""
    member = next((c.member for c in rep.choices if c.group == family and c.budget == budget), family)
    shapes = (record_shape(r) for r in rep.records
              if record_family(r) == member and r.get("budget_flops") == budget and record_size(r) == size)
    return next((sh for sh in shapes if sh is not None), "–")


def best_table(rep: StudyReport) -> str:
    """(a) Per family and budget: the loss at the best size, that size, its shape and seeds, the
    fitted N*, whether the optimum is interior, and the parabola's residual sd beside the sd a size
    mean has from seed noise alone (well above it: the profile is not a parabola)."""
    rows = []
    for family in sorted(rep.profiles):
        for budget, profile in sorted(rep.profiles[family].items()):
            i = best_index(rep, family, budget)
            iso = rep.study[family].isofits.get(budget)
            where, fit = "fewer than 3 sizes", "–"
            if iso is not None:
                where = "interior" if iso.interior else f"extend {iso.extend}"
                noise = None if iso.seed_sd is None else iso.seed_sd / math.sqrt(float(np.mean(iso.counts)))
                fit = " / ".join("–" if v is None else f"{v:.3f}" for v in (iso.residual_sd, noise))
            rows.append(f"| {family} | {budget:.3g} | {profile.means[i]:.4f} | {profile.sizes[i]:,.0f} | "
                        f"{best_shape(rep, family, budget, profile.sizes[i])} | "
                        f"{','.join(map(str, profile.seeds[i]))} | {len(profile.sizes)} | "
                        f"{number(iso.n_star if iso else None)} | {where} | {fit} |")
    return table(["family", "budget", "bpb at the best size", "at N", "shape", "seeds", "sizes", "fitted N*",
                  "optimum", "residual sd / noise of a size mean"], rows)


def group_table(rep: StudyReport) -> str:
    return table(["group", "budget", "member", "by", "its loss"],
                 [f"| {c.group} | {c.budget:.3g} | {c.member} | {c.basis} | {c.loss:.4f} |" for c in rep.choices])


def envelope_table(rep: StudyReport) -> str:
    """(b) L*(C) = E + A C^-alpha and N*(C) = k C^a per family and group, with intervals."""
    rows = []
    for family, fit in sorted(rep.study.items()):
        env = fit.envelope
        if env is None:
            rows.append(f"| {family} | – | – | – | – | – | – | no envelope: {fit.envelope_error} |")
            continue
        p, iv = env.params, env.intervals
        cells = [(p.e, "E"), (math.exp(p.log_a), "A"), (p.alpha, "alpha"), (math.exp(p.log_k), "k"), (p.a, "a")]
        note = env.note + ("; E at its bound 0" if env.e_fixed is None and p.e == 0 else "")
        rows.append(f"| {family} | {len(env.budgets)} ({env.fitted_range[0]:.3g}–{env.fitted_range[1]:.3g}) | "
                    + " | ".join(f"{number(v)} {interval(iv[k])}" for v, k in cells) + f" | {note} |")
    return table(["family", "budgets fitted", "E", "A", "alpha", "k", "a", "notes"], rows)


def crossover_table(rep: StudyReport) -> str:
    """(c) Each pair: within the fitted range, and in the curves extrapolated to the reference."""
    return table(["pair", "within the fitted range", "extrapolated (not measured)"], [
        f"| {p.a} vs {p.b} | not computed: {p.reason} | – |" if p.crossover is None else
        f"| {p.a} vs {p.b} | {p.crossover.verdict} | extrapolation: {p.crossover.verdict_below} |"
        for p in rep.crossovers])


def paired_table(rep: StudyReport) -> str:
    """(d) Per pair and budget: best size against best size, paired by seed."""
    rows = []
    for v in rep.paired:
        d = v.difference
        head = f"| {v.a} vs {v.b} | {v.budget:.3g} | {v.size_a:,.0f} / {v.size_b:,.0f} | "
        rows.append(head + (f"– | – | – | {v.reason} |" if d is None else f"{','.join(map(str, d.seeds))} | "
                            f"{d.mean:+.4f} | {interval((d.lo, d.hi), '+.4f')} | {d.verdict} |"))
    return table(["pair", "budget", "N (a / b)", "seeds", "mean a − b", "t interval", "verdict"], rows)


def reference_table(rep: StudyReport) -> str:
    """(e) What each envelope implies at the reference's compute: an extrapolation, stated as one."""
    return table(["family", "predicted L*", "predicted N*", "N* / reference N", "extrapolation"], [
        f"| {pred.family} | {number(pred.l_star, '.3f')} {interval(pred.l_star_interval, '.3f')} | "
        f"{number(pred.n_star)} {interval(pred.n_star_interval)} | "
        f"{number(pred.n_star / rep.reference_scale.params)} | "
        f"{pred.extrapolation:.3g}x the largest fitted budget: over {math.log10(pred.extrapolation):.1f} decades |"
        for pred in rep.reference])


def choice_sentence(records: Sequence[dict]) -> str:
    """What the best sizes were chosen on, as the records say: a grid without `select_split` chooses
    on the split it reports, and its best losses are minima over that split (optimistic)."""
    with_select = sum(r.get("bpb_select") is not None for r in records)
    if with_select and with_select == len(records):
        return ("The best size is chosen on the selection split (the lowest mean over seeds) and its loss reported on "
                "the scored split, so no number here is a minimum taken over the split it reports.")
    if not with_select:
        return ("The best size is chosen on the scored split itself (the grid names no `select_split`): each best "
                "loss is the lowest mean over sizes of the split it reports, so it leans optimistic by the seeds' "
                "noise. Set `select_split` to choose on another split.")
    return (f"The best size is chosen on the selection split where a run has one ({with_select} of {len(records)} "
            "runs) and on the scored split where it has not: the latter's best losses lean optimistic.")


def report_markdown(rep: StudyReport, command: str | None = None, commit: str | None = None,
                    plots: Iterable[str] = (), inference: str | None = None) -> str:
    """report.md: every part of the report, the command that made it and the commit; `plots`
    and `inference` (bpb against inference FLOPs per byte) are PNG names beside it."""
    ref, m = rep.reference_scale, rep.machine
    untimed = (f" ({m.without_time} runs without a time)" if m.without_time else "") + (
        f"; {m.training_only} runs recorded their training time only (evaluation and interrupted attempts "
        "uncounted), so the total is a lower bound" if m.training_only else "")
    levels = sorted({f.envelope.level for f in rep.study.values() if f.envelope is not None})
    parts = [
        f"# Compute-optimal study: {rep.corpus}", "",
        f"Generated by `{command or 'rltok.analysis.scaling.fit_corpus'}` at commit `{commit or 'unknown'}`; "
        "regenerate it with `rltok scaling --grid GRID --out DIR --fit-only`, never edit it by hand.", "",
        "## Best runs per family and budget", "",
        choice_sentence(rep.records), "",
        best_table(rep), ""]
    if rep.choices:
        parts += ["Groups: at each budget the member whose best size has the lowest mean loss on the selection "
                  "split; the group is fitted on that member's runs. Where the member changes with the budget the "
                  "group's envelope is one law fitted across two families' optima: read its extrapolation with "
                  "that in mind.", "",
                  group_table(rep), ""]
    parts += [
        "## Envelopes", "", "L*(C) = E + A·C^(−alpha), N*(C) = k·C^a; bootstrap "
        f"{'/'.join(f'{v:.0%}' for v in levels) or '95%'} intervals in brackets.", "", envelope_table(rep), "",
        "## Crossovers", "", crossover_table(rep) if rep.crossovers else "No pairs in the grid (`crossovers`).", "",
        "## Paired verdicts per budget", "",
        "Each family's best measured size; the difference a − b over the seeds both ran, with its t interval.", "",
        paired_table(rep) if rep.paired else "No pair has runs at a shared budget.", "",
        f"## At the reference's scale ({ref.flops:.3g} FLOPs: {ref.params / 1e6:.0f}M parameters, "
        f"{ref.bytes:.3g} bytes)", "",
        "Extrapolations of the envelopes, not measurements; the intervals hold only if the power laws hold "
        "that far.", "", reference_table(rep) if rep.reference else "No envelope to extrapolate.", "",
        "## Machine time", "", f"{m.runs} runs, {m.hours:.2f} machine-hours (sum of the runs' `point_wall_s`, else `wall_s`){untimed}.",
        ""]
    if inference:
        largest = inference_runs(list(rep.records))[0] or math.nan
        parts += ["## bpb against inference FLOPs per byte", "",
                  f"Every run at the largest budget every family has run ({largest:.3g} FLOPs): forward FLOPs per byte of the "
                  "trained model against its bpb; marker area grows with log N.", "",
                  f"![bpb against inference FLOPs per byte]({inference})", ""]
    plots = list(plots)
    if plots:
        parts += ["## Plots", "", *(f"- [{p}]({p})" for p in plots), ""]
    return "\n".join(parts)
