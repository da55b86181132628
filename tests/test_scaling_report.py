"""The compute-optimal study's report from its records: groups fitted as their best member per
budget, crossovers within the fitted range and extrapolated, verdicts paired by seed per budget,
the reference-scale extrapolation, machine time, the inference plot, and report.md / fits.json
written by fit_corpus and rewritten by `rltok scaling --fit-only`; on synthetic runs from known laws."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rltok.analysis.scaling import fit_corpus, parse_grid
from rltok.analysis.scaling_plots import inference_runs
from rltok.analysis.scaling_report import (build_report, machine_time, paired_verdicts, report_markdown,
                                           report_plain)
from rltok.analysis.scaling_fit import profiles_from_records
from rltok.config import ConfigError

BUDGETS = [1e11, 3e11, 1e12, 3e12, 1e13]
SEED_SHIFT = {0: 0.0, 1: 0.04, 2: -0.03}  # a seed moves every family alike: pairing removes it

X = {"E": 1.5, "A": 80.0, "alpha": 0.15, "k": 0.05, "a": 0.5}
Y = {"E": 1.0, "A": 1.768 * 1e12 ** 0.25, "alpha": 0.25, "k": 0.05, "a": 0.5}  # crosses X at 1e12
W = {"E": 1.0, "A": 0.9499 * 1e15 ** 0.25, "alpha": 0.25, "k": 0.05, "a": 0.5}  # crosses X near 1e15


def loss_of(p, c):
    return p["E"] + p["A"] * c ** -p["alpha"]


def synth(family, p, budgets=BUDGETS, seeds=(0, 1), offsets=np.linspace(-1.2, 1.2, 5), noise=0.002, rng_seed=0):
    """Runs at sizes around the law's optimum, with the fields a scaling record carries."""
    rng = np.random.default_rng(rng_seed)
    out = []
    for c in budgets:
        n_star = p["k"] * c ** p["a"]
        for f in offsets:
            for s in seeds:
                bpb = loss_of(p, c) + 0.08 * f * f + SEED_SHIFT[s] + noise * rng.standard_normal()
                n = n_star * math.exp(f)
                out.append({"family": family, "non_embedding_params": n, "budget_flops": c, "seed": s,
                            "split": "test", "bpb": bpb, "forward_flops_per_byte": 6.0 * n, "wall_s": 90.0})
    return out


RECORDS = synth("x", X) + synth("y", Y, rng_seed=1) + synth("w", W, rng_seed=2)
PAIRS = [("x", "y"), ("x", "w"), ("best", "w"), ("x", "nowhere")]


@pytest.fixture(scope="module")
def report():
    return build_report(RECORDS, {"best": ["x", "y"]}, PAIRS, corpus="salad", n_boot=80)


# ---------------------------------------------------------------- groups

def test_a_group_is_fitted_on_its_best_member_at_each_budget(report):
    chosen = {c.budget: c for c in report.choices}
    assert sorted(chosen) == BUDGETS
    assert chosen[1e11].member == chosen[3e11].member == "x"  # x is lower below 1e12, y above
    assert chosen[3e12].member == chosen[1e13].member == "y"
    assert all(c.basis == "best measured" for c in report.choices)
    assert chosen[1e11].loss == report.profiles["x"][1e11].means.min()
    group = report.study["best"]
    assert group.isofits[3e12].l_star == report.study["y"].isofits[3e12].l_star  # the member's runs, refitted
    assert group.envelope is not None and list(group.envelope.budgets) == BUDGETS
    assert np.array_equal(report.profiles["best"][1e11].means, report.profiles["x"][1e11].means)


