"""The study's scripts on small studies (lab/scripts: pair profiles, shapes, seed noise, reruns, score summaries) and the GPU grid file."""

from __future__ import annotations

import importlib.util
import json

from rltok.analysis.scaling import budget_tag, load_grid
from test_scaling_cli import _curve  # the library's scaling tests' helpers


# ---------------------------------------------------------------- the study's rules


def test_the_gpu_grid_file_parses_and_names_known_methods():
    from pathlib import Path

    from rltok.analysis.compare import method_overrides
    from rltok.analysis.scaling_grid import family_sizes

    grid = load_grid(Path(__file__).resolve().parents[2] / "lab" / "scripts" / "scaling_gpu_grid.toml")
    assert min(grid.budgets) == 1e15 and max(grid.budgets) == 1e18 and grid.holdout_budgets == (3e18,)
    for fam in grid.families:
        assert method_overrides(fam.method)
        assert len(family_sizes(grid, fam, 1e15)) == 5 and family_sizes(grid, fam, 1e18)[0] > family_sizes(grid, fam, 1e15)[-1]
    assert grid.groups["hierarchy"] == ("uniform", "whitespace", "rl")
    assert ("bytes", "bpe_token") in grid.crossovers
    # under "wsd" a size of one budget goes on from the previous budget's run of the same model
    from rltok.analysis.scaling import budget_ladders

    assert grid.branches and grid.cooldown_frac == 0.2
    ladders = budget_ladders(grid, grid.families[0], grid.budgets[:2], log=lambda m: None)
    shapes = [{tuple(r.overrides) for r in ladders[b]} for b in grid.budgets[:2]]
    assert len(shapes[0] & shapes[1]) == 4  # as the grid file's comment counts


