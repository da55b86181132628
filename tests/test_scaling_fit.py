"""The compute-optimal study's statistics and fits, on synthetic runs drawn from known laws."""

import math

import numpy as np
import pytest

from rltok.analysis.paired_stats import mean_interval, paired_difference, t_quantile
from rltok.analysis.scaling_fit import (IsoProfile, crossover, fit_envelope, fit_isoflop, fit_study, predict,
                                        profiles_from_records)

BUDGETS = [1e11, 3e11, 1e12, 3e12, 1e13]


def law(e, a, alpha, k=0.05, exp=0.5):
    return {"E": e, "A": a, "alpha": alpha, "k": k, "a": exp}


X = law(1.5, 80.0, 0.15)  # the reference family
Y = law(1.0, 1.768 * 1e12 ** 0.25, 0.25)  # equal to X at 1e12: above it before, below after
Z = law(1.2, 80.0, 0.15)  # X shifted down: never crosses it
W = law(1.0, 0.9499 * 1e15 ** 0.25, 0.25)  # crosses X near 1e15, beyond the fitted range


def loss_of(p, c):
    return p["E"] + p["A"] * c ** -p["alpha"]


def synth(family, p, budgets=BUDGETS, seeds=(0, 1, 2), noise=0.003, width=0.08, offsets=np.linspace(-1.2, 1.2, 5),
          rng_seed=0):
    """Runs at sizes around the law's optimum: loss = L*(C) + width * ln(N / N*)^2 + noise."""
    rng = np.random.default_rng(rng_seed)
    records = []
    for c in budgets:
        n_star = p["k"] * c ** p["a"]
        for f in offsets:
            for s in seeds:
                records.append({"family": family, "non_embedding_params": n_star * math.exp(f), "budget_flops": c,
                                "seed": s, "split": "test",
                                "bpb": loss_of(p, c) + width * f * f + noise * rng.standard_normal()})
    return records


@pytest.fixture(scope="module")
def study():
    records = synth("x", X) + synth("y", Y, rng_seed=1) + synth("z", Z, rng_seed=2) + synth("w", W, rng_seed=3)
    return fit_study(records, n_boot=120, seed=0)


# ---------------------------------------------------------------- paired differences

@pytest.mark.parametrize("p, df, expected", [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764),
                                             (0.975, 10, 2.2281), (0.975, 30, 2.0423), (0.95, 5, 2.0150),
                                             (0.995, 3, 5.8409), (0.975, math.inf, 1.9600), (0.6, 7, 0.2632)])
def test_t_quantiles_match_the_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-4)


def test_t_quantile_rejects_probabilities_outside_0_1():
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_paired_difference_uses_the_t_interval_of_the_per_seed_differences():
    d = paired_difference({0: 2.0, 1: 2.1, 2: 2.05, 9: 1.0}, {0: 2.1, 1: 2.2, 2: 2.14}, name_a="rl", name_b="uniform")
    assert d.seeds == (0, 1, 2)  # only shared seeds pair
    half = 4.3027 * np.std([-0.1, -0.1, -0.09], ddof=1) / math.sqrt(3)
    assert d.mean == pytest.approx(-0.29 / 3)
    assert (d.lo, d.hi) == pytest.approx((d.mean - half, d.mean + half), abs=1e-5)
    assert d.verdict == "rl below uniform"


def test_paired_difference_resolves_what_an_unpaired_rule_cannot():
    # seeds move both methods together: the means are within one seed sd, the pairs agree
    a, b = [2.00, 2.30, 2.60], [2.02, 2.325, 2.618]
    assert abs(np.mean(a) - np.mean(b)) < np.std(a, ddof=1)
    assert paired_difference(a, b).verdict == "A below B"
    assert paired_difference(b, a).verdict == "A above B"