def test_the_member_is_chosen_by_measured_loss_never_by_a_parabola_that_fits_badly():
    edge = synth("v", X, budgets=[1e11], offsets=np.array([0.5, 1.0, 1.5, 2.0]))  # optimum below its ladder
    rep = build_report(synth("x", Y, budgets=[1e11]) + edge, {"g": ["x", "v"]}, n_boot=10)
    (choice,) = rep.choices
    assert choice.basis == "best measured" and choice.member == "v"  # X's law lies far below Y's at 1e11
    assert choice.loss == pytest.approx(min(rep.profiles["v"][1e11].means))
    # a zigzag profile: its parabola's minimum lies far below every run, yet each run is worse than
    # every run of the other member, which is chosen
    zig = [{"family": "z", "non_embedding_params": n, "budget_flops": 1e11, "seed": s, "split": "test",
            "bpb": b + 0.01 * s} for n, b in ((1e3, 4.2), (2e3, 3.3), (4e3, 3.3), (8e3, 3.3), (1.6e4, 4.2))
           for s in (0, 1)]
    flat = [{**r, "family": "f", "bpb": 3.2 + 0.01 * r["seed"] + 0.001 * i} for i, r in enumerate(zig)]
    rep = build_report(zig + flat, {"g": ["z", "f"]}, n_boot=10)
    assert rep.study["z"].isofits[1e11].l_star < 3.18 < 3.2 < min(rep.profiles["z"][1e11].means)
    assert rep.choices[0].member == "f"


# ---------------------------------------------------------------- crossovers and paired verdicts

def test_crossovers_within_the_range_extrapolated_and_not_computed(report):
    by_pair = {(p.a, p.b): p for p in report.crossovers}
    inside = by_pair["x", "y"].crossover
    assert inside.c_cross == pytest.approx(1e12, rel=0.3) and inside.below == 3e18
    beyond = by_pair["x", "w"].crossover
    assert beyond.crossings == () and beyond.verdict.startswith("no crossover within the fitted range")
    assert beyond.crossings_below[0] == pytest.approx(1e15, rel=1.0)
    assert by_pair["best", "w"].crossover is not None
    assert by_pair["x", "nowhere"].crossover is None and "nowhere: no runs" in by_pair["x", "nowhere"].reason


def test_paired_verdicts_compare_the_best_sizes_seed_by_seed(report):
    xy = {v.budget: v for v in report.paired if (v.a, v.b) == ("x", "y")}
    assert sorted(xy) == BUDGETS
    low, high = xy[1e11], xy[1e13]
    assert low.difference.verdict == "x below y" and high.difference.verdict == "x above y"
    assert low.difference.seeds == (0, 1) and low.difference.lo < low.difference.mean < low.difference.hi
    best_x = report.profiles["x"][1e11]
    i = int(best_x.means.argmin())
    assert low.size_a == best_x.sizes[i]
    expected = np.mean(best_x.losses[i]) - min(report.profiles["y"][1e11].means)
    assert low.difference.mean == pytest.approx(expected)
    # the seed shift (0.04) is far above the gap's noise: only pairing resolves it
    assert abs(low.difference.hi - low.difference.lo) < 0.1


def test_paired_verdicts_say_when_no_seed_is_shared():
    recs = synth("a", X, budgets=[1e11], seeds=(0,)) + synth("b", X, budgets=[1e11], seeds=(1,))
    (v,) = paired_verdicts(profiles_from_records(recs), "a", "b")
    assert v.difference is None and "no seed is shared" in v.reason
    recs = synth("a", X, budgets=[1e11], seeds=(0,)) + synth("b", X, budgets=[1e11], seeds=(0,))
    (one,) = paired_verdicts(profiles_from_records(recs), "a", "b")
    assert one.difference.verdict == "no difference resolved"


# ---------------------------------------------------------------- the reference scale, time, report

def test_the_reference_extrapolation_and_machine_time(report):
    preds = {p.family: p for p in report.reference}
    assert set(preds) == {"x", "y", "w", "best"}
    x = preds["x"]
    assert x.budget == 3e18 and x.extrapolation == pytest.approx(3e5)
    assert x.l_star == pytest.approx(loss_of(X, 3e18), abs=0.2)
    assert x.l_star_interval[0] <= x.l_star <= x.l_star_interval[1]
    assert report.machine.runs == len(RECORDS) and report.machine.hours == pytest.approx(len(RECORDS) * 90 / 3600)
    m = machine_time([{"wall_s": 3600.0}, {"wall_s": None}, {}])
    assert (m.runs, m.hours, m.without_time, m.training_only) == (3, 1.0, 2, 1)
    # the whole point's time where a record has it; a diverged run's wall_s is its whole attempt
    m = machine_time([{"wall_s": 1800.0, "point_wall_s": 3600.0}, {"wall_s": 1800.0, "diverged": "nan"}])
    assert (m.hours, m.training_only) == (1.5, 0)


