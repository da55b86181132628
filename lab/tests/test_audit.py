"""The audit's statistics on cases with known answers, and its reading of the tracked records."""

import dataclasses
import math

import pytest

from rltok_lab import audit
from rltok_lab.audit import Cell, Verdict, holm, interpolated, p_value, trend


def _verdict(p):
    return Verdict("c", 1e12, "a", "b", 3, 0.1, 0.0, 0.2, p, "charged")


def test_holm_matches_the_step_down_rule():
    # sorted p: 0.01, 0.02, 0.03, 0.5 -> 4*0.01, 3*0.02, max(2*0.03, prev), max(1*0.5, prev)
    out = holm([_verdict(p) for p in (0.03, 0.5, 0.01, 0.02)])
    assert [round(v.p_holm, 6) for v in out] == [0.06, 0.5, 0.04, 0.06]
    assert [v.resolved for v in out] == [False, False, True, False]


def test_holm_is_monotone_and_capped_at_one():
    out = holm([_verdict(p) for p in (0.4, 0.3, 0.9)])
    assert all(v.p_holm <= 1.0 for v in out)
    assert out[1].p_holm >= out[1].p


def test_p_value_of_a_one_sample_t():
    # mean 1, sd sqrt(2/3), n 4 -> t = sqrt(6) = 2.449, df 3: two-sided p = 0.0917
    assert p_value([0.0, 1.0, 1.0, 2.0]) == pytest.approx(0.0917, abs=5e-4)
    assert p_value([0.5]) == 1.0


def _cell(budget, ratio, test):
    return Cell("f", budget, 1.0, test, 1.0, 1.0, 100, None, None, ratio, 0, 0.0)


def test_interpolation_is_linear_in_log_flops_on_shared_seeds():
    cells = {1e12: _cell(1e12, 1.0, {0: 3.0, 1: 3.2, 2: 9.9}), 1e13: _cell(1e13, 1.0, {0: 2.0, 1: 2.2})}
    at = interpolated(cells, math.sqrt(1e12 * 1e13))
    assert at == pytest.approx({0: 2.5, 1: 2.7})
    assert interpolated(cells, 2e13) is None and interpolated(cells, 5e11) is None
    # the kernel ratio moves each point: at 1.5x, 1e12's point sits at 1.5e12
    shifted = {b: _cell(b, 1.5, c.test) for b, c in cells.items()}
    assert interpolated(shifted, 1.5e12) == pytest.approx({0: 3.0, 1: 3.2})


def test_trend_recovers_a_known_slope():
    cells = [{"steps": s, "gap": 0.5 - 0.1 * math.log10(s)} for s in (100, 300, 1000, 3000)]
    t = trend(cells, "x")
    assert t.slope == pytest.approx(-0.1) and t.se == pytest.approx(0.0, abs=1e-12)
    assert trend(cells[:2], "x") is None


def test_the_tracked_records_read_as_the_report_says():
    study = audit.load_study()
    # every corpus has every study family at 3e12 and the held-out budget
    for corpus in audit.CORPORA:
        assert {"rl", "uniform", "flat", "flat_ngram", "bpe4096"} <= set(study.cells[corpus][3e12])
        assert {"rl", "uniform", "flat"} <= set(study.cells[corpus][1e13])
    charged = holm([v for v in audit.budget_verdicts(study) if v.flops == "charged" and v.n])
    learned = [v for v in charged if v.a in ("rl", "rl_r0.1")]
    assert learned and not any(v.resolved for v in learned)
    trends = {t.label: t for t in audit.steps_trends(study)}
    rest = trends["without each budget's largest rung"]
    assert rest.lo < 0 < rest.hi  # no trend once the largest rungs are apart
    assert trends["every matched cell"].hi < 0
    equal = [v for v in audit.equal_params_verdicts(study) if v.n]
    assert equal and all(v.mean > 0 for v in equal)  # at equal parameters BPE tokens lead


def test_splice_needs_its_markers(tmp_path):
    from rltok.config import ConfigError

    doc = tmp_path / "A.md"
    doc.write_text("head\n<!-- audit:begin -->\nold\n<!-- audit:end -->\ntail\n")
    audit.splice(doc, "new table\n")
    assert doc.read_text() == "head\n<!-- audit:begin -->\n\nnew table\n\n<!-- audit:end -->\ntail\n"
    doc.write_text("no markers")
    with pytest.raises(ConfigError, match="audit:begin"):
        audit.splice(doc, "x")


