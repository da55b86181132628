"""Regenerate every table, fit, plot and report block of the lab from the packed records.

    python -m rltok_lab.regenerate            # all of it (a few minutes: the scaling fits)
    python -m rltok_lab.regenerate --only core estimators
    python -m rltok_lab.regenerate --check    # write nothing tracked; exit 1 if a table would change

It unpacks lab/results (rltok_lab.records) into lab/.work/results (git ignores lab/.work), copies the
documents whose blocks are spliced (lab/README.md, lab/reports/*.md) into lab/.work/docs, runs each
study's own report script against those copies, and then, for every tracked output, compares the
regenerated text with the tracked one. Provenance is left out of the comparison (the commands in
backquotes, which name the folders they read, and commit hashes): a table whose numbers are the
same keeps its tracked text, stamp included, so regenerating unchanged records changes no file.
A table that differs is written (and listed). Plots stay in lab/.work/results; `--plots` also
copies over the few that lab/results tracks (those the documents show).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rltok_lab import records
from rltok_lab.tables_file import sections

ROOT = records.ROOT
WORK = Path("lab") / ".work"  # relative to the repository: the commands it runs say these paths
RESULTS_REL = Path("lab") / "results"
CLI = "import sys; from rltok.cli import main; sys.argv[0] = 'rltok'; sys.exit(main())"

# the studies that `rltok scaling --fit-only` refits: (results folder under lab/results, its grid)
SCALING_FITS = [
    ("scaling", "lab/scripts/scaling_cpu_grid.toml"),
    ("scaling_1e13_lr/x0.5", "lab/scripts/scaling_1e13_lr_x0.5_grid.toml"),
    ("scaling_1e13_lr/x2", "lab/scripts/scaling_1e13_lr_x2_grid.toml"),
    ("scaling_1e13_profile", "lab/scripts/scaling_1e13_profile_grid.toml"),
    ("scaling_noise", "lab/scripts/scaling_noise_grid.toml"),
    ("scaling_shape_check", "lab/scripts/scaling_shape_check_grid.toml"),
]
# refitted for their plots alone (no report.md is tracked there): (folder under lab/results, a grid of it)
SCALING_PLOTS = [("scaling_lr", "lab/scripts/scaling_lr_grid_hier.toml")]
# the studies whose plots `rltok compare` drew when it ran (no report script redraws them)
COMPARE_PLOTS = ("ablation",)
PLOT_RUNS = (
    "import json, sys; from pathlib import Path; from rltok.analysis.compare import plot\n"
    "for corpus in sorted(p for p in Path(sys.argv[1]).iterdir() if p.is_dir()):\n"
    "    runs = [json.loads(f.read_text()) for f in sorted(corpus.glob('*_s*.json'))]\n"
    "    if runs:\n"
    "        plot(runs, corpus, f\"{corpus.name} ({runs[0]['split']} split)\")\n")
# the variant tables of lab/scripts/scaling_variant.py (--table-only), one section each
VARIANTS = "variants.md"


@dataclass
class Step:
    name: str
    commands: list[list[str]]
    outputs: list[tuple[Path, Path]]  # (regenerated, tracked), relative to the repository
    stdout_to: Path | None = None  # the last command's stdout is this output (after `stdout_head`)
    stdout_head: str = ""
    notes: list[str] = field(default_factory=list)


def work_results() -> Path:
    return WORK / "results"


def work_docs() -> Path:
    return WORK / "docs"


def py(script: str, *args: str) -> list[str]:
    return [sys.executable, f"lab/scripts/{script}", *args]


def grid_for(grid: str, data: Path | None) -> str:
    """The grid file to run: the lab's own, or (`data`: the folder holding the corpora) a copy in
    lab/.work/grids whose corpora point there (the lab's grids name them `data/<corpus>`)."""
    if data is None:
        return grid
    text = (ROOT / grid).read_text()
    head, sep, tail = text.partition("[corpora]")
    if sep:
        tail = re.sub(r'^(\s*[\w.+-]+\s*=\s*")data/', lambda m: m.group(1) + str(data).rstrip("/") + "/", tail,
                      flags=re.MULTILINE)
    copy = WORK / "grids" / Path(grid).name
    (ROOT / copy).parent.mkdir(parents=True, exist_ok=True)
    (ROOT / copy).write_text(head + sep + tail)
    return str(copy)


def steps(data: Path | None = None) -> list[Step]:
    wr, wd = work_results(), work_docs()
    out: list[Step] = []
    for folder, grid in SCALING_FITS:
        grid = grid_for(grid, data)
        corpora = sorted(p.parent.name for p in (ROOT / RESULTS_REL / folder).glob("*/report.md"))
        out.append(Step(f"fit:{folder}", [[sys.executable, "-c", CLI, "scaling", "--grid", grid,
                                            "--out", str(wr / folder), "--fit-only"]],
                        [(wr / folder / c / "report.md", RESULTS_REL / folder / c / "report.md") for c in corpora]))
    # it reads the corpora (whether each budget is complete); without them it refuses
    for folder, grid in SCALING_PLOTS:  # every family of the folder's records is fitted, whichever grid
        out.append(Step(f"plots:{folder}", [[sys.executable, "-c", CLI, "scaling", "--grid", grid_for(grid, data),
                                             "--out", str(wr / folder), "--fit-only"]], []))
    for folder in COMPARE_PLOTS:
        out.append(Step(f"plots:{folder}", [[sys.executable, "-c", PLOT_RUNS, str(wr / folder)]], []))
    out.append(Step("scaling_results", [py("scaling_results.py", "--grid", grid_for("lab/scripts/scaling_cpu_grid.toml", data),
                                           "--out", str(wr / "scaling"), "--readme", str(wd / "LAB_README.md"),
                                           "--doc", str(wd / "SCALING.md"))],
                    [(wd / "LAB_README.md", Path("lab/README.md")), (wd / "SCALING.md", Path("lab/reports/SCALING.md"))]))
    out.append(Step("compare", [py("compare_report.py", "--from-docs", "--results-dir", str(wr),
                                   "--out", str(wd / "COMPARISON.md"))],
                    [(wd / "COMPARISON.md", Path("lab/reports/COMPARISON.md"))]))
    out.append(Step("core", [py("core_results.py", "--render-only", "--results-dir", str(wr),
                                "--out", str(wd / "RESULTS.md"))],
                    [(wd / "RESULTS.md", Path("lab/reports/RESULTS.md"))]))
    out.append(Step("estimators", [py("estimator_report.py", "--render-only", "--results-dir", str(wr),
                                      "--out", str(wd / "ESTIMATORS.md"))],
                    [(wd / "ESTIMATORS.md", Path("lab/reports/ESTIMATORS.md"))]))
    out.append(Step("frontier", [py("frontier_report.py", "--results-dir", str(wr / "frontier"),
                                    "--out", str(wd / "SUPERTOKENS.md"))],
                    [(wd / "SUPERTOKENS.md", Path("lab/reports/SUPERTOKENS.md"))]))
    out.append(Step("audit", [[sys.executable, "-m", "rltok_lab", "audit", "--splice", str(wd / "AUDIT.md")]],
                    [(wd / "AUDIT.md", Path("lab/reports/AUDIT.md"))]))
    out.append(Step("rivals", [[sys.executable, "-m", "rltok_lab", "audit", "--grid",
                                grid_for("lab/scripts/scaling_rivals_grid.toml", data), "--out", str(wr / "rivals"),
                                "--complete-only", "--reference", "rl", "--reference", "flat_ngram",
                                "--splice", str(wd / "RIVALS.md")]],
                    [(wd / "RIVALS.md", Path("lab/reports/RIVALS.md"))]))
    variants = ROOT / RESULTS_REL / VARIANTS
    if variants.exists():  # each section's command, replayed in the file's order, rebuilds the file
        replays = [_replayed(body, "scaling_variant.py") for body in sections(variants.read_text()).values()]
        out.append(Step("variants", [py("scaling_variant.py", *a, "--table-only") for a in replays if a is not None],
                        [(wr / VARIANTS, RESULTS_REL / VARIANTS)]))
    profile = ROOT / RESULTS_REL / "scaling_1e13_profile" / "heldout_profile.md"
    stamped = profile.read_text() if profile.exists() else ""
    argv = _replayed(stamped, "scaling_heldout_profile.py")
    if argv is not None:  # the script prints its tables; the file is its stamp line, then them
        head = stamped.split("\n\n", 1)[0] + "\n\n"
        out.append(Step("heldout_profile", [py("scaling_heldout_profile.py", *argv)],
                        [(wr / "scaling_1e13_profile" / "heldout_profile.md", RESULTS_REL / profile.relative_to(
                            ROOT / RESULTS_REL))], stdout_to=wr / "scaling_1e13_profile" / "heldout_profile.md",
                        stdout_head=head))
    return out


def _replayed(md: str, script: str) -> list[str] | None:
    """The arguments a table's stamp (`Generated by \\`python .../SCRIPT ...\\``) says it was made with,
    its folders moved to where they are now (scripts -> lab/scripts, docs/results or lab/results ->
    the unpacked copy)."""
    m = re.search(r"`python (?:lab/)?scripts/" + re.escape(script) + r" ([^`]*)`", md)
    if not m:
        return None
    argv = []
    for word in m.group(1).split():
        word = re.sub(r"^(?:lab/)?scripts/", "lab/scripts/", word)
        word = re.sub(r"^(?:docs|lab)/results", str(work_results()), word)
        argv.append(word)
    return argv


# ------------------------------------------------------------------ comparing

_COMMAND = re.compile(r"`(?:python3?|rltok|\.venv/bin/python)\b[^`]*`")
_COMMIT = re.compile(r"\b(commits?:?|Commits?:?)(\s+)`?[0-9a-f]{7,40}(?:\+dirty)?`?")


def provenance_free(text: str) -> str:
    """The text with its provenance masked: the commands in backquotes, commit hashes, and the
    results folder's name (docs/results before the lab moved beside the library)."""
    return _COMMIT.sub(r"\1\2C", _COMMAND.sub("`COMMAND`", text)).replace("docs/results", str(RESULTS_REL))


def publishable(text: str, tracked: str | None = None) -> str:
    """A regenerated text as the tracked file has it: the unpacked copy's folders named as lab/results.
    Lines the tracked file already has stay as they are (prose may name lab/.work itself)."""
    if tracked is not None:
        kept = set(tracked.splitlines())
        return "".join(line if line.rstrip("\n") in kept else publishable(line)
                       for line in text.splitlines(keepends=True))
    return text.replace(str(work_results()), str(RESULTS_REL)).replace(str(work_docs()) + "/LAB_README.md", "lab/README.md") \
        .replace(str(work_docs()) + "/", "lab/reports/").replace(str(WORK / "grids") + "/", "lab/scripts/")


def run_step(step: Step, log) -> bool:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "lab"),
                                                        os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               MPLBACKEND="Agg")
    for i, argv in enumerate(step.commands):
        capture = step.stdout_to is not None and i == len(step.commands) - 1
        proc = subprocess.run(argv, cwd=ROOT, env=env, text=True, capture_output=True)
        if proc.returncode != 0:
            log(f"{step.name}: FAILED ({' '.join(argv[1:])})\n{proc.stderr.strip()[-2000:]}")
            return False
        if capture:
            (ROOT / step.stdout_to).write_text(step.stdout_head + proc.stdout)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="steps whose names start with these (e.g. core, fit:scaling, variant)")
    ap.add_argument("--check", action="store_true", help="write nothing tracked; exit 1 when a table would change")
    ap.add_argument("--plots", action="store_true", help="also copy the regenerated plots that lab/results tracks")
    ap.add_argument("--data", help="the folder holding the corpora (code-py/, docs-en/): the scaling block needs "
                    "them to tell which budgets are complete (default: $RLTOK_DATA, else data/ if there)")
    ap.add_argument("--work", help="the work folder (default: lab/.work)")
    ap.add_argument("--keep-work", action="store_true", help="reuse lab/.work/results as it is (no fresh unpack)")
    args = ap.parse_args(argv)
    if args.work:
        global WORK
        WORK = Path(args.work)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    data = args.data or os.environ.get("RLTOK_DATA") or ("data" if (ROOT / "data").is_dir() else None)
    data = Path(data).resolve() if data else None
    every = steps(data)
    chosen = [s for s in every if not args.only or any(s.name.startswith(o) for o in args.only)]
    if not chosen:
        ap.error(f"no step matches {args.only}; the steps: {', '.join(s.name for s in every)}")
    wr, wd = ROOT / work_results(), ROOT / work_docs()
    names = [s.name for s in chosen]
    fresh = not args.keep_work or not wr.exists()
    if "scaling_results" in names and "fit:scaling" not in names and (fresh or not list((wr / "scaling").glob("*/fits.json"))):
        chosen.insert(names.index("scaling_results"), next(s for s in every if s.name == "fit:scaling"))  # its fits.json
    if data is None and "scaling_results" in names:
        log("note: no corpora (--data): the scaling_results step cannot tell which budgets are complete and will refuse")
    if fresh:
        shutil.rmtree(wr, ignore_errors=True)
        log(f"unpacked {records.unpack_all(wr)} files into {work_results()}")
    wd.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "lab" / "README.md", wd / "LAB_README.md")  # the lab's front page holds the study's table
    for doc in sorted((ROOT / "lab" / "reports").glob("*.md")):
        shutil.copyfile(doc, wd / doc.name)
    failed, changed, same = [], [], []
    for step in chosen:
        log(f"{step.name} ...")
        if not run_step(step, log):
            failed.append(step.name)
            continue
        for new, tracked in step.outputs:
            old = (ROOT / tracked).read_text() if (ROOT / tracked).exists() else None
            text = publishable((ROOT / new).read_text(), old)
            if old is not None and provenance_free(old) == provenance_free(text):
                same.append(str(tracked))
                continue
            changed.append(str(tracked))
            if not args.check:
                (ROOT / tracked).write_text(text)
    if args.plots and not args.check:
        for png in sorted((ROOT / RESULTS_REL).rglob("*.png")):
            fresh = wr / png.relative_to(ROOT / RESULTS_REL)
            if fresh.exists():
                shutil.copyfile(fresh, png)
    log(f"{len(same)} outputs as tracked (numbers unchanged), {len(changed)} differ"
        + ("" if args.check else " (written)") + (f", {len(failed)} steps failed" if failed else ""))
    for t in changed:
        print(f"differs: {t}")
    for f in failed:
        print(f"failed: {f}")
    return 1 if failed or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