def test_report_markdown_has_every_part_and_says_how_it_was_made(report):
    md = report_markdown(report, "rltok scaling --grid g.toml --out d --fit-only", "abc123",
                         ["envelopes.png"], "inference_salad.png")
    assert "`rltok scaling --grid g.toml --out d --fit-only`" in md and "`abc123`" in md and "never edit" in md
    for heading in ("## Best runs per family and budget", "## Envelopes", "## Crossovers",
                    "## Paired verdicts per budget", "## At the reference's scale (3e+18 FLOPs: 147M parameters",
                    "## Machine time", "## bpb against inference FLOPs per byte"):
        assert heading in md
    assert "| x | 1e+11 |" in md and "interior" in md and "| best | 3e+12 | y | best measured |" in md
    # the parabola's fit beside the seed noise: x's profiles are parabolas (noise 0.002) and its
    # seeds 0 and 1 sit 0.04 apart (sd 0.028; the noise of a 2-seed mean: 0.02)
    row = next(line for line in md.splitlines() if line.startswith("| x | 1e+11 |"))
    residual, noise = (float(v) for v in row.rstrip(" |").split("|")[-1].split(" / "))
    assert residual < 0.01 and noise == pytest.approx(0.04 / 2, abs=0.004)
    assert "| residual sd / noise of a size mean |" in md
    assert "extrapolation: the extrapolated fits cross at" in md  # x vs w, labelled
    assert "no crossover within the fitted range" in md and "not computed: nowhere: no runs" in md
    assert "| x vs y | 1e+11 |" in md and "x below y" in md
    assert "over 5.5 decades" in md  # 3e18 / 1e13
    assert "E at its bound 0" in md  # the group's one law across x's and y's optima fits E = 0
    assert f"{len(RECORDS)} runs, {len(RECORDS) * 90 / 3600:.2f} machine-hours" in md
    assert "![bpb against inference FLOPs per byte](inference_salad.png)" in md and "(1e+13 FLOPs)" in md


def test_report_plain_is_strict_json(report):
    plain = report_plain(report, "cmd", "abc")
    text = json.dumps(plain, allow_nan=False)
    back = json.loads(text)
    assert set(back["families"]) == {"x", "y", "w", "best"} and back["groups"]["best"]["members"] == ["x", "y"]
    assert back["crossovers"][0]["crossover"]["verdict"].startswith("x and y cross at")
    assert back["crossovers"][1]["crossover"]["verdict_below"].startswith("the extrapolated fits cross at")
    assert back["paired"][0]["verdict"] == "x below y" and back["reference"]["params"] == 147e6
    assert back["commit"] == "abc" and back["machine"]["runs"] == len(RECORDS)


def test_records_at_other_budgets_are_left_out_but_their_time_counts():
    rep = build_report(RECORDS, n_boot=10, budgets=BUDGETS[:3])
    assert list(rep.study["x"].isofits) == BUDGETS[:3] and rep.machine.runs == len(RECORDS)


# ---------------------------------------------------------------- the inference plot

def test_the_inference_plot_shows_the_largest_budget(tmp_path):
    pytest.importorskip("matplotlib")
    from rltok.analysis.scaling_plots import plot_inference

    top, runs = inference_runs(RECORDS + [{"budget_flops": 1e14, "bpb": 2.0}])  # a run without the field
    assert top == 1e13 and len(runs) == 3 * 5 * 2 and all(r["budget_flops"] == 1e13 for r in runs)
    # a larger budget under way (one family so far) is not the one shown
    partial = [{**r, "budget_flops": 1e15} for r in RECORDS if r["family"] == "x" and r["budget_flops"] == 1e13]
    assert inference_runs(RECORDS + partial)[0] == 1e13
    assert inference_runs(partial)[0] == 1e15
    path = plot_inference(RECORDS, tmp_path / "inference_salad.png", "salad")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert plot_inference([{"budget_flops": 1e11, "bpb": 2.0}], tmp_path / "none.png") is None