def test_a_grid_study_reads_its_folder_and_leaves_out_uncommitted_runs(tmp_path):
    import json

    from rltok.analysis.scaling import load_grid

    grid_file = tmp_path / "grid.toml"
    grid_file.write_text('budgets = [1e10]\nseeds = [0, 1]\npreset = "tiny"\nsplit = "test"\nsize_rule = {coef = 0.02, exponent = 0.5, span = 2.5, points = 3}\n'
                         'groups = {g = ["a"]}\ncrossovers = [["a", "b"], ["g", "b"]]\n'
                         '[corpora]\nc = "data/c"\n[[families]]\nname = "a"\nmethod = "uniform"\n'
                         '[[families]]\nname = "b"\nmethod = "flat"\n')
    grid = load_grid(grid_file)
    folder = tmp_path / "out" / "c"
    folder.mkdir(parents=True)
    base = {"budget_flops": 1e10, "split": "test", "params": 10, "state_mb": 1.0, "steps": 5,
            "forward_flops_per_byte": 1.0, "forward_flops_per_byte_kernel": 1.2, "point_kind": "ladder"}
    losses = {("a", 0): 2.0, ("a", 1): 2.1, ("b", 0): 2.5, ("b", 1): 2.4}
    for (fam, seed), bpb in losses.items():
        rec = {**base, "family": fam, "method": fam, "seed": seed, "bpb": bpb, "bpb_select": bpb,
               "non_embedding_params": 100, "commit": "abc1234"}
        (folder / f"C1e10__{fam}__N100__s{seed}.json").write_text(json.dumps(rec))
    # a run from a dirty tree would make a's mean far lower: it must not count
    dirty = {**base, "family": "a", "method": "a", "seed": 2, "bpb": 0.1, "bpb_select": 0.1,
             "non_embedding_params": 100, "commit": "abc1234+dirty", "excluded": "uncommitted code"}
    (folder / "C1e10__a__N100__s2.json").write_text(json.dumps(dirty))
    study = audit.grid_study(grid, tmp_path / "out")
    cell = study.cells["c"][1e10]["a"]
    assert cell.test == {0: 2.0, 1: 2.1} and cell.kernel_ratio == pytest.approx(1.2)
    charged = [v for v in audit.budget_verdicts(study) if v.flops == "charged"]
    assert [(v.a, v.b, v.n) for v in charged] == [("a", "b", 2), ("g", "b", 2)]
    assert charged[0].mean == pytest.approx(-0.4)
    text = audit.grid_report(grid, tmp_path / "out")
    assert "Runs from uncommitted code left out: c 1." in text and "| c | 1e10 | a |" in text


def test_complete_only_reads_a_budget_once_nothing_is_left_to_run_there(tmp_path, capsys):
    from rltok.analysis.scaling import load_grid
    from rltok_lab.cli import main as lab_main
    from rltok_lab.scaling_status import holdout_status, study_status
    from tiny_study import tiny_study

    def complete(grid, out):
        return audit.complete_budgets(study_status(load_grid(grid), out), holdout_status(load_grid(grid), out))

    grid, out = tiny_study(tmp_path)
    capsys.readouterr()
    assert complete(grid, out) == {"salad": [3e8]}
    text = audit.grid_report(load_grid(grid), out, complete_only=True)
    assert "Budgets read below, those with nothing left to run: salad: 3e08." in text
    assert "| salad | 3e08 | uniform − flat | charged | 2 |" in text
    ref = audit.grid_report(load_grid(grid), out, complete_only=True, references=["flat"])
    assert "## In the reference's form: against flat" in ref and "| salad | 3e08 | flat |" in ref
    # one run missing: the budget is read nowhere, and the status says what is left
    next((out / "salad").glob("C*__uniform__*__s1.json")).unlink()
    assert complete(grid, out) == {"salad": []}
    doc = tmp_path / "RIVALS.md"
    doc.write_text("intro\n<!-- audit:begin -->\n<!-- audit:end -->\n")
    assert lab_main(["audit", "--grid", str(grid), "--out", str(out), "--complete-only", "--splice", str(doc)]) == 0
    text = doc.read_text()
    assert "salad: none yet" in text and "| salad | C3e08 | 11/12 |" in text
    assert "uniform − flat | charged | 2" not in text
    assert lab_main(["audit", "--complete-only"]) != 0 and "goes with --grid" in capsys.readouterr().err
    assert lab_main(["audit", "--reference", "rl"]) != 0 and "goes with --grid" in capsys.readouterr().err


