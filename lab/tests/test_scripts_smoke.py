"""Smoke tests of the research scripts under lab/scripts/: each one runs at its smallest settings on a
tiny corpus (or renders from the committed JSON), exits 0 and writes output of the expected shape,
so a library change that breaks a script fails here. Nothing is written into the repository: every
script's output options point into tmp_path. The scripts run in this process, as `python SCRIPT`
would run them (a fresh interpreter for each cost seconds of imports, most of what they took).
The shell sweeps are syntax-checked and run with a stand-in for `rltok` that records its
arguments; the recorded command lines are then checked against the real CLI parser and method
names (without training anything)."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rltok_lab import records

REPO = Path(__file__).resolve().parents[2]  # the repository
SCRIPTS = REPO / "lab" / "scripts"


@pytest.fixture(scope="module")
def doc_results(tmp_path_factory) -> Path:
    """The committed lab/results as files (its packed records unpacked), as the scripts read them."""
    dest = tmp_path_factory.mktemp("doc_results")
    records.unpack_all(dest)
    return dest


# the test preset's shape, as overrides for the scripts that build on the tiny preset
TEST_SHAPE = ["model.d_byte=32", "model.d_chunk=64", "model.n_heads_byte=2", "model.n_heads_chunk=2",
              "model.main_layers=1", "model.window=16", "train.seq_len=64", "train.batch_size=4",
              "train.warmup_steps=1", "train.eval_batches=2", "train.log_every=1", "train.threads=1"]


def run_script(name: str, *args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """`python lab/scripts/<name> args...` from cwd (outside the repository), one thread, run in this
    process: its argv, working directory, sys.path (the script's folder first, as the interpreter puts
    it) and output are its own while it runs, then put back, and the modules it imported from beside
    it are forgotten. Fails the test with the script's output when it exits non-zero (with `check`)."""
    import contextlib
    import io
    import runpy

    import matplotlib
    import torch

    matplotlib.use("Agg")
    argv = [str(SCRIPTS / name), *map(str, args)]
    saved = sys.argv, list(sys.path), os.getcwd(), torch.get_num_threads()
    before = set(sys.modules)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        sys.argv, sys.path[:0] = argv, [str(SCRIPTS)]
        os.chdir(cwd)
        torch.set_num_threads(1)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(argv[0], run_name="__main__")
            except SystemExit as e:  # as the interpreter exits: sys.exit(n), or a message and 1
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    code = 1
                    print(e.code, file=sys.stderr)
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        torch.set_num_threads(saved[3])
        for mod in set(sys.modules) - before:
            if str(getattr(sys.modules[mod], "__file__", None) or "").startswith(str(SCRIPTS)):
                del sys.modules[mod]
    proc = subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
    assert proc.returncode == 0 or not check, f"{name} exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n" \
                                 f"--- stderr\n{proc.stderr[-5000:]}"
    return proc


# ---------------------------------------------------------------------------------------------
# tiny corpora


def _code_text() -> str:
    """Real Python: the package's own sources."""
    return "".join(p.read_text() + "\n" for p in sorted((REPO / "src" / "rltok").rglob("*.py")))


WORDS = ("the model learns where to cut a stream of bytes into chunks and each chunk is read by a "
         "larger network while small networks read the bytes within it so that long words and common "
         "phrases become single units we measure bits per byte on held out text and compare every rule "
         "at equal training compute history of science river mountain city people language music").split()


def _english_text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    out, size = [], 0
    while size < n:
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        s = " ".join(words).capitalize() + rng.choice([". ", ". ", "? ", ".\n\n"])
        out.append(s)
        size += len(s)
    return "".join(out)


def _write_corpus(folder: Path, text: str, sizes=(24_000, 6_000, 6_000)) -> Path:
    folder.mkdir(parents=True)
    start = 0
    for split, n in zip(("train", "val", "test"), sizes):
        (folder / f"{split}.txt").write_text(text[start : start + n])
        start += n
    return folder


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    code = _code_text()
    assert len(code) > 40_000
    _write_corpus(root / "code-py", code)
    _write_corpus(root / "docs-en", _english_text(40_000, 0))
    return root


# ---------------------------------------------------------------------------------------------
# analysis scripts on a corpus folder


def test_lexicon_segmentation(data_root, tmp_path):
    out = tmp_path / "lexseg.json"
    run_script("lexicon_segmentation.py", data_root / "code-py", "--steps", 2, "--batch", 2, "--seq-len", 128,
               "--code", "--unit-price", "-1", "--whole-blank-runs", "--out", out, cwd=tmp_path)
    r = json.loads(out.read_text())
    assert {"rate", "space_align", "sample", "priced", "command"} <= r.keys()
    assert 0 <= r["rate"] <= 1
    assert any("token" in k for k in r)  # --code: Python token-end precision
    assert [p["whole_blank_runs"] for p in r["priced"]] == [False, True]


def test_segmentation_code_length(data_root, tmp_path):
    out = tmp_path / "codelen.json"
    run_script("segmentation_code_length.py", data_root / "docs-en", "--bytes", 4096, "--seq-len", 128,
               "--out", out, cwd=tmp_path)
    r = json.loads(out.read_text())
    assert r["bytes"] == 4096 and r["rules"]
    for row in r["rules"].values():
        assert {"rate", "unigram"} <= row.keys()