def test_paired_difference_says_when_it_resolves_nothing():
    assert paired_difference([2.0, 2.1, 2.0], [2.05, 2.05, 2.0]).verdict == "no difference resolved"
    single = paired_difference({0: 2.0}, {0: 2.5})
    assert single.verdict == "no difference resolved" and math.isinf(single.hi)
    with pytest.raises(ValueError):
        paired_difference([1.0, 2.0], [1.0])
    mean, lo, hi = mean_interval([1.0, 2.0, 3.0])
    assert (mean, hi - mean) == pytest.approx((2.0, 4.3027 / math.sqrt(3)), abs=1e-4)


# ---------------------------------------------------------------- records

def test_records_are_read_with_fallbacks_and_checked():
    rec = {"method": "flat", "params": 1000, "budget_flops": 1e11, "seed": 0, "split": "test", "bpb": 3.0}
    profiles = profiles_from_records([rec, {**rec, "seed": 1, "bpb": 3.2}, {**rec, "params": 10, "bpb": 4.0}])
    p = profiles["flat"][1e11]
    assert list(p.sizes) == [10, 1000] and list(p.means) == pytest.approx([4.0, 3.1]) and p.seeds[1] == (0, 1)
    with pytest.raises(ValueError, match="two runs"):
        profiles_from_records([rec, dict(rec)])
    with pytest.raises(ValueError, match="several splits"):
        profiles_from_records([rec, {**rec, "seed": 1, "split": "val"}])
    assert list(profiles_from_records([rec, {**rec, "seed": 1, "split": "val"}], split="val")) == ["flat"]


# ---------------------------------------------------------------- isoFLOP fits

def test_isoflop_fits_recover_the_optimum_of_every_budget(study):
    for c, f in study["x"].isofits.items():
        assert f.interior and f.extend is None
        assert f.n_star == pytest.approx(X["k"] * c ** X["a"], rel=0.05)
        assert f.l_star == pytest.approx(loss_of(X, c), abs=0.005)
        assert f.n_star_interval[0] < f.n_star < f.n_star_interval[1]
        assert f.l_star_interval[0] < f.l_star < f.l_star_interval[1]
        assert f.resample == "seeds" and f.boot_valid == 1.0
        assert f.seed_sd == pytest.approx(0.003, rel=0.5) and f.residual_sd is not None


def _profile(offsets, seeds=(0, 1)):
    """A profile of the law X at 1e12 measured at N* * exp(offsets)."""
    recs = synth("x", X, budgets=[1e12], seeds=seeds, offsets=np.asarray(offsets), noise=0.001)
    return profiles_from_records(recs)["x"][1e12]


@pytest.mark.parametrize("offsets, side", [([0.5, 1.0, 1.5, 2.0], "smaller"), ([-2.0, -1.5, -1.0, -0.5], "larger")])
def test_an_optimum_at_the_edge_is_not_interior_and_says_where_to_extend(offsets, side):
    f = fit_isoflop(_profile(offsets), n_boot=50)
    assert not f.interior and f.extend == side


def test_a_profile_with_no_minimum_says_where_the_loss_falls():
    p = IsoProfile(1e12, np.array([1e3, 1e4, 1e5, 1e6]), tuple(np.array([v]) for v in [3.0, 2.9, 2.5, 1.0]),
                   ((0,),) * 4)
    f = fit_isoflop(p, n_boot=20)
    assert not f.parabola.convex and math.isnan(f.n_star) and f.extend == "larger"
    assert f.resample == "residuals"


# ---------------------------------------------------------------- envelopes

def test_the_envelope_recovers_the_law(study):
    env = study["x"].envelope
    assert env.params.alpha == pytest.approx(X["alpha"], abs=0.03)
    assert env.params.e == pytest.approx(X["E"], abs=0.15)
    assert env.params.a == pytest.approx(X["a"], abs=0.02)
    assert math.exp(env.params.log_k) * 1e12 ** env.params.a == pytest.approx(X["k"] * 1e12 ** 0.5, rel=0.05)
    for name in ("E", "alpha", "a", "A", "k"):
        lo, hi = env.intervals[name]
        assert lo < hi
    assert env.intervals["alpha"][0] < env.params.alpha < env.intervals["alpha"][1]
    assert env.boot_failed == 0 and len(env.boot.e) == 120
    assert env.e_fixed is None and "E fitted" in env.note and not env.alpha_at_bound