def test_a_rule_that_cuts_with_lookahead_is_named_at_every_row():
    def rec(model):
        return {"config": {"model": model}}

    assert audit.reads_ahead(rec({"arch": "hourglass", "chunker": {"kind": "bpe"}}))
    assert audit.reads_ahead(rec({"chunker": "bpe"}))  # a saved config's older spelling
    assert not audit.reads_ahead(rec({"arch": "hourglass", "chunker": {"kind": "rl"}}))
    assert not audit.reads_ahead(rec({"arch": "bpe_token"})) and not audit.reads_ahead({})
    cells = {"bpe": Cell("bpe", 1e12, 1.0, {0: 2.0, 1: 2.1}, 1.0, 1.0, 100, 0.2, 0.9, 1.0, 0, 2.0, None, True),
             "rl": Cell("rl", 1e12, 1.0, {0: 2.2, 1: 2.2}, 1.0, 1.0, 100, 0.2, 0.7, 1.0, 0, 2.2)}
    study = audit.Study({"c": {1e12: cells}}, {"c": []}, (1e12,), groups={}, pairs=(("bpe", "rl"),))
    (charged, _kernel) = audit.budget_verdicts(study)
    assert "bpe cut reading bytes ahead" in charged.note
    assert "| c | 1e12 | bpe | 1 | 1 | 1.0 | 100 | 2.050 ± 0.071 (2) | 0.200 | 0.90 | 1.00 | no | yes | 0 |" in \
        audit.cells_table(study, (1e12,))


def test_complete_budgets_read_the_status_rows_and_leave_out_what_cannot_be_told():
    status = [{"corpus": "a", "budget": 1e11, "complete": True}, {"corpus": "a", "budget": 3e11, "complete": False},
              {"corpus": "b", "budget": 1e11, "complete": None}]  # None: b's data could not be read
    held = [{"corpus": "a", "budget": 1e12, "done": 3, "planned": 3},
            {"corpus": "b", "budget": 1e12, "done": 1, "planned": 3}]
    assert audit.complete_budgets(status, held) == {"a": [1e11, 1e12], "b": []}
    assert audit.complete_budgets(status, [{"corpus": "a", "budget": 1e12, "done": 0, "planned": 0}])["a"] == [1e11]


def test_a_pooled_verdict_names_the_budgets_it_pools_not_the_grids():
    """A grid of four budgets with two read: the cell-mean row says 3e11-6e11, not 3e11-3e12."""
    def cell(family, budget, loss):
        return Cell(family, budget, 1.0, {0: loss, 1: loss + 0.01}, 1.0, 1.0, 100, 0.2, 0.5, 1.0, 0, loss)

    by_budget = {b: {"a": cell("a", b, 2.0 + d), "b": cell("b", b, 2.1)} for b, d in ((3e11, 0.0), (6e11, 0.02))}
    study = audit.Study({"c": by_budget}, {"c": []}, (3e11, 6e11, 1e12, 3e12), groups={}, pairs=(("a", "b"),))
    pooled = [v for v in audit.budget_verdicts(study) if isinstance(v.budget, str)]
    # one cell-mean row under each FLOP count
    assert [(v.budget, v.n, v.flops) for v in pooled] == [("3e11-6e11 (cell means)", 2, "charged"),
                                                         ("3e11-6e11 (cell means)", 2, "kernel")]
    assert pooled[0].mean == pytest.approx(-0.09)
    # the kernel readings draw on neighbouring budgets' cells: their pooled mean has no interval and no p
    assert math.isnan(pooled[1].lo) and math.isnan(pooled[1].p) and "share cells" in pooled[1].note
    table = audit.verdicts_table(audit.budget_verdicts(study))
    assert "| c | 3e11-6e11 (cell means) | a − b | kernel | 2 |" in table and "— | — | — | — | — | the budgets'" in table