def test_token_alignment_rules(data_root, tmp_path):
    out = tmp_path / "nested" / "align.json"
    run_script("token_alignment_rules.py", data_root / "code-py", "--windows", 4, "--seq-len", 128,
               "--train-bytes", 20_000, "--bpe-bytes", 8_000, "--out", out, cwd=tmp_path)
    r = json.loads(out.read_text())
    assert r["windows"] == 4 and r["seq_len"] == 128
    assert {"iid@0.2", "whitespace", "class_runs"} <= r["rules"].keys()
    assert any(k.startswith("bpe_line@") for k in r["rules"])
    assert any(k.startswith("low_pmi_k1@") for k in r["rules"])


# ---------------------------------------------------------------------------------------------
# training scripts


def test_boundary_runs_config_table_loads():
    """Every named run's overrides are valid config keys (no training): a renamed or removed key
    fails here, not hours into a sweep."""
    import importlib.util

    from rltok.config import load_config

    path = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("boundary_runs", SCRIPTS / "boundary_runs.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    bad = []
    for name, ov in module.RUNS.items():
        try:
            load_config("tiny", overrides=["objective.recipe=reference", *ov])
        except Exception as e:
            bad.append(f"{name}: {e}")
    assert not bad, "\n".join(bad)


def test_boundary_runs(data_root, tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    args = [data_root / "docs-en", "reference", "--steps", 2, "--eval-every", 2,
            "--results-dir", results, "--run-root", runs]
    run_script("boundary_runs.py", *args, cwd=tmp_path)
    r = json.loads((results / "docs-en" / "reference_s0.json").read_text())
    assert r["name"] == "reference" and r["data"] == "docs-en" and r["steps"] == 2
    assert r["curve"] and {"step", "val_bpb", "val_rate"} <= r["curve"][-1].keys()
    assert (runs / "docs-en" / "reference_s0" / "metrics.jsonl").exists()
    # --snapshot writes the partial curve of the run folder
    run_script("boundary_runs.py", *args, "--snapshot", cwd=tmp_path)
    partial = json.loads((results / "docs-en" / "reference_s0.partial.json").read_text())
    assert partial["finished"] is False and partial["curve"]


@pytest.fixture(scope="module")
def core_run(data_root, tmp_path_factory):
    """core_results.py trained on one corpus (2 steps, the test preset's shape): the results folder,
    the report and the run folder (a checkpoint for estimator_report.py)."""
    tmp = tmp_path_factory.mktemp("core")
    results, runs, out = tmp / "results", tmp / "runs", tmp / "RESULTS.md"
    run_script("core_results.py", "--data-root", data_root, "--corpora", "code-py", "--steps", 2,
               "--results-dir", results, "--run-root", runs, "--out", out,
               *TEST_SHAPE, "train.eval_every=2", "train.checkpoint_every=2", cwd=tmp)
    return results, out, runs / "code-py"


def test_core_results(core_run):
    results, out, _ = core_run
    r = json.loads((results / "core_code-py.json").read_text())
    assert {"val_sample", "val_greedy", "curve", "segmented_sample", "chunk_length_hist", "params"} <= r.keys()
    assert 0 < r["val_sample"]["bpb"] < 20
    md = out.read_text()
    assert md.startswith("# Results")
    assert "| corpus | params | train bytes |" in md and "| code-py |" in md
    assert "### code-py: validation over training" in md


def test_core_results_render_only(doc_results, tmp_path):
    """Renders the committed core_*.json records into tmp_path."""
    out = tmp_path / "RESULTS.md"
    run_script("core_results.py", "--render-only", "--results-dir", doc_results, "--out", out, cwd=tmp_path)
    md = out.read_text()
    assert "| corpus | params | train bytes |" in md
    assert list(doc_results.glob("core_*.json"))
    for p in sorted(doc_results.glob("core_*.json")):
        assert f"| {json.loads(p.read_text())['corpus']} |" in md


def test_estimator_report(core_run, tmp_path):
    _, _, run_dir = core_run
    results, out = tmp_path / "results", tmp_path / "ESTIMATORS.md"
    run_script("estimator_report.py", "--run", f"smoke={run_dir}", "--estimates", 2, "--reference", 2,
               "--reference-group", 2, "--batch", 4, "--results-dir", results, "--out", out, cwd=tmp_path)
    r = json.loads((results / "estimators_smoke.json").read_text())
    assert r["name"] == "smoke" and r["n_estimates"] == 2 and r["n_reference"] == 2
    md = out.read_text()
    assert md.startswith("# Gradient estimators") and "## smoke" in md
    # the lexicon objective: the gradient of the checkpoint's lexicon code length
    run_script("estimator_report.py", "--run", f"smoke-lexicon={run_dir}", "--objective", "lexicon", "--estimates", 2,
               "--reference", 2, "--reference-group", 2, "--batch", 4, "--results-dir", results, "--out", out,
               cwd=tmp_path)
    assert json.loads((results / "estimators_smoke-lexicon.json").read_text())["objective"] == "lexicon"
    assert "## smoke-lexicon" in out.read_text() and "lexicon's code length" in out.read_text()


def test_estimator_report_render_only(doc_results, tmp_path):
    """Renders the committed estimator JSON and ablation tables into tmp_path."""
    results = tmp_path / "results"
    results.mkdir()
    for p in doc_results.glob("estimators_*.json"):
        shutil.copy(p, results / p.name)
    shutil.copytree(doc_results / "ablation", results / "ablation")
    out = tmp_path / "ESTIMATORS.md"
    run_script("estimator_report.py", "--render-only", "--results-dir", results, "--out", out, cwd=tmp_path)
    md = out.read_text()
    for p in doc_results.glob("estimators_*.json"):
        assert f"## {json.loads(p.read_text())['name']}" in md
    assert "## Training ablations at equal compute" in md
    assert "| variant | seeds | test bpb |" in md


# ---------------------------------------------------------------------------------------------
# reports rendered from committed JSON


def _render_comparison(doc_results, tmp_path, sections, *extra) -> tuple[str, Path]:
    results = tmp_path / "results"
    for section in sections:
        shutil.copytree(doc_results / section, results / section)
    out = tmp_path / "COMPARISON.md"
    run_script("compare_report.py", "--from-docs", "--results-dir", results, "--out", out, *extra, cwd=tmp_path)
    return out.read_text(), results


def test_compare_report_from_docs(doc_results, tmp_path):
    """Two sections of the committed comparison (the rl verdict and the gap to BPE tokens), one corpus;
    the sections not copied render as having no runs."""
    md, results = _render_comparison(doc_results, tmp_path, ["compare", "embedding/b1000000"], "--corpora", "code-py")
    assert md.startswith("# Byte-level models at equal training compute")
    assert "## Boundary rules" in md and "### code-py" in md and "### docs-en" not in md
    assert "Verdict for `rl`" in md and "Gap to the BPE-token transformer" in md
    assert "No finished runs." in md
    assert "|---|" in md
    assert list((results / "compare" / "code-py").glob("*.png")), "no plots written"


@pytest.mark.slow
def test_compare_report_from_docs_full(doc_results, tmp_path):
    md, results = _render_comparison(doc_results, tmp_path, ["compare", "boundaries", "boundaries_vocab", "embedding"])
    assert "### docs-en" in md and "No finished runs." not in md


def test_compare_report_collects_runs(doc_results, tmp_path):
    """The collect path: per-run JSON under --runs is copied (slimmed) into --results-dir."""
    runs = tmp_path / "runs" / "compare" / "code-py"
    runs.mkdir(parents=True)
    for p in sorted((doc_results / "compare" / "code-py").glob("*_s*.json")):
        shutil.copy(p, runs / p.name)
    results, out = tmp_path / "results", tmp_path / "C.md"
    run_script("compare_report.py", "--runs", tmp_path / "runs", "--corpora", "code-py", "--only", "rl", "bpe",
               "--results-dir", results, "--out", out, "--title", "Smoke", cwd=tmp_path)
    copied = sorted(p.name for p in (results / "compare" / "code-py").glob("*_s*.json"))
    assert copied and copied == sorted(p.name for p in runs.glob("*_s*.json") if p.name.startswith(("rl_s", "bpe_s")))
    assert "config" in json.loads((results / "compare" / "code-py" / copied[0]).read_text())
    md = out.read_text()
    assert md.startswith("# Smoke") and "### code-py" in md and "`rl`" in md
    # sections that have no runs under --runs render as "No finished runs" from the empty results dir
    assert "No finished runs." in md


def test_frontier_report(doc_results, tmp_path):
    results = tmp_path / "frontier"
    shutil.copytree(doc_results / "frontier", results)
    shutil.copytree(doc_results / "vocab", tmp_path / "vocab")  # read beside the frontier's folder
    for png in results.rglob("*.png"):
        png.unlink()
    out = tmp_path / "SUPERTOKENS.md"
    run_script("frontier_report.py", "--results-dir", results, "--out", out, cwd=tmp_path)
    md = out.read_text()
    assert md.startswith("# Supertokens")
    assert "| rule | setting | seeds | test bpb |" in md
    assert "rl fixed rate" in md
    for corpus in (p for p in results.iterdir() if p.is_dir()):
        assert f"## {corpus.name}" in md and (corpus / "frontier.png").exists()
    if list((doc_results / "vocab").glob("*.json")):
        assert "## Learned vocabularies against BPE at the same rate" in md


def test_frontier_report_collect(doc_results, tmp_path):
    runs = tmp_path / "runs" / "code-py"
    runs.mkdir(parents=True)
    for p in sorted((doc_results / "frontier" / "code-py").glob("*_s*.json")):
        shutil.copy(p, runs / p.name)
    results, out = tmp_path / "frontier", tmp_path / "S.md"
    run_script("frontier_report.py", "--collect", "--runs", tmp_path / "runs", "--results-dir", results,
               "--out", out, cwd=tmp_path)
    assert sorted(p.name for p in (results / "code-py").glob("*.json")) == sorted(p.name for p in runs.glob("*.json"))
    assert "## code-py" in out.read_text()


# ---------------------------------------------------------------------------------------------
# shell sweeps: syntax, and the rltok command lines they would run

SWEEPS = ["ablation_sweep.sh", "boundary_compare.sh", "bpe_baseline_sweep.sh", "compare_sweep.sh",
          "embedding_sweep.sh", "frontier_sweep.sh", "vocab_report.sh"]


@pytest.mark.parametrize("name", [*SWEEPS, "data_root.sh"])
def test_shell_syntax(name):
    proc = subprocess.run(["bash", "-n", str(SCRIPTS / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_rltok_entry_point_exists():
    """The sweeps call .venv/bin/rltok: the console script pyproject.toml installs."""
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["rltok"] == "rltok.cli:main"
    for name in SWEEPS:
        if name == "vocab_report.sh":  # the lab's own command
            assert "LAB=${LAB:-.venv/bin/python -m rltok_lab}" in (SCRIPTS / name).read_text()
            continue
        assert "RLTOK=${RLTOK:-.venv/bin/rltok}" in (SCRIPTS / name).read_text()


@pytest.fixture(scope="module")
def sweep_commands(tmp_path_factory, data_root) -> dict[str, list[list[str]]]:
    """Each sweep run from a copy of lab/scripts/ (so its runs/ and lab/ folders land in tmp) with
    RLTOK set to a stand-in that records its arguments: script -> the rltok command lines."""
    tmp = tmp_path_factory.mktemp("sweeps")
    copy = tmp / "repo"
    shutil.copytree(SCRIPTS, copy / "lab" / "scripts", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    # a checkpoint folder for vocab_report.sh to find (the others are skipped)
    (copy / "runs" / "frontier" / "code-py" / "runs" / "rl__model.target_rate-0.1_s0").mkdir(parents=True)
    shim = tmp / "rltok"
    shim.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "with open(os.environ['RLTOK_LOG'], 'a') as f:\n"
                    "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    commands = {}
    for name in SWEEPS:
        log = tmp / f"{name}.jsonl"
        env = {**os.environ, "RLTOK": str(shim), "LAB": str(shim), "RLTOK_LOG": str(log), "SEEDS": "0"}
        proc = subprocess.run(["bash", str(copy / "lab" / "scripts" / name), str(data_root), "1000"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{name}: {proc.stdout}\n{proc.stderr}"
        commands[name] = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return commands


EXPECTED_CALLS = {"ablation_sweep.sh": 4, "boundary_compare.sh": 2, "bpe_baseline_sweep.sh": 2, "compare_sweep.sh": 2, "embedding_sweep.sh": 2,
                  "frontier_sweep.sh": 8, "vocab_report.sh": 1}


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_commands_parse(name, sweep_commands, data_root):
    """Every rltok command line a sweep runs parses with the real CLI, names existing methods and
    config keys, and points at the corpora under DATA_ROOT."""
    from rltok.analysis.compare import method_config
    from rltok.cli import build_parser
    from rltok.config import load_config
    from rltok_lab.cli import build_parser as lab_parser

    calls = sweep_commands[name]
    assert len(calls) == EXPECTED_CALLS[name], calls
    parser = build_parser()
    for argv in calls:
        args, extra = (lab_parser() if argv[:1] == ["vocab"] else parser).parse_known_args(argv)
        assert not any(a.startswith("-") for a in extra), f"unknown options {extra} in {argv}"
        overrides = [*getattr(args, "overrides", []), *extra]
        assert Path(args.data).parent == data_root and Path(args.data).is_dir(), argv
        if args.command == "compare":
            load_config(args.preset, overrides=overrides)
            for method in args.methods:
                method_config(method, overrides, args.data, Path(args.out), 0, args.preset)
        else:
            assert args.command == "vocab" and args.checkpoint.startswith("runs/frontier/"), argv


def test_sweeps_reuse_committed_reference_runs(tmp_path):
    """ablation_sweep.sh and frontier_sweep.sh seed their folders with the main comparison's runs,
    extracted from its records."""
    for c in ("code-py", "docs-en"):
        for m in ("rl_s0", "rl_s1", "bpe_s0"):
            assert json.loads(records.extract("compare", f"{c}/{m}.json", tmp_path / c).read_text())["seed"] in (0, 1)


@pytest.mark.parametrize("name", ["ablation_sweep.sh", "bpe_baseline_sweep.sh", "embedding_sweep.sh",
                                  "frontier_sweep.sh", "vocab_report.sh"])
def test_sweep_rejects_missing_data_root(name, tmp_path):
    proc = subprocess.run(["bash", str(SCRIPTS / name), str(tmp_path / "nope")], capture_output=True, text=True,
                          env={**os.environ, "RLTOK": "false"}, timeout=30)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_size_ladder_prints_a_row_per_family_and_size(tmp_path):
    out = run_script("size_ladder.py", "--n-min", "2e4", "--n-max", "5e4", "--points", "2", cwd=tmp_path).stdout
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "N target" not in line]
    assert sorted(r[0].strip("| ") for r in rows) == ["bpe_token"] * 2 + ["flat"] * 2 + ["hourglass"] * 2
    assert all(0.85 <= float(r[3]) <= 1.15 for r in rows)
    flat = [r for r in rows if r[0] == "| flat"]
    assert all(float(r[7].strip(" |")) < float(r[6]) for r in flat)  # the window saves FLOPs


def test_scaling_fit_coverage_reports_a_share_per_quantity(tmp_path):
    import json

    out = run_script("scaling_fit_coverage.py", "--repeats", "3", "--boot", "30", cwd=tmp_path).stdout
    result = json.loads(out)
    shares = result["coverage_of_95pct_intervals"]
    precision = {k: shares.pop(k) for k in ("prediction at 10x: median |error|", "prediction at 10x: median interval width")}
    assert set(shares) == {"E", "alpha", "a", "L*(middle budget)", "prediction at 10x"}
    assert all(v in (0.0, 1 / 3, 2 / 3, 1.0) for v in shares.values()) and result["design"]["repeats"] == 3
    assert all(0 <= v < 1 for v in precision.values())
    # the held-out factor and the true law are the caller's
    out = run_script("scaling_fit_coverage.py", "--repeats", "2", "--boot", "20", "--budgets", "3e11", "1e12", "3e12",
                     "--holdout-factor", "3.33", "--law", "0", "78.6", "0.12", cwd=tmp_path).stdout
    result = json.loads(out)
    assert "prediction at 3.33x" in result["coverage_of_95pct_intervals"] and result["design"]["law"] == [0, 78.6, 0.12]


def test_scaling_lr_fit_finds_the_rate_each_size_wants(tmp_path):
    """The LR-rule script on records of a known law: each size's best rate is lr* = 0.02 (N/1e4)^-0.5,
    the loss a parabola in log lr around it; the fitted power law recovers the exponent."""
    import json
    import math

    for n in (1e4, 4e4, 1.6e5):
        best = 0.02 * (n / 1e4) ** -0.5
        for lr in (0.0025, 0.005, 0.01, 0.02, 0.04):
            rec = {"family": f"flat_lr{lr:g}", "non_embedding_params": int(n),
                   "bpb": 3.0 + 0.1 * math.log(lr / best) ** 2}
            (tmp_path / f"C3e11__flat_lr{lr:g}__N{int(n)}__s0.json").write_text(json.dumps(rec))
    out = run_script("scaling_lr_fit.py", tmp_path, "--n-ref", "1e4", cwd=tmp_path).stdout
    assert "| flat | 40,000 |" in out and "| yes |" in out
    assert "lr*(N) = 0.02 * (N / 10000) ** 0.500" in out


def test_rivals_why_rl_pairs_every_seed_all_four_ran(tmp_path):
    """From the packed records: the four families at one cell, eight seeds, the three predicted
    comparisons corrected together and the context row apart."""
    out = tmp_path / "why_rl.md"
    proc = run_script("rivals_why_rl.py", "--out", out, cwd=tmp_path)
    text = out.read_text()
    assert proc.stdout == text and "seeds 0, 1, 2, 3, 4, 5, 6, 7" in text
    rows = [line for line in text.splitlines() if line.startswith(("| rl", "| uniform"))]
    assert len(rows) == 8  # four families, four comparisons
    compared = [r for r in rows if " − " in r]
    assert [r.split(" | ")[0].lstrip("| ") for r in compared] == [
        "rl_random − rl", "rl_random − uniform", "rl_detach − rl", "uniform − rl (context)"]
    assert all(r.split(" | ")[1] == "8" for r in compared)


def test_rivals_encoder_grads_measures_a_copy_and_switches_detaching_off(tmp_path):
    """Two tiny learned-rule runs laid out as a study's points, one of them detached: every checkpoint
    is measured on a copy (the study's folders are left as they were), the shared parameters are the
    byte embedding and the encoder, and the detached rule's gradient is measured with detaching off
    (it would be zero otherwise). A second call finds everything done."""
    from conftest import corpus_folder
    from rltok.cli import main as rltok_main

    data = corpus_folder(tmp_path, "salad")
    points = []
    for name, detach in (("Pattached", "false"), ("Pdetached", "true")):
        run = tmp_path / "study" / "salad" / "runs" / name / "run"
        assert rltok_main(["train", "--preset", "test", "--data", str(data), "--out", str(run),
                           "model.chunker=rl", f"model.chunker.detach={detach}", "train.max_steps=4",
                           "train.checkpoint_every=2", "train.threads=1"]) == 0
        points.append(run.parent)
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "study").rglob("*"))
    out = tmp_path / "grads.json"
    run_script("rivals_encoder_grads.py", "--runs", *points, "--batches", "2", "--out", out, cwd=tmp_path)
    got = json.loads(out.read_text())
    assert sorted(got) == [f"salad/{p}/step_{s:07d}" for p in ("Pattached", "Pdetached") for s in (2, 4)]
    for r in got.values():
        assert r["batches"] == 2 and r["ratio"] > 0 and -1 <= r["cos"] <= 1 and r["ratio_adam"] > 0
        assert "embed.weight" in r["shared"] and not any(n.startswith("chunker.") for n in r["shared"])
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "study").rglob("*")) == before
    again = run_script("rivals_encoder_grads.py", "--runs", *points, "--out", out, cwd=tmp_path)
    assert again.stdout == "" and json.loads(out.read_text()) == got


def test_rivals_why_rl_capacity_pairs_both_depths_on_the_same_seeds(tmp_path):
    """From the packed records: the learned rule attached and detached with one and four encoder
    layers, each at the size's rate and at half of it, seeds 0-7; the predicted comparisons under
    the correction, the rest as context, and each gain along the run."""
    proc = run_script("rivals_why_rl.py", "--capacity", cwd=tmp_path)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and " − " in line and "A − B" not in line]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == [
        "rl_detach_enc4 − rl_enc4", "rl_detach_enc4h − rl_enc4h", "rl_detach_h − rl_h", "rl_detach − rl (context)",
        "change of the gain, 4 layers − 1 layer (context)",
        "change of the gain, 4 layers, half the rate − 1 layer (context)",
        "change of the gain, 1 layer, half the rate − 1 layer (context)"]
    assert all(r.split(" | ")[1] == "8" for r in rows) and "p (Holm, m = 3)" in proc.stdout
    along = [line for line in proc.stdout.splitlines() if line.startswith(("| 1 layer", "| 4 layers"))]
    assert len(along) == 4 and all(line.count("(8)") == 6 for line in along)


def test_bpe_lookahead_counts_cuts_that_move_with_a_later_byte(data_root, tmp_path):
    out = tmp_path / "lookahead.json"
    run_script("bpe_lookahead.py", data_root / "docs-en", data_root / "code-py", "--rate", 0.3, "--sample-bytes",
               20_000, "--windows", 50, "--width", 16, "--ks", 1, 2, 4, "--out", out, cwd=tmp_path)
    r = json.loads(out.read_text())
    assert set(r["corpora"]) == {"docs-en", "code-py"}
    shares = r["corpora"]["docs-en"]["moved_share"]
    assert set(shares) == {"1", "2", "4"} and shares["1"] > 0 and all(0 <= v <= 1 for v in shares.values())
    md = tmp_path / "lookahead.md"
    run_script("bpe_lookahead.py", data_root / "docs-en", "--rate", 0.3, "--sample-bytes", 20_000, "--windows", 50,
               "--width", 16, "--ks", 1, 2, "--out", md, cwd=tmp_path)
    assert "| t + 2 |" in md.read_text() and "| byte changed | docs-en |" in md.read_text()


def test_scorer_spread_reads_a_straight_through_rules_cut_probabilities(data_root, tmp_path):
    from rltok.cli import main as rltok

    run = tmp_path / "gumbel"
    assert rltok(["train", "--preset", "test", "--data", str(data_root / "docs-en"), "--out", str(run),
                  "model.chunker=gumbel", "train.max_steps=2", "train.log_every=1", "train.eval_every=2"]) == 0
    out = tmp_path / "spread.md"
    run_script("scorer_spread.py", str(tmp_path / "gum*"), "--data", data_root / "docs-en", "--windows", 2,
               "--seq-len", 64, "--classes", "--out", out, cwd=tmp_path)
    by_class = [line for line in out.read_text().splitlines() if line.startswith("| gumbel |")][1]
    lower = float(by_class.split("|")[2])
    assert 0.15 < lower < 0.25  # the scorer near its start: about the target rate for every class
    row = next(line for line in out.read_text().splitlines() if line.startswith("| gumbel |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1] == "gumbel" and cells[2] == "-1.386"  # logit(0.2), where the scorer starts
    assert abs(float(cells[3]) + 1.386) < 0.05 and 0.15 < float(cells[5]) < 0.25  # two steps move it little


def test_chunk_path_use_compares_a_runs_cuts_with_none(data_root, tmp_path):
    from rltok.cli import main as rltok

    for rule in ("uniform", "flat"):
        extra = ["model.arch=flat"] if rule == "flat" else [f"model.chunker={rule}"]
        assert rltok(["train", "--preset", "test", "--data", str(data_root / "docs-en"), "--out", str(tmp_path / f"r_{rule}"),
                      *extra, "train.max_steps=2", "train.eval_every=2"]) == 0
    out = tmp_path / "use.md"
    run_script("chunk_path_use.py", str(tmp_path / "r_*"), "--data", data_root / "docs-en", "--windows", 2,
               "--seq-len", 64, "--out", out, cwd=tmp_path)
    rows = [line for line in out.read_text().splitlines() if line.startswith("| r_")]
    assert len(rows) == 1 and rows[0].startswith("| r_uniform | uniform |")  # the flat model has no chunk level
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert 0.1 < float(cells[2]) < 0.3 and float(cells[3]) > 0 and float(cells[4]) > 0


def test_rule_alignment_counts_runs_above_the_other_familys_mean(tmp_path):
    study = tmp_path / "s" / "docs-en"
    study.mkdir(parents=True)
    aligns = {"learner": [0.30, 0.50, 0.60, 0.90], "random": [0.36, 0.38]}
    for family, values in aligns.items():
        for i, a in enumerate(values):
            rec = {"corpus": "docs-en", "family": family, "point_kind": "ladder", "budget_flops": 3e11,
                   "target_size": 1000 * (i // 2 + 1), "non_embedding_params": 1000, "seed": i % 2, "bpb": 3.0,
                   "split": "test", "wall_s": 1.0, "rate": 0.19 if i else 0.25, "space_align": a}
            (study / f"C3e11__{family}__N{1000 * (i // 2 + 1)}__s{i % 2}.json").write_text(json.dumps(rec))
    optimum = dict(rec, point_kind="optimum", seed=2, space_align=0.99)  # not a ladder run: not counted
    (study / "C3e11__random__N2000__s2.json").write_text(json.dumps(optimum))
    records.pack(tmp_path / "s", remove=True)
    out = tmp_path / "align.md"
    run_script("rule_alignment.py", "--root", tmp_path, "--study", "s", "--family", "learner", "--against", "random",
               "--corpus", "docs-en", "--out", out, cwd=tmp_path)
    summary = next(line for line in out.read_text().splitlines() if line.startswith("| 3e+11 | 4 |"))
    cells = [c.strip() for c in summary.split("|")[1:-1]]
    # the bar is 0.37 (the two ladder runs): 0.50, 0.60 and 0.90 clear it by > 0.05; 3 of 4 rates within 0.03
    assert cells[2] == "0.370 (2 runs)" and cells[3] == "3" and cells[4] == "3"


def test_paired_chosen_pairs_each_family_at_its_val_chosen_size(tmp_path):
    study = tmp_path / "s" / "docs-en"
    study.mkdir(parents=True)
    # family a: the larger size wins on val; b: the smaller. Test bpb differs from val on purpose.
    val = {("a", 1000): 3.0, ("a", 2000): 2.9, ("b", 1000): 2.95, ("b", 2000): 3.1}
    for (family, n), v in val.items():
        for seed in (0, 1, 2):
            rec = {"corpus": "docs-en", "family": family, "point_kind": "ladder", "budget_flops": 3e11,
                   "target_size": n, "non_embedding_params": n, "seed": seed, "split": "test", "wall_s": 1.0,
                   "commit": "abc", "bpb_select": v + 0.01 * seed, "bpb": v + 0.1 + (0.02 * seed if family == "a" else 0)}
            (study / f"C3e11__{family}__N{n}__s{seed}.json").write_text(json.dumps(rec))
    records.pack(tmp_path / "s", remove=True)
    out = tmp_path / "pairs.md"
    run_script("paired_chosen.py", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--family", "a",
               "--against", "b", "--budgets", 3e11, "--out", out, cwd=tmp_path)
    row = next(line for line in out.read_text().splitlines() if line.startswith("| docs-en | 3e11 | a − b |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # a at N 2000 (test 3.00, 3.02, 3.04) against b at N 1000 (3.05 each): mean -0.03 over 3 seeds
    assert cells[4] == "3" and cells[5] == "-0.030" and cells[-1] == "N 2,000 vs 1,000"


def test_alignment_groups_splits_the_chosen_sizes_runs_by_alignment(tmp_path):
    study = tmp_path / "s" / "docs-en"
    study.mkdir(parents=True)
    # rl chooses N 2000 on val; its N 1000 runs (aligned, low bpb) must not be read
    runs = [("rl", 1000, 0, 3.1, 0.95, 2.0), ("rl", 1000, 1, 3.1, 0.95, 2.0), ("rl", 2000, 0, 3.0, 0.95, 3.0),
            ("rl", 2000, 1, 3.0, 0.70, 2.9), ("rl_detach", 2000, 0, 3.0, 0.30, 2.8), ("rl_detach", 2000, 1, 3.0, 0.90, 3.2)]
    for family, n, seed, val, align, bpb in runs:
        rec = {"corpus": "docs-en", "family": family, "point_kind": "ladder", "budget_flops": 3e12, "target_size": n,
               "non_embedding_params": n, "seed": seed, "split": "test", "wall_s": 1.0, "commit": "abc",
               "bpb_select": val, "bpb": bpb, "rate": 0.2, "space_align": align}
        (study / f"C3e12__{family}__N{n}__s{seed}.json").write_text(json.dumps(rec))
    records.pack(tmp_path / "s", remove=True)
    out = tmp_path / "groups.md"
    run_script("alignment_groups.py", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--budget", 3e12,
               "--families", "rl", "rl_detach", "--out", out, cwd=tmp_path)
    text = out.read_text()
    assert "| rl | 1,000 |" not in text and "| rl | 2,000 | 1 | 0.70 | 0.200 | 2.9000 | neither |" in text
    # high: 3.0 and 3.2; low: 2.8
    assert "Alignment ≥ 0.85: 2 runs, mean test bpb 3.1000; below 0.6: 1 runs, mean 2.8000; high − low +0.3000." in text
    missing = run_script("alignment_groups.py", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--budget",
                         3e12, "--families", "rl", "hnet", cwd=tmp_path, check=False)
    assert missing.returncode != 0 and "no scored record of hnet at 3e+12" in missing.stderr


def test_time_estimate_backtest_sets_both_estimates_against_the_measured_time(tmp_path):
    study = tmp_path / "s" / "docs-en"
    study.mkdir(parents=True)
    # at 1e12 time per FLOP in proportion to N (10 s at N 1000, 20 s at 2000); 3e12 ran at N 4000
    # in 100 s: the fit says 40 s x 3 = 120 s (+20%), the mean 15 s x 3 = 45 s (-55%)
    for budget, n, seconds in ((1e12, 1000, 10.0), (1e12, 2000, 20.0), (3e12, 4000, 100.0)):
        rec = {"corpus": "docs-en", "family": "f", "point_kind": "ladder", "budget_flops": budget, "target_size": n,
               "non_embedding_params": n, "seed": 0, "split": "test", "commit": "abc", "bpb": 3.0,
               "point_wall_s": seconds, "wall_s": seconds}
        (study / f"C{budget:.0e}__f__N{n}__s0.json".replace("e+", "e")).write_text(json.dumps(rec))
    records.pack(tmp_path / "s", remove=True)
    out = tmp_path / "t.md"
    run_script("time_estimate_backtest.py", "--root", tmp_path, "--study", "s", "--corpus", "docs-en",
               "--from", 1e12, "--to", 3e12, "--out", out, cwd=tmp_path)
    assert "| docs-en | 1 | 0.03 | 0.01 (-55%) | 0.03 (+20%) |" in out.read_text()


def test_rerun_grid_writes_a_grid_of_the_named_points_and_compares_their_reruns(tmp_path):
    from rltok.analysis.scaling import load_grid

    study = tmp_path / "s" / "docs-en"
    study.mkdir(parents=True)
    base = {"corpus": "docs-en", "point_kind": "ladder", "budget_flops": 3e12, "split": "test", "commit": "abc",
            "wall_s": 1.0}
    for family, n, seed in (("a", 1000, 0), ("a", 2000, 0), ("b", 1000, 0), ("b", 1000, 1)):
        rec = {**base, "family": family, "target_size": float(n), "non_embedding_params": n, "seed": seed,
               "bpb": 3.0 + n / 1e4, "bpb_select": 3.1}
        (study / f"C3e12__{family}__N{n}__s{seed}.json").write_text(json.dumps(rec))
    records.pack(tmp_path / "s", remove=True)
    grid = tmp_path / "g.toml"
    grid.write_text('budgets = [1e12, 3e12]\nholdout_budgets = [1e13]\nseeds = [0, 1]\noptimum_seeds = [2]\nextend = 2\n'
                    'interior_only = true\nsize_rule = {coef = 0.02, exponent = 0.5, span = 2.5, points = 5}\n'
                    'groups = {g = ["a", "b"]}\ncrossovers = [["a", "b"]]\n[corpora]\ndocs-en = "data/docs-en"\n'
                    'code-py = "data/code-py"\n[[families]]\nname = "a"\nmethod = "uniform"\nsize_coef = 0.05\n'
                    'lr_mult = 2\n[[families]]\nname = "b"\nmethod = "flat"\n[[families]]\nname = "c"\nmethod = "rl"\n')
    out = tmp_path / "rerun.json"
    run_script("rerun_grid.py", "grid", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--grid", grid,
               "--runs", "C3e12__a__N1000__s0", "C3e12__a__N2000__s0", "C3e12__b__N1000__s0", "--write", out, cwd=tmp_path)
    g = load_grid(out)
    assert list(g.corpora) == ["docs-en"] and g.budgets == (3e12,) and g.seeds == (0,)
    assert (g.optimum_seeds, g.holdout_budgets, g.extend, g.interior_only, g.crossovers) == ((), (), 0, False, ())
    assert [(f.name, f.sizes, f.lr_mult) for f in g.families] == [("a", (1000.0, 2000.0), 2.0), ("b", (1000.0,), 1.0)]
    # two seeds in one grid, or a point with no record, are refused
    mixed = run_script("rerun_grid.py", "grid", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--grid",
                       grid, "--runs", "C3e12__b__N1000__s0", "C3e12__b__N1000__s1", "--write", out, cwd=tmp_path,
                       check=False)
    assert mixed.returncode != 0 and "one seed" in mixed.stderr
    absent = run_script("rerun_grid.py", "grid", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--grid",
                        grid, "--runs", "C3e12__c__N1000__s0", "--write", out, cwd=tmp_path, check=False)
    assert absent.returncode != 0 and "no packed record C3e12__c__N1000__s0" in absent.stderr
    # the reruns: one reproduces its record, one does not
    rerun = tmp_path / "rerun_out" / "docs-en"
    rerun.mkdir(parents=True)
    for n, bpb in ((1000, 3.1), (2000, 3.2000001)):
        rec = {**base, "family": "a", "target_size": float(n), "non_embedding_params": n, "seed": 0, "bpb": bpb,
               "bpb_select": 3.1, "commit": "abc"}
        (rerun / f"C3e12__a__N{n}__s0.json").write_text(json.dumps(rec))
    table = tmp_path / "cmp.md"
    run_script("rerun_grid.py", "compare", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--rerun", rerun,
               "--out", table, cwd=tmp_path)
    text = table.read_text()
    assert "| C3e12__a__N1000__s0 | abc | abc | equal | equal |" in text
    assert "| C3e12__a__N2000__s0 | abc | abc | differs by 1.00e-07 | equal |" in text
    assert "1 of 2 reruns reproduce their records to the bit." in text


def test_chunk_path_read_counts_one_corpuss_cells_above_each_threshold(tmp_path):
    study = tmp_path / "s" / "docs-en"
    study.mkdir(parents=True)
    for family, n in (("rl", 1000), ("rl", 2000), ("hnet", 1000), ("rl", 4000)):
        rec = {"corpus": "docs-en", "family": family, "point_kind": "ladder", "budget_flops": 3e12, "target_size": n,
               "non_embedding_params": n, "seed": 0, "split": "test", "commit": "abc", "bpb": 3.0, "wall_s": 1.0}
        (study / f"C3e12__{family}__N{n}__s0.json").write_text(json.dumps(rec))
    records.pack(tmp_path / "s", remove=True)
    head = "| run | rule | rate | own | none | difference | off | difference |\n|---|---|---|---|---|---|---|---|\n"
    table = tmp_path / "use.md"
    table.write_text("# t\n\n## docs-en, session 1\n\n" + head + "| C3e12__rl__N1000__s0 | rl | 0.2 | 3 | 3.06 | +0.060 | 3 | +0 |\n"
                     "| C3e12__hnet__N1000__s0 | hnet | 0.2 | 3 | 3.2 | +0.200 | 3 | +0 |\n"
                     "\n## code-py, session 1\n\n" + head + "| C3e12__rl__N2000__s0 | rl | 0.2 | 3 | 3.5 | +0.500 | 3 | +0 |\n"
                     "\n## docs-en, session 2\n\n" + head + "| C3e12__rl__N2000__s0 | rl | 0.2 | 3 | 3.01 | +0.010 | 3 | +0 |\n")
    out = tmp_path / "read.md"
    run_script("chunk_path_read.py", "--root", tmp_path, "--study", "s", "--corpus", "docs-en", "--families", "rl",
               "hnet", "--threshold", 0.05, "--threshold-for", "hnet=0.30", "--table", table, "--out", out, cwd=tmp_path)
    text = out.read_text()
    # code-py's +0.500 for the same run name is not docs-en's; rl's N4000 was never measured
    assert "| rl | 0.05 | 2 | 1 | N1000 +0.060 | 1 |" in text and "| hnet | 0.3 | 1 | 0 | — | 0 |" in text
    assert "docs-en: 1 of 3 cells measured at or above their threshold; 1 planned cells not measured." in text


def test_rivals_session_parses_and_names_its_commands(tmp_path):
    script = SCRIPTS / "rivals_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**os.environ, "WORK": str(tmp_path)})
    assert usage.returncode == 2
    for command in ("ladder", "dpool", "check", "sync", "status", "pack", "unpack", "instruments", "rerun",
                    "rerun-compare", "running"):
        assert f"#   {command} " in usage.stdout
    unset = subprocess.run(["bash", str(script), "running"], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "WORK"})
    assert unset.returncode != 0 and "set WORK" in unset.stderr