def test_E_can_be_fixed_and_the_result_says_so():
    law0 = law(0.0, 80.0, 0.15)
    recs = synth("x", law0, budgets=BUDGETS[:3])  # three budgets: E would be barely determined
    env = fit_envelope("x", profiles_from_records(recs)["x"], n_boot=50, fix_e=0.0)
    assert env.e_fixed == 0.0 and "E fixed at 0" in env.note
    assert np.all(np.asarray(env.boot.e) == 0.0)
    assert env.params.alpha == pytest.approx(0.15, abs=0.01)
    with pytest.raises(ValueError, match="too few"):
        fit_envelope("x", profiles_from_records(synth("x", law0, budgets=BUDGETS[:2]))["x"], n_boot=5)


def test_the_bootstrap_is_deterministic_for_a_seed():
    profiles = profiles_from_records(synth("x", X))["x"]
    a = fit_envelope("x", profiles, n_boot=30, seed=7)
    b = fit_envelope("x", profiles, n_boot=30, seed=7)
    c = fit_envelope("x", profiles, n_boot=30, seed=8)
    assert np.array_equal(a.boot.alpha, b.boot.alpha) and a.intervals == b.intervals
    assert not np.array_equal(a.boot.alpha, c.boot.alpha)
    f1, f2 = fit_isoflop(profiles[1e12], n_boot=30, seed=3), fit_isoflop(profiles[1e12], n_boot=30, seed=3)
    assert f1.n_star_interval == f2.n_star_interval


# ---------------------------------------------------------------- crossovers

def test_a_crossover_inside_the_range_is_found_with_its_interval(study):
    x = crossover(study["x"].envelope, study["y"].envelope)
    assert x.c_cross == pytest.approx(1e12, rel=0.3)
    assert x.interval[0] <= x.c_cross <= x.interval[1] and x.fraction > 0.9
    assert x.lower_first == "x" and "cross at" in x.verdict


def test_no_crossover_within_the_range_but_one_extrapolated(study):
    parallel = crossover(study["x"].envelope, study["z"].envelope, below=3e18)
    assert parallel.crossings == () and parallel.verdict.startswith("no crossover within the fitted range")
    assert parallel.crossings_below == () and parallel.fraction_below < 0.1
    beyond = crossover(study["x"].envelope, study["w"].envelope, below=3e18)
    assert beyond.crossings == () and beyond.fraction < 0.1
    assert beyond.crossings_below[0] == pytest.approx(1e15, rel=1.0)
    assert beyond.fraction_below > 0.5 and "and 3e+18" in beyond.verdict_below


def test_a_crossing_inside_the_range_is_never_called_extrapolated(study):
    x = crossover(study["x"].envelope, study["y"].envelope, below=3e18)
    assert x.crossings and x.crossings_below == ()  # the one crossing, at 1e12, is in range
    assert x.verdict_below.startswith("the extrapolated fits do not cross between 1e+13 and 3e+18")


# ---------------------------------------------------------------- predictions

def test_a_held_out_budget_is_predicted():
    records = synth("x", X, budgets=BUDGETS + [1e14])
    fits = fit_study(records, budgets=BUDGETS, n_boot=200)  # 1e14 held out
    pred = predict(fits["x"].envelope, 1e14)
    assert pred.extrapolation == pytest.approx(10.0)
    assert pred.n_star == pytest.approx(X["k"] * 1e14 ** 0.5, rel=0.1)
    assert pred.l_star == pytest.approx(loss_of(X, 1e14), abs=0.03)
    assert pred.n_star_interval[0] < pred.n_star < pred.n_star_interval[1]