def test_the_corrected_interval_widens_the_t_interval_to_the_tables_joint_level():
    from rltok.analysis.paired_stats import t_quantile

    v = Verdict("c", 1e12, "a", "b", 3, 0.10, 0.05, 0.15, 0.01, "charged")
    assert audit.corrected_interval(v, 1) == pytest.approx((0.05, 0.15))  # one verdict: its own interval
    lo, hi = audit.corrected_interval(v, 60)
    widen = t_quantile(1 - 0.05 / 120, 2) / t_quantile(0.975, 2)
    assert (lo, hi) == pytest.approx((0.10 - 0.05 * widen, 0.10 + 0.05 * widen)) and widen > 5
    assert all(math.isnan(x) for x in audit.corrected_interval(Verdict("c", 1e12, "a", "b", 1, 0.1, -math.inf,
                                                                           math.inf, 1.0, "charged"), 60))
    table = audit.verdicts_table([v, Verdict("c", 3e12, "a", "b", 0, math.nan, math.nan, math.nan, 1.0, "kernel")])
    head, rule, read, unread = table.splitlines()
    assert "| corrected interval |" in head and "m = 1)" in head
    assert head.count("|") == rule.count("|") == read.count("|") == unread.count("|")
    assert "| [+0.050, +0.150] | [+0.050, +0.150] |" in read


def test_the_reference_form_pairs_each_rule_with_the_reference_and_corrects_over_its_own_rows():
    """Every family the crossovers pair with the reference (a group by its members), at each corpus's
    own budgets, with Holm and the corrected interval taken over this table's verdicts alone."""
    def cell(family, budget, losses, **kw):
        return Cell(family, budget, 100.0, dict(enumerate(losses)), 120.0, 0.5, 10, 0.2, 0.6, 1.0, 0, losses[0], **kw)

    docs = {1e12: {"ref": cell("ref", 1e12, [3.0, 3.1, 3.2]), "a": cell("a", 1e12, [2.9, 3.05, 3.1]),
                   "m1": cell("m1", 1e12, [3.5, 3.6, 3.7]), "m2": cell("m2", 1e12, [3.3, 3.3, 3.4]),
                   "x": cell("x", 1e12, [1.0, 1.0, 1.1])},  # x is paired with nothing: no row
            3e12: {"ref": cell("ref", 3e12, [2.0, 2.1]), "a": cell("a", 3e12, [2.2, 2.2])}}
    code = {1e12: {"ref": cell("ref", 1e12, [1.0, 1.1]),
                   "a": cell("a", 1e12, [0.9, 1.0], reads_ahead=True, fitted_outside=4e6),
                   "m1": dataclasses.replace(cell("m1", 1e12, [1.2, 1.3]), test={5: 1.2, 6: 1.3})}}
    study = audit.Study({"docs": docs, "code": code}, {"docs": [], "code": []}, (1e12, 3e12), groups={"g": ("m1", "m2")},
                        pairs=(("a", "ref"), ("ref", "g"), ("m1", "m2")))  # a pair either way round
    text = audit.reference_form(study, "ref", {"docs": [1e12], "code": [1e12]})
    head, rule, *rows = text.splitlines()
    # the family: 3 rules x 2 corpora planned, 4 read (m1 on code shares no seed, m2 never ran there)
    assert "| − ref |" in head and "m = 6 at 1e12 (4 read))" in head and head.count("|") == rule.count("|")
    assert all(r.count("|") == head.count("|") for r in rows)
    assert [r.split(" | ")[2] for r in rows] == ["a", "ref", "m2", "m1", "a", "ref", "m1"]  # by corpus, then bpb
    assert "| no shared seed | — | — | — |" in rows[6]
    assert "| reference | — | — | — |" in rows[1] and "| x |" not in text and "3e12" not in text
    (m1,) = [r for r in rows if r.startswith("| docs | 1e12 | m1 |")]
    v = Verdict("docs", 1e12, "m1", "ref", *audit.paired(docs[1e12]["m1"].test, docs[1e12]["ref"].test), "charged")
    lo, hi = audit.corrected_interval(v, 6)
    assert f"| +0.500 | [{lo:+.3f}, {hi:+.3f}] |" in m1
    # Holm over the budget's six planned verdicts, the two not read as p = 1, in the p column, and "resolved" from it
    vs = [Verdict(c, 1e12, f, "ref", *audit.paired(cells[1e12][f].test, cells[1e12]["ref"].test), "charged")
          for c, cells, fams in (("docs", docs, ("a", "m1", "m2")), ("code", code, ("a",))) for f in fams]
    unread = [Verdict("", 1e12, "", "", 0, math.nan, math.nan, math.nan, 1.0, "charged")] * 2
    for v in holm(vs + unread)[:4]:
        (row,) = [r for r in rows if r.startswith(f"| {v.corpus} | 1e12 | {v.a} |")]
        assert f"| {v.p_holm:.3f} | {'yes' if v.resolved else 'no'} |" in row
    with pytest.raises(audit.ConfigError, match="no pair"):
        audit.reference_form(study, "x", (1e12,))
    assert "cuts read ahead; tokenizer fitted outside the budget on 4.0M bytes" in rows[4]
    # the same budgets for every corpus, as cells_table takes them
    assert "| code | 3e12 |" not in audit.reference_form(study, "ref", (1e12, 3e12))
    assert "| docs | 3e12 | a |" in audit.reference_form(study, "ref", (1e12, 3e12))