def test_the_profile_pairing_script_pairs_two_families_at_every_shared_rung_and_seed(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # B is A plus 0.1 at the small rung and 0.3 at the large one; a rung or seed only one ran is left
    # out. B's ladder was centred elsewhere: its targets differ from A's, its shapes (what pairs) do not
    width = {1000: 32, 2000: 48, 4000: 64}
    for fam, extra in (("a", {1000: 0.0, 2000: 0.0}), ("b", {1000: 0.1, 2000: 0.3, 4000: 0.0})):
        for n, add in extra.items():
            target = n if fam == "a" else 1.07 * n
            for s in (0, 1, 2) if (fam, n) != ("a", 2000) else (0, 1):
                rec = {"family": fam, "budget_flops": 1e9, "target_size": target, "seed": s, "non_embedding_params": n,
                       "bpb": 2.0 + add + 0.01 * s, "width": width[n], "depth": 1, "config": {"model": {"arch": "flat"}}}
                (folder / f"{budget_tag(1e9)}__{fam}__N{target:.0f}__s{s}.json").write_text(json.dumps(rec))
    # seed 3 of the small rung: A finished, B diverged (a diverged record states no shape: it takes
    # its rung's from B's finished seeds, so the pair is found and counted as left out)
    (folder / f"{budget_tag(1e9)}__a__N1000__s3.json").write_text(json.dumps(
        {"family": "a", "budget_flops": 1e9, "target_size": 1000.0, "seed": 3, "non_embedding_params": 1000,
         "bpb": 2.0, "width": 32, "depth": 1}))
    (folder / f"{budget_tag(1e9)}__b__N1070__s3.json").write_text(json.dumps(
        {"family": "b", "budget_flops": 1e9, "target_size": 1070.0, "seed": 3, "non_embedding_params": 1000,
         "bpb": None, "diverged": "non-finite loss"}))
    proc = subprocess.run([sys.executable, str(repo / "lab" / "scripts" / "scaling_pair_profile.py"), "--out",
                           str(tmp_path / "study"), "--a", "a", "--b", "b", "--budget", "1e9"],
                          capture_output=True, text=True, check=True)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| salad |")]
    assert rows[0].startswith("| salad | 32 × 1 | 1,000 / 1,000 | 3 | -0.100 | s0 -0.100, s1 -0.100, s2")
    assert rows[1].startswith("| salad | 48 × 1 | 2,000 / 2,000 | 2 | -0.300 |") and len(rows) == 3
    # the 5 (rung, seed) pairs pooled, and the 2 rung means
    assert rows[2].startswith("| salad | -0.180 [") and "(5) | -0.200 [" in rows[2] and rows[2].endswith("(2) |")
    assert "1 shared (rung, seed) pairs left out: a side diverged" in proc.stdout


def test_the_shapes_script_tables_each_shape_by_budget_and_bins_differences_by_steps(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # budget 1e9 ran shapes S and M, budget 3e9 ran M and L; seed 2 (an optimum seed) only at M of 1e9
    runs = {1e9: {"16/32 1+1+1": (1000, 2.5, 400), "32/48 1+1+1": (2000, 2.3, 200)},
            3e9: {"32/48 1+1+1": (2000, 2.1, 600), "32/64 1+2+1": (4000, 2.2, 300)}}
    for fam in ("u", "r"):
        for budget, shapes in runs.items():
            for sh, (n, bpb, steps) in shapes.items():
                # the learned family's gap falls with steps: +0.1 at 200 steps, +0.033 at 600
                add = 20 / steps if fam == "r" else 0.0
                seeds = (0, 1, 2) if (budget, sh) == (1e9, "32/48 1+1+1") else (0, 1)
                for s in seeds:
                    width, depth = sh.split()
                    rec = {"family": fam, "budget_flops": budget, "seed": s, "non_embedding_params": n, "steps": steps,
                           "bpb": bpb + add + 0.5 * s, "bpb_select": bpb + add + 0.01 * s, "width": width, "depth": depth}
                    (folder / f"{budget_tag(budget)}__{fam}__N{n}__s{s}.json").write_text(json.dumps(rec))
    # a diverged run (no bpb, no shape in its record) changes nothing
    (folder / f"{budget_tag(1e9)}__u__N4000__s0.json").write_text(json.dumps(
        {"family": "u", "budget_flops": 1e9, "seed": 0, "non_embedding_params": 4000, "bpb": None, "steps": 0}))
    script = [sys.executable, str(repo / "lab" / "scripts" / "scaling_shapes.py"), "--out", str(tmp_path / "study")]
    out = subprocess.run(script + ["--family", "u", "--budget", "1e9", "3e9"], capture_output=True, text=True,
                         check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 16/") or line.startswith("| 32/")]
    # seed 2 of the optimum is left out (the seeds every rung ran: 0 and 1), a missing shape is "·"
    assert rows == ["| 16/32 × 1+1+1 | 1,000 | 2.505 | · |", "| 32/48 × 1+1+1 | 2,000 | **2.305** | **2.105** |",
                    "| 32/64 × 1+2+1 | 4,000 | · | 2.205 |"]
    assert "C1e09 seeds 0,1; C3e09 seeds 0,1" in out
    out = subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--split", "test"],
                         capture_output=True, text=True, check=True).stdout
    assert "| 32/48 × 1+1+1 | 2,000 | +0.100 | +0.033 |" in out and "| 16/32 × 1+1+1 | 1,000 | +0.050 | · |" in out
    out = subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--by-steps"],
                         capture_output=True, text=True, check=True).stdout
    bins = [line for line in out.splitlines() if line.startswith("| 2") or line.startswith("| 3")
            or line.startswith("| 4") or line.startswith("| 6")]
    assert bins == ["| 200–200 | 1 | +0.100 | +0.100 |", "| 300–300 | 1 | +0.067 | +0.067 |",
                    "| 400–400 | 1 | +0.050 | +0.050 |", "| 600–600 | 1 | +0.033 | +0.033 |"]
    out = subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--by-steps", "--bins", "1",
                                   "--min-steps", "250"], capture_output=True, text=True, check=True).stdout
    assert "| 300–600 | 3 | +0.050 | +0.050 |" in out  # the 200-step cell left out; (1/15 + 1/20 + 1/30) / 3
    if importlib.util.find_spec("matplotlib"):
        png = tmp_path / "gap.png"
        subprocess.run(script + ["--family", "r", "--minus", "u", "--budget", "1e9", "3e9", "--by-steps", "--plot",
                                 str(png)], capture_output=True, text=True, check=True)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(script + ["--family", "r", "--budget", "1e9", "--by-steps"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--by-steps needs --minus" in bad.stderr


def test_the_seed_noise_script_pools_each_sizes_spread_and_finds_where_seeds_parted(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # family f at 1e9: size 1000 seeds 2.0 / 2.2 (sd 0.1414), size 2000 seeds 2.0 / 2.0 / 2.3 (sd 0.1732);
    # at 3e9 size 1000 seeds 2.0 / 2.1 (sd 0.0707); a size with one seed and a diverged run add nothing.
    # The val curves (three evaluations, at a third, two thirds and the end): at 1e9 seed 1 of size
    # 1000 is 0.2 worse from the first; size 2000's seed 2 ends 0.3 worse but parts only at the end;
    # at 3e9 seed 1 is ahead at a third (0.1) and ends 0.1 behind
    runs = {(1e9, 1000): {0: 2.0, 1: 2.2}, (1e9, 2000): {0: 2.0, 1: 2.0, 2: 2.3}, (1e9, 4000): {0: 2.5},
            (3e9, 1000): {0: 2.0, 1: 2.1}}
    parts = {(1e9, 1000, 1): (0.2, 0.2, 0.2), (1e9, 2000, 2): (0.0, 0.0, 0.3), (3e9, 1000, 1): (-0.1, 0.05, 0.1)}
    for (budget, n), by_seed in runs.items():
        for s, bpb in by_seed.items():
            part = parts.get((budget, n, s), (0.0, 0.0, 0.0))
            rec = {"family": "f", "budget_flops": budget, "seed": s, "non_embedding_params": n, "bpb": bpb,
                   "split": "test", "curve": _curve(budget, [3.0 + part[0], 2.8 + part[1], 2.7 + part[2]])}
            (folder / f"{budget_tag(budget)}__f__N{n}__s{s}.json").write_text(json.dumps(rec))
    (folder / f"{budget_tag(1e9)}__f__N8000__s0.json").write_text(json.dumps(
        {"family": "f", "budget_flops": 1e9, "seed": 0, "non_embedding_params": 8000, "bpb": None}))
    script = [sys.executable, str(repo / "lab" / "scripts" / "scaling_seed_noise.py"), "--out", str(tmp_path / "study")]
    out = subprocess.run(script + ["--parted", "1"], capture_output=True, text=True, check=True).stdout
    # 1e9: sqrt((0.02 + 0.06) / (1 + 2)) = 0.163; 3e9: 0.071; pooled sqrt(0.085 / 4) = 0.146;
    # median of the sizes' own sd (0.141, 0.173, 0.071) = 0.141
    assert "| f | 0.163 (2) | 0.071 (1) | 0.146 (3) | 0.141 |" in out
    assert "**f, C1e09, N = 2,000**: test bpb s0 2.000, s1 2.000, s2 2.300; spread 0.300" in out
    # the sixths between evaluations are read off the line; none before the first evaluation
    assert "| 0.33 | 3.000 | 3.000 | 3.000 | 0.000 |" in out and "| 0.50 | 2.900 | 2.900 | 2.900 | 0.000 |" in out
    assert "| 0.17 |" not in out and "| 0.83 | 2.750 | 2.750 | 2.900 | 0.150 |" in out
    assert "half the final val spread (0.300) present at 83% of the run" in out
    # no size's curves reach a sixth of the run, so none is counted
    assert "Of the 0 sizes" in out
    # curves from a sixth: size 1000 at 1e9 parted at once, size 2000 at the end, 3e9's swapped order
    for (budget, n), by_seed in runs.items():
        for s in by_seed:
            path = folder / f"{budget_tag(budget)}__f__N{n}__s{s}.json"
            rec = json.loads(path.read_text())
            part = parts.get((budget, n, s), (0.0, 0.0, 0.0))
            vals = [3.5 + part[0]] * 2 + [3.0 + part[0]] + [2.8 + part[1]] * 2 + [2.7 + part[2]]
            path.write_text(json.dumps({**rec, "curve": _curve(budget, vals)}))
    out = subprocess.run(script + ["--parted", "1"], capture_output=True, text=True, check=True).stdout
    assert ("Of the 3 sizes whose seeds end 0.05 val bpb or more apart (every sixth of every seed's curve known), "
            "half the final spread was first present in the first third of the run in 2, the second in 0, the last "
            "in 1; the seed that ends best was already ahead of the one that ends worst at a third of the run in 1.") in out
    out = subprocess.run(script + ["--parted", "0", "--budget", "3e9"], capture_output=True, text=True, check=True).stdout
    assert "| f | 0.071 (1) | 0.071 (1) | 0.071 |" in out and "Of the" not in out


def test_the_profile_pairing_script_follows_a_difference_along_the_runs(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # at 1e9, A is 0.2 above B at a sixth of the run and 0.1 after, at seeds 0 and 1 (seed 2 of B
    # diverged); at 3e9 one pair whose evaluations fall between the sixths (A 0.3 above B at the first,
    # 0 at the last: 0.15 halfway); a rung only A ran adds nothing
    for budget, fam, s, curve, shares in [
            *[(1e9, "b", s, [3.0, 2.5, 2.4, 2.3, 2.2, 2.0], None) for s in (0, 1, 2)],
            *[(1e9, "a", s, [3.2, 2.6, 2.5, 2.4, 2.3, 2.1], None) for s in (0, 1, 2)],
            (3e9, "b", 0, [3.0, 2.0], [0.1, 1.0]), (3e9, "a", 0, [3.3, 2.0], [0.1, 1.0])]:
        rec = {"family": fam, "budget_flops": budget, "target_size": 1000.0, "seed": s, "non_embedding_params": 1000,
               "bpb": None if (budget, fam, s) == (1e9, "b", 2) else 2.0, "width": 32, "depth": 1,
               "config": {"model": {"arch": "flat"}}, "curve": _curve(budget, curve, shares)}
        (folder / f"{budget_tag(budget)}__{fam}__N1000__s{s}.json").write_text(json.dumps(rec))
    (folder / f"{budget_tag(1e9)}__a__N2000__s0.json").write_text(json.dumps(
        {"family": "a", "budget_flops": 1e9, "target_size": 2000.0, "seed": 0, "non_embedding_params": 2000, "bpb": 2.0,
         "width": 48, "depth": 1, "curve": _curve(1e9, [9.0] * 6)}))
    script = [sys.executable, str(repo / "lab" / "scripts" / "scaling_pair_profile.py"), "--out", str(tmp_path / "study"),
              "--a", "a", "--b", "b", "--along"]

    def along(budgets):  # the --along section of the output, and its row's cells
        out = subprocess.run(script + ["--budget", *budgets], capture_output=True, text=True, check=True).stdout
        out = out[out.index("along the run"):]
        return out, next(line for line in out.splitlines() if line.startswith("| salad |")).strip("| ").split(" | ")[1:]

    out, cells = along(["1e9"])
    assert cells == ["+0.200 [+0.200, +0.200] (2)"] + ["+0.100 [+0.100, +0.100] (2)"] * 5
    assert "1 shared (rung, seed) pairs left out: a side diverged" in out and "C1e09 both ran" in out
    _, cells = along(["3e9"])
    assert cells == ["–"] * 6  # one pair: no interval
    # pooled over both budgets, three pairs at each sixth; 3e9's pair read between its evaluations at
    # 0.1 and 1.0: at a sixth 0.3 (1 - 0.0667 / 0.9) = 0.278, at the end 0
    _, cells = along(["1e9", "3e9"])
    assert cells[0].startswith("+0.226 [") and cells[0].endswith("(3)")  # (0.2 + 0.2 + 0.278) / 3
    assert cells[5].startswith("+0.067 [") and cells[5].endswith("(3)")  # (0.1 + 0.1 + 0) / 3


def test_the_seed_noise_script_counts_runs_still_on_the_unigram_plateau(tmp_path):
    import math
    import subprocess
    import sys
    from collections import Counter
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "train.txt").write_text("ab" * 500)
    (data / "val.txt").write_text("aaab" * 100)  # byte frequencies 3/4, 1/4: 0.811 bits per byte
    (data / "test.txt").write_text("ab" * 100)
    counts = Counter(b"aaab")
    entropy = -sum(c / 4 * math.log2(c / 4) for c in counts.values())
    folder = tmp_path / "study" / "salad"
    folder.mkdir(parents=True)
    # at a sixth of the run: seed 0 at the entropy + 0.05 (on the plateau), seed 1 at it - 0.3 (off);
    # a record without a curve counts in neither
    for s, at_first in ((0, entropy + 0.05), (1, entropy - 0.3), (2, None)):
        rec = {"family": "f", "budget_flops": 1e9, "seed": s, "non_embedding_params": 1000, "bpb": 1.0,
               "config": {"data": {"train": str(data)}},
               "curve": _curve(1e9, [at_first] + [0.5] * 5) if at_first is not None else []}
        (folder / f"{budget_tag(1e9)}__f__N1000__s{s}.json").write_text(json.dumps(rec))
    out = subprocess.run([sys.executable, str(repo / "lab" / "scripts" / "scaling_seed_noise.py"), "--out",
                          str(tmp_path / "study"), "--plateau"], capture_output=True, text=True, check=True).stdout
    assert f"byte unigram entropy ({entropy:.3f}, {data})" in out
    assert "| f | 1 | 2 |" in out


def test_the_rerun_table_pairs_each_variant_with_the_studys_record_of_its_corpus_seed_and_size(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    study, bits = tmp_path / "study", tmp_path / "bits"
    for corpus, shift in (("a", 0.01), ("b", -0.03)):
        (study / corpus).mkdir(parents=True)
        (bits / corpus).mkdir(parents=True)
        for s in (0, 1):
            for n, bpb in ((1000, 2.0 + 0.1 * s), (2000, 1.5 + 0.1 * s)):  # two sizes: the variant's is 2000
                rec = {"family": "f", "budget_flops": 1e9, "seed": s, "non_embedding_params": n, "bpb": bpb}
                (study / corpus / f"{budget_tag(1e9)}__f__N{n}__s{s}.json").write_text(json.dumps(rec))
            rec = {"family": "f_fused", "budget_flops": 1e9, "seed": s, "non_embedding_params": 2000,
                   "bpb": 1.5 + 0.1 * s + shift}
            (bits / corpus / f"{budget_tag(1e9)}__f_fused__N2000__s{s}.json").write_text(json.dumps(rec))
    out = subprocess.run([sys.executable, str(repo / "lab" / "scripts" / "scaling_rerun_table.py"), "--out", str(study),
                          "--results", str(bits), "--budget", "1e9", "--pooled", "fused"],
                         capture_output=True, text=True, check=True).stdout
    assert "| f | fused | +0.0100, +0.0100 | -0.0300, -0.0300 |" in out and "| 0.0300 |" in out
    assert "All 4 fused pairs: -0.0100" in out


def test_the_score_summary_script_splits_a_scores_cells_by_a_group_and_leaves_group_rows_out(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"corpora": {"salad": "x"}, "budgets": [1e9, 3e9], "preset": "test",
                                "groups": {"tall": ["h1", "h2"]},
                                "families": [{"name": n, "method": "flat", "sizes": [1e4]} for n in ("f", "h1", "h2")]}))

    def cell(family, error, within, baseline, lo=2.0, hi=2.2, size_within=True):
        return {"corpus": "salad", "family": family, "error": error, "within": within, "baseline_error": baseline,
                "size_within": size_within, "prediction": {"l_star_interval": [lo, hi]}}

    scores = [cell("f", +0.04, True, +0.05),           # the law closer, the two agree within 0.02
              cell("h1", -0.10, False, -0.01, hi=2.4),  # the rival closer
              cell("h2", -0.02, True, +0.03, size_within=False),  # the law closer
              {**cell("tall", -0.10, False, -0.01), "member": "h1"},  # the group: h1's runs again, left out
              {**cell("f", None, None, None), "corpus": "soup"}]       # every seed diverged: counted apart
    # a prediction without an interval: neither inside nor outside, and no width
    scores.append({**cell("f", +0.06, None, None, lo=None, hi=None), "corpus": "stew"})
    path = tmp_path / "score.json"
    path.write_text(json.dumps({"prediction_commit": "abc", "scores": scores}))
    script = [sys.executable, str(repo / "lab" / "scripts" / "scaling_score_summary.py"), "--grid", str(grid), "--score",
              str(path)]
    out = subprocess.run(script + ["--kind", "tall"], capture_output=True, text=True, check=True).stdout
    rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in out.splitlines() if line.startswith("| ")}
    assert rows["| all (4)"] == ["0.050", "-0.005 (2 above, 2 below)", "2 of 3", "0.200", "0.030", "2 of 3",
                                 "1 of 3", "3 of 4 |"]
    assert rows["| tall (2)"][:4] == ["0.060", "-0.060 (0 above, 2 below)", "1 of 2", "0.300"]
    assert rows["| not tall (2)"][1] == "+0.050 (2 above, 0 below)"
    assert "1 cells unscored: no measured optimum" in out
    # a held-out score's runs are built at the predicted N*: its N* column is left blank
    path.write_text(json.dumps({"scores": [{**c, "measured": 2.1} for c in scores[:3]]}))
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert next(line for line in out.splitlines() if line.startswith("| all (3)")).endswith("| – |")
    bad = subprocess.run(script + ["--kind", "wide"], capture_output=True, text=True)
    assert bad.returncode != 0 and "the grid's groups are tall" in bad.stderr