# ---------------------------------------------------------------- plots

def test_plots_are_written(study, tmp_path):
    pytest.importorskip("matplotlib")
    from rltok.analysis.scaling_plots import plot_study

    x = crossover(study["x"].envelope, study["y"].envelope)
    paths = plot_study(study, tmp_path / "plots", extend_to=1e14, crossings=list(x.crossings))
    names = sorted(p.name for p in paths)
    assert names == ["envelopes.png", "isoflop_w.png", "isoflop_x.png", "isoflop_y.png", "isoflop_z.png",
                     "optimal_sizes.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_without_matplotlib_a_plot_says_what_is_missing(study, tmp_path, monkeypatch):
    import sys

    from rltok.analysis import scaling_plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(RuntimeError, match="need matplotlib"):
        scaling_plots.plot_envelopes([study["x"].envelope], tmp_path)


def test_single_seed_points_bootstrap_residuals_and_thin_budgets_are_left_out():
    records = synth("x", X, seeds=(0,)) + synth("x", X, budgets=[3e13], seeds=(0,), offsets=np.array([-1.0, 1.0]))
    fit = fit_study(records, n_boot=60)["x"]
    assert 3e13 not in fit.isofits and fit.envelope.excluded == (3e13,)
    assert fit.envelope.resample == "residuals" and all(f.resample == "residuals" for f in fit.isofits.values())
    assert fit.envelope.params.alpha == pytest.approx(X["alpha"], abs=0.05)
    assert all(f.seed_sd is None for f in fit.isofits.values())


def test_the_best_size_is_the_lowest_mean_choice_loss_with_ties_to_the_smaller():
    from rltok.analysis.scaling_fit import best_by_choice

    def rec(fam, n, seed, test, val=None):
        r = {"family": fam, "non_embedding_params": n, "seed": seed, "bpb": test, "target_size": n}
        return r if val is None else {**r, "bpb_select": val}

    records = [rec("a", 1e4, 0, 3.0, 3.3), rec("a", 1e4, 1, 3.0, 3.3),  # best on test, not on val
               rec("a", 2e4, 0, 3.2, 3.1), rec("a", 2e4, 1, 3.2, 3.2),
               rec("b", 1e4, 0, 2.0), rec("b", 3e4, 0, 2.0),  # a tie: the smaller
               rec("c", 1e4, 0, None, None), rec("c", 5e4, 0, 9.0)]  # a diverged run is no candidate
    assert best_by_choice(records) == {"a": 2e4, "b": 1e4, "c": 5e4}
    assert best_by_choice(records, key=lambda r: -r["target_size"])["b"] == -3e4


def test_extra_seeds_at_one_size_never_move_the_choice_of_the_best_size():
    """The optimum's and the verdicts' extra seeds: the sizes are compared on the seeds they all ran."""
    from rltok.analysis.scaling_fit import best_by_choice, best_size_index, profiles_from_records

    def rec(n, seed, loss):
        return {"family": "a", "non_embedding_params": n, "seed": seed, "bpb": loss, "budget_flops": 1e9}

    # on seeds 0 and 1, 2e4 is best (3.00 vs 3.05); its extra seeds are bad, so its mean over all
    # its seeds (3.10) is worse than 1e4's (3.05): the choice stays 2e4
    records = [rec(1e4, 0, 3.05), rec(1e4, 1, 3.05), rec(2e4, 0, 3.0), rec(2e4, 1, 3.0),
               rec(2e4, 2, 3.2), rec(2e4, 3, 3.2), rec(4e4, 0, 3.3), rec(4e4, 1, 3.3)]
    assert best_by_choice(records) == {"a": 2e4}
    profile = profiles_from_records(records)["a"][1e9]
    assert best_size_index(profile) == 1 and profile.means[1] == pytest.approx(3.1)
    # sizes that share no seed: each its own mean
    assert best_by_choice([rec(1e4, 0, 3.0), rec(2e4, 1, 2.9)]) == {"a": 2e4}


# ---------------------------------------------------------------- choices and resampling, per budget

def _profile_of(budget, cells):
    """An IsoProfile from {size: {seed: loss}}."""
    sizes = sorted(cells)
    return IsoProfile(budget, np.array(sizes, dtype=float), tuple(np.array([cells[n][s] for s in sorted(cells[n])])
                                                                  for n in sizes),
                      tuple(tuple(sorted(cells[n])) for n in sizes))


def test_extra_seeds_at_one_size_never_move_the_best_size_or_the_interior_verdict():
    # over all their seeds the means are 1.000, 1.005, 1.050: the smallest size would look best
    cells = {1e5: {0: 1.00, 1: 1.00}, 2e5: {0: 0.95, 1: 0.95, 2: 1.06, 3: 1.06}, 4e5: {0: 1.05, 1: 1.05}}
    f = fit_isoflop(_profile_of(1e12, cells), n_boot=0)
    assert f.best_size == 2e5 and f.interior  # on the seeds every size ran, 2e5 is best
    assert fit_isoflop(_profile_of(1e12, {1e5: {0: 1.0}, 2e5: {0: 0.9}, 4e5: {0: 1.1}}), n_boot=0).interior


def test_the_choice_split_decides_what_is_interior_and_the_reported_split_only_reports():
    records = []
    for c in (3e11, 1e12, 3e12):
        n_star = X["k"] * c ** X["a"]
        for f in (-1.0, 0.0, 1.0):
            for s in (0, 1):
                val = loss_of(X, c) + 0.08 * f * f + 0.001 * s
                test = val - 0.12 * f  # on test alone the largest size would look best
                records.append({"family": "x", "non_embedding_params": n_star * math.exp(f), "budget_flops": c,
                                "seed": s, "split": "test", "bpb": test, "bpb_select": val})
    fit = fit_study(records, n_boot=20, interior_only=True)["x"]
    assert all(f.interior for f in fit.isofits.values())
    assert all(f.best_size == pytest.approx(X["k"] * c ** X["a"]) for c, f in fit.isofits.items())
    assert list(fit.envelope.budgets) == [3e11, 1e12, 3e12] and fit.envelope.excluded == ()
    test_only = fit_study([{k: v for k, v in r.items() if k != "bpb_select"} for r in records], n_boot=0,
                          interior_only=True)["x"]
    assert not any(f.interior for f in test_only.isofits.values())  # the same runs read on test alone


def test_one_lost_seed_changes_only_its_own_budgets_resampling():
    records = synth("x", X, budgets=[3e11, 1e12, 3e12], seeds=(0, 1), offsets=np.array([-1.0, 0.0, 1.0]))
    lost = [r for r in records if not (r["budget_flops"] == 3e12 and r["seed"] == 1
                                      and r["non_embedding_params"] > X["k"] * 3e12 ** X["a"] * 2)]
    whole, part = fit_study(records, n_boot=200)["x"], fit_study(lost, n_boot=200)["x"]
    assert [f.resample for f in part.isofits.values()] == ["seeds", "seeds", "pooled"]
    assert part.envelope.resample == "pooled, seeds" and whole.envelope.resample == "seeds"
    for fit in (whole, part):
        lo, hi = fit.envelope.intervals["alpha"]
        assert hi - lo > 1e-3  # a single seed at three sizes must not collapse every interval to a point
        assert all(f.l_star_interval[1] - f.l_star_interval[0] > 1e-4 for f in fit.isofits.values())
    alone = fit_isoflop(_profile_of(1e12, {1e5: {0: 1.0}, 2e5: {0: 0.9}, 4e5: {0: 1.1}}), n_boot=50)
    assert alone.resample == "unavailable" and all(math.isnan(v) for v in alone.l_star_interval)