def test_interpolation_through_three_cells_is_exact_on_a_parabola_in_log_flops():
    """Loss is convex in log FLOPs, so a chord overstates it between two cells; through three cells
    the reading is exact on a parabola, and the trio nearest the point is used."""
    def loss(x):
        u = math.log10(x) - 12
        return 2.0 - 0.3 * u + 0.1 * u * u
    budgets = (3e11, 6e11, 1e12, 3e12)
    cells = {b: _cell(b, 1.1, {0: loss(b * 1.1), 1: loss(b * 1.1) + 0.05}) for b in budgets}
    for x in (4e11, 8e11, 2e12):
        assert interpolated(cells, x) == pytest.approx({0: loss(x), 1: loss(x) + 0.05}, abs=1e-12)
    # with a cubic term the trio matters: the one reaching least far from the point is used
    def cubic(x):
        u = math.log10(x) - 12
        return loss(x) + 0.2 * u ** 3
    cub = {b: _cell(b, 1.0, {0: cubic(b)}) for b in budgets}

    def through(trio, x):  # the parabola through three cells, at x
        u = [math.log(b) for b in trio]
        return sum(cubic(b) * math.prod((math.log(x) - u[k]) / (u[j] - u[k]) for k in range(3) if k != j)
                   for j, b in enumerate(trio))
    # 7e11 lies in [6e11, 1e12]: (3e11, 6e11, 1e12) reaches 0.37 decades from it, (6e11, 1e12, 3e12) 0.63
    assert interpolated(cub, 7e11)[0] == pytest.approx(through((3e11, 6e11, 1e12), 7e11), abs=1e-12)
    assert interpolated(cub, 7e11)[0] != pytest.approx(through((6e11, 1e12, 3e12), 7e11), abs=1e-6)
    assert interpolated(cub, 1e12)[0] == pytest.approx(cubic(1e12))  # on a cell: the cell
    two = {b: cells[b] for b in (3e11, 1e12)}
    chord = interpolated(two, 6e11)[0]
    assert chord > loss(6e11)  # the bias the parabola removes
    assert interpolated(cells, 3e11) is None and interpolated(cells, 3.4e12) is None  # below 3.3e11, above 3.3e12