# ---------------------------------------------------------------- the grid and the files

BASE = {"corpora": ["salad"], "budgets": [1e8],
        "families": [{"name": n, "method": "flat", "sizes": [1e3]} for n in ("x", "y", "w")]}


def test_the_grid_parses_groups_and_crossovers_and_names_what_is_unknown():
    grid = parse_grid({**BASE, "groups": {"best": ["x", "y"]}, "crossovers": [["best", "w"], ["x", "y"]]})
    assert grid.groups == {"best": ("x", "y")} and grid.crossovers == (("best", "w"), ("x", "y"))
    assert parse_grid(BASE).groups == {} and parse_grid(BASE).crossovers == ()
    with pytest.raises(ConfigError, match=r"groups.best: unknown family name\(s\) rl"):
        parse_grid({**BASE, "groups": {"best": ["x", "rl"]}})
    with pytest.raises(ConfigError, match="a family's name"):
        parse_grid({**BASE, "groups": {"x": ["y", "w"]}})
    with pytest.raises(ConfigError, match="list of one or more"):
        parse_grid({**BASE, "groups": {"best": "x"}})
    with pytest.raises(ConfigError, match=r"crossovers\[0\]: unknown family or group name\(s\) bytes"):
        parse_grid({**BASE, "crossovers": [["x", "bytes"]]})
    with pytest.raises(ConfigError, match="two different"):
        parse_grid({**BASE, "crossovers": [["x", "x"]]})


def _write_records(folder, records):
    folder.mkdir(parents=True)
    for r in records:
        stem = f"C{r['budget_flops']:.4g}__{r['family']}__N{round(r['non_embedding_params'])}__s{r['seed']}"
        (folder / f"{stem.replace('e+', 'e')}.json").write_text(json.dumps(r))


def test_fit_corpus_writes_the_report_and_fit_only_rewrites_it(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from rltok.cli import main

    folder = tmp_path / "study" / "salad"
    _write_records(folder, RECORDS)
    study = fit_corpus(folder, n_boot=20, groups={"best": ("x", "y")}, crossovers=[("best", "w")], command="made")
    assert set(study) == {"x", "y", "w", "best"}
    fits = json.loads((folder / "fits.json").read_text())
    assert fits["command"] == "made" and fits["crossovers"][0]["a"] == "best"
    md = (folder / "report.md").read_text()
    assert "`made`" in md and "(inference_salad.png)" in md and "[envelopes.png](envelopes.png)" in md
    assert (folder / "inference_salad.png").stat().st_size > 5000

    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({**BASE, "budgets": list(BUDGETS), "n_boot": 20, "groups": {"best": ["x", "y"]},
                                "crossovers": [["x", "y"]]}))
    assert main(["scaling", "--grid", str(grid), "--out", str(tmp_path / "study"), "--fit-only"]) == 0
    md = (folder / "report.md").read_text()
    assert f"rltok scaling --grid {grid} --out {tmp_path / 'study'} --fit-only" in md
    assert "| x vs y |" in md and "| best vs w |" not in md
    assert "| best | 1e+11 |" in capsys.readouterr().out


def test_choices_read_the_selection_split_and_verdicts_report_the_scored_one():
    """With `bpb_select` in the records, a pair's best sizes are chosen on it and compared on
    `bpb`: here the selection split prefers a's size 2e4, the scored split its 1e4."""
    recs = []
    for s in (0, 1, 2):
        for n, test, val in ((1e4, 2.00, 2.30), (2e4, 2.10, 2.20), (4e4, 2.40, 2.40)):
            recs.append({"family": "a", "budget_flops": 1e11, "non_embedding_params": n, "seed": s,
                         "bpb": test + 0.01 * s, "bpb_select": val + 0.01 * s, "split": "test"})
        recs.append({"family": "b", "budget_flops": 1e11, "non_embedding_params": 1e4, "seed": s,
                     "bpb": 2.5 + 0.02 * s, "bpb_select": 2.5, "split": "test"})
    rep = build_report(recs, pairs=[("a", "b")], n_boot=10)
    (v,) = rep.paired
    assert v.size_a == 2e4 and v.difference.mean == pytest.approx(2.10 + 0.01 - (2.5 + 0.02), abs=1e-9)