def test_the_kernel_reading_reads_either_side_at_the_others_point_and_never_a_held_out_cell():
    def cell(family, budget, ratio, base):
        return Cell(family, budget, 1.0, {0: base - 0.1 * math.log10(budget), 1: base + 0.01 - 0.1 * math.log10(budget)},
                    1.0, 1.0, 100, None, None, ratio, 0, 0.0, choice_seeds=(0, 1))
    budgets = (3e11, 6e11, 1e12, 1e13)
    by_budget = {b: {"a": cell("a", b, 1.20, 3.0), "b": cell("b", b, 1.10, 3.05)} for b in budgets}
    study = audit.Study({"c": by_budget}, {"c": []}, budgets, held_out=(1e13,), groups={}, pairs=(("a", "b"),))
    kernel = {v.budget: v for v in audit.budget_verdicts(study) if v.flops == "kernel"}
    assert kernel[3e11].n == 2 and kernel[3e11].note == "b at 3.60e11"
    # at 1e12 a's point (1.2e12) lies above b's fitted cells (up to 1.1e12); the held-out cell may not
    # bracket a fitted budget's reading, so a is read at b's point instead
    assert kernel[1e12].n == 2 and kernel[1e12].note == "a at 1.10e12"
    assert kernel[1e13].note == "a at 1.10e13" and kernel[1e13].n == 2  # the held-out budget reads every cell
    assert kernel[1e13].mean == pytest.approx(-0.05 - 0.1 * math.log10(1.1 / 1.2), abs=1e-9)
    (pooled,) = [v for v in audit.budget_verdicts(study) if v.flops == "kernel" and isinstance(v.budget, str)]
    assert pooled.budget == "3e11-1e12 (cell means)" and pooled.n == 3  # the held-out budget is never pooled
    # a's law in kernel FLOPs lies 0.05 + 0.1 log10(1.2 / 1.1) below b's (each law is one in its own
    # budget, shifted by its ratio); linear in log FLOPs, so chord and parabola agree here
    for budget in (3e11, 1e12):
        assert kernel[budget].mean == pytest.approx(-0.05 - 0.1 * math.log10(1.1 / 1.2), abs=1e-9)
    # one budget alone: neither point lies between two cells of the other family
    lone = audit.Study({"c": {3e11: by_budget[3e11]}}, {"c": []}, (3e11,), groups={}, pairs=(("a", "b"),))
    (v,) = [v for v in audit.budget_verdicts(lone) if v.flops == "kernel"]
    assert v.n == 0 and "not read" in v.note


def test_a_diverged_record_without_a_commit_is_not_counted_as_uncommitted():
    assert not audit.is_dirty({"bpb": None, "diverged": "nan loss"})
    assert audit.is_dirty({"bpb": 2.0}) and audit.is_dirty({"bpb": 2.0, "commit": "abc+dirty"})
    assert not audit.is_dirty({"bpb": 2.0, "commit": "abc"}) and audit.is_dirty({"bpb": None, "commit": "abc+dirty"})


def _rec(family, n, seed, bpb, select=True):
    r = {"family": family, "method": family, "budget_flops": 1e12, "non_embedding_params": n, "seed": seed,
         "bpb": bpb, "params": n, "steps": 10, "commit": "abc"}
    return {**r, "bpb_select": bpb} if select else r


def test_a_cell_knows_the_seeds_that_chose_its_size_and_refuses_records_a_choice_would_misread():
    runs = [_rec("f", 100, s, 2.0 + s * 0.01) for s in (0, 1)] + [_rec("f", 200, s, 1.9 + s * 0.01) for s in (0, 1, 2)]
    (cell,) = audit.chosen_cells(runs, 1e12).values()
    assert cell.size == 200 and cell.choice_seeds == (0, 1) and cell.fresh == {2: pytest.approx(1.92)}
    assert cell.choice == pytest.approx(1.905)  # over the seeds every size ran, not seed 2
    with pytest.raises(audit.ConfigError, match="two records of f N=200 seed 1"):
        audit.chosen_cells([*runs, _rec("f", 200, 1, 1.0)], 1e12)
    with pytest.raises(audit.ConfigError, match="no selection-split loss"):
        audit.chosen_cells([*runs, _rec("f", 300, 0, 1.0, select=False)], 1e12)


def test_the_reference_form_corrects_each_budget_apart_and_shows_the_fresh_seeds():
    def cell(family, budget, losses):
        return Cell(family, budget, 100.0, dict(enumerate(losses)), 120.0, 0.5, 10, 0.2, 0.6, 1.0, 0, losses[0],
                    choice_seeds=(0, 1))
    cells = {b: {"ref": cell("ref", b, [2.0, 2.1, 2.2]), "a": cell("a", b, [2.1, 2.15, 2.5]),
                 "b": cell("b", b, [1.9, 2.0, 2.05])} for b in (1e12, 3e12)}
    study = audit.Study({"c": cells}, {"c": []}, (1e12, 3e12), groups={}, pairs=(("a", "ref"), ("b", "ref")))
    one = audit.reference_form(study, "ref", (1e12,))
    both = audit.reference_form(study, "ref", (1e12, 3e12))
    assert "m = 2 at 1e12)" in one.splitlines()[0] and "m = 2 at 1e12, 2 at 3e12)" in both.splitlines()[0]
    # a later budget's rows leave an earlier budget's reading as it was
    rows_1e12 = [r for r in both.splitlines() if r.startswith("| c | 1e12 |")]
    assert rows_1e12 == [r for r in one.splitlines() if r.startswith("| c | 1e12 |")]
    (a,) = [r for r in rows_1e12 if r.startswith("| c | 1e12 | a |")]
    assert "| +0.300 (1) |" in a  # seed 2 alone: 2.5 - 2.2


def test_a_budgets_family_is_every_corpus_so_a_corpus_arriving_later_only_lowers_the_earlier_ones_p():
    """docs reaches 3e12 first: its 3e12 rows are corrected over the 3e12 rows of both corpora, code's
    not yet read counting as p = 1; when code's arrive the docs rows' Holm p can only fall. code's 1e12
    rows, shown while docs has moved on, are still corrected together with docs' 1e12 rows."""
    def cell(family, budget, losses):
        return Cell(family, budget, 100.0, dict(enumerate(losses)), 120.0, 0.5, 10, 0.2, 0.6, 1.0, 0, losses[0],
                    choice_seeds=(0, 1))
    def corpus(shift):
        return {b: {"ref": cell("ref", b, [2.0, 2.1, 2.2]), "a": cell("a", b, [2.2 + shift, 2.25 + shift, 2.41 + shift]),
                    "b": cell("b", b, [2.05, 2.16, 2.24])} for b in (1e12, 3e12)}
    docs, code = corpus(0.0), corpus(0.01)

    def holm_p(table, row):
        (line,) = [r for r in table.splitlines() if r.startswith(row)]
        return float(line.split(" | ")[11])
    early = audit.Study({"docs": docs, "code": {1e12: code[1e12]}}, {"docs": [], "code": []}, (1e12, 3e12), groups={},
                        pairs=(("a", "ref"), ("b", "ref")))
    late = dataclasses.replace(early, cells={"docs": docs, "code": code})
    shown_early = audit.reference_form(early, "ref", {"docs": [3e12], "code": [1e12]})
    shown_late = audit.reference_form(late, "ref", {"docs": [3e12], "code": [3e12]})
    assert "m = 4 at 1e12, 4 at 3e12 (2 read))" in shown_early.splitlines()[0]
    assert "m = 4 at 3e12)" in shown_late.splitlines()[0]
    assert holm_p(shown_late, "| docs | 3e12 | a |") <= holm_p(shown_early, "| docs | 3e12 | a |")
    # code's 1e12 family holds docs' 1e12 rows though the table no longer shows them
    both_1e12 = audit.reference_form(late, "ref", (1e12,))
    assert holm_p(shown_early, "| code | 1e12 | a |") == holm_p(both_1e12, "| code | 1e12 | a |")


def test_a_kernel_row_keeps_the_charged_rows_notes_and_a_pooled_row_names_what_its_budgets_say():
    def cell(family, budget, ratio, base, ahead=False, dirty=0):
        return Cell(family, budget, 1.0, {0: base - 0.1 * math.log10(budget), 1: base + 0.02 - 0.1 * math.log10(budget)},
                    1.0, 1.0, 100, None, None, ratio, dirty, 0.0, reads_ahead=ahead, choice_seeds=(0, 1))
    budgets = (3e11, 6e11, 1e12)
    by_budget = {b: {"bpe": cell("bpe", b, 1.1, 3.0, ahead=True, dirty=int(b == 6e11)), "rl": cell("rl", b, 1.2, 3.1)}
                 for b in budgets}
    study = audit.Study({"c": by_budget}, {"c": []}, budgets, groups={}, pairs=(("bpe", "rl"),))
    vs = audit.budget_verdicts(study)
    for v in vs:
        assert "bpe cut reading bytes ahead" in v.note, v
    kernel = [v for v in vs if v.flops == "kernel" and not isinstance(v.budget, str)]
    assert all(" at " in v.note for v in kernel)
    assert "1 runs from uncommitted code" in [v for v in kernel if v.budget == 6e11][0].note
    assert all("runs from uncommitted code" in v.note for v in vs if isinstance(v.budget, str))