def test_the_best_size_is_chosen_on_the_selection_split():
    """A size that is best on the scored split but not on the selection split is not reported
    as the best: the table reports the scored loss at the size the selection split chose."""
    from rltok.analysis.scaling_report import best_index, best_table, build_report

    recs = []
    for n, (test, val) in {1e4: (3.0, 3.1), 2e4: (2.9, 3.2), 4e4: (3.05, 3.0)}.items():
        for s in (0, 1):
            recs.append({"family": "flat", "budget_flops": 1e9, "target_size": n, "non_embedding_params": n,
                         "seed": s, "bpb": test + 0.01 * s, "bpb_select": val + 0.01 * s, "split": "test",
                         "width": str(int(n // 1000)), "depth": "2"})
    rep = build_report(recs, n_boot=10)
    assert rep.profiles["flat"][1e9].sizes[best_index(rep, "flat", 1e9)] == 4e4
    # the row names the chosen size's shape as its records state it
    assert "| flat | 1e+09 | 3.0550 | 40,000 | 40 × 2 | 0,1 | 3 |" in best_table(rep)


def test_a_groups_members_are_compared_on_the_seeds_their_best_sizes_share():
    def runs(fam, best_losses):
        out = [{"family": fam, "non_embedding_params": n, "budget_flops": 1e11, "seed": s, "split": "test",
                "bpb": 3.6} for n in (1e3, 4e3) for s in (0, 1, 2)]
        return out + [{"family": fam, "non_embedding_params": 2e3, "budget_flops": 1e11, "seed": s, "split": "test",
                       "bpb": v} for s, v in best_losses.items()]

    extra = runs("m1", {0: 3.0, 1: 3.0, 2: 3.0, 3: 3.3, 4: 3.3, 5: 3.3})  # verdict seeds 3-5 ran badly
    rep = build_report(extra + runs("m2", {0: 3.1, 1: 3.1, 2: 3.1}), {"g": ["m1", "m2"]}, n_boot=10)
    assert rep.choices[0].member == "m1" and rep.choices[0].loss == pytest.approx(3.0)


def test_a_groups_best_row_names_its_chosen_members_shape():
    from rltok.analysis.scaling_report import best_table, build_report

    recs = []
    for fam, loss, width in (("m1", 3.0, "32/48"), ("m2", 3.1, "16/32")):
        for n in (1e3, 2e3, 4e3):
            for s in (0, 1):
                recs.append({"family": fam, "budget_flops": 1e9, "non_embedding_params": n, "seed": s, "split": "test",
                             "bpb": loss + (0.0 if n == 2e3 else 0.5), "width": width, "depth": f"1+{int(n // 1e3)}+1"})
    table = best_table(build_report(recs, {"g": ["m1", "m2"]}, n_boot=10))
    assert "| g | 1e+09 | 3.0000 | 2,000 | 32/48 × 1+2+1 |" in table
    assert "| m2 | 1e+09 | 3.1000 | 2,000 | 16/32 × 1+2+1 |" in table


def test_the_report_says_which_split_chose_the_best_sizes():
    from rltok.analysis.scaling_report import choice_sentence

    assert "chosen on the selection split" in choice_sentence([{"bpb": 3.0, "bpb_select": 3.1}] * 2)
    # a grid without select_split chooses on the split it reports: the report must not say otherwise
    alone = choice_sentence([{"bpb": 3.0}] * 2)
    assert "chosen on the scored split itself" in alone and "optimistic" in alone and "selection split (" not in alone
    assert "1 of 2 runs" in choice_sentence([{"bpb": 3.0, "bpb_select": 3.1}, {"bpb": 3.0}])