def test_the_seeds_that_chose_mirror_the_choice_rule():
    # no seed shared by every size: each size's own seeds chose, so none is free of the choice
    runs = [_rec("f", 100, s, 2.0 + s * 0.01) for s in (0, 1)] + [_rec("f", 200, s, 1.9) for s in (2, 3)]
    (cell,) = audit.chosen_cells(runs, 1e12).values()
    assert cell.choice_seeds == (0, 1, 2, 3) and cell.fresh == {}
    # one size: no choice was made, every seed is free of it
    (one,) = audit.chosen_cells([_rec("f", 100, s, 2.0) for s in (0, 1, 2)], 1e12).values()
    assert one.choice_seeds == () and set(one.fresh) == {0, 1, 2}


def test_a_diverged_seed_is_named_by_its_cell_and_by_every_pairing_short_of_it(tmp_path):
    import json

    from rltok.analysis.scaling import load_grid

    grid_file = tmp_path / "grid.toml"
    grid_file.write_text('budgets = [1e10]\nseeds = [0, 1, 2]\npreset = "tiny"\nsplit = "test"\n'
                         'size_rule = {coef = 0.02, exponent = 0.5, span = 2.5, points = 3}\n'
                         'crossovers = [["a", "b"]]\n[corpora]\nc = "data/c"\n[[families]]\nname = "a"\n'
                         'method = "uniform"\n[[families]]\nname = "b"\nmethod = "flat"\n')
    folder = tmp_path / "out" / "c"
    folder.mkdir(parents=True)
    # a scored record's N is the built model's (103), a diverged one's the ladder's (100)
    base = {"budget_flops": 1e10, "split": "test", "params": 10, "state_mb": 1.0, "steps": 5, "point_kind": "ladder",
            "non_embedding_params": 103, "ladder_params": 100, "commit": "abc1234"}
    for fam, seed, bpb in [("a", 0, 2.0), ("a", 1, 2.1), ("b", 0, 2.5), ("b", 1, 2.4), ("b", 2, 2.45)]:
        rec = {**base, "family": fam, "method": fam, "seed": seed, "bpb": bpb, "bpb_select": bpb}
        (folder / f"C1e10__{fam}__N100__s{seed}.json").write_text(json.dumps(rec))
    lost = {**base, "family": "a", "family_method": "uniform", "seed": 2, "bpb": None, "diverged": "loss is nan",
            "non_embedding_params": 100}
    (folder / "C1e10__a__N100__s2.json").write_text(json.dumps(lost))
    # b's seed 4 diverged, a never ran seed 4: the pairing is not short of it
    (folder / "C1e10__b__N100__s4.json").write_text(json.dumps({**lost, "family": "b", "seed": 4}))
    # none of these is the cell's: a learning-rate check, a run of another budget, one from uncommitted code
    for seed, extra in ((3, {"point_kind": "check"}), (5, {"budget_flops": 3e10}), (6, {"commit": "abc1234+dirty"})):
        (folder / f"C1e10__a__N100__s{seed}.json").write_text(json.dumps({**lost, "seed": seed, **extra}))
    study = audit.grid_study(load_grid(grid_file), tmp_path / "out")
    a, b = study.cells["c"][1e10]["a"], study.cells["c"][1e10]["b"]
    assert a.diverged == (2,) and b.diverged == (4,) and set(a.test) == {0, 1}
    (charged,) = [v for v in audit.budget_verdicts(study) if v.flops == "charged"]
    assert charged.n == 2 and "a, seed 2 diverged" in charged.note and "b, seed 4" not in charged.note
    cells = audit.cells_table(study, (1e10,))
    assert "(2, seed 2 diverged)" in cells and "(3, seed 4 diverged)" in cells
    form = audit.reference_form(study, "b", (1e10,))
    (row,) = [r for r in form.splitlines() if r.startswith("| c | 1e10 | a |")]
    assert row.endswith("| a, seed 2 diverged |")
    (ref,) = [r for r in form.splitlines() if r.startswith("| c | 1e10 | b |")]
    assert ref.endswith("| b, seed 4 diverged |")  # its own row names every seed it lost
