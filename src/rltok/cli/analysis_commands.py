"""The comparison and scaling commands: `rltok compare` and `rltok scaling`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rltok.config import ConfigError


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def _compare_file(out: Path):
    """Whether a name in `out` is an earlier comparison's: its runs, per-run records and plots,
    and its table (README.md, summary.json) when summary.json is a comparison's."""
    import re

    try:
        summary = json.loads((out / "summary.json").read_text())
        ours = isinstance(summary, dict) and {"command", "rows"} <= set(summary)
    except (OSError, ValueError):
        ours = False
    return lambda name: (name in ("runs", "bpb_vs_flops.png", "chunk_lengths.png") or name.startswith(".")
                         or re.fullmatch(r".+_s\d+\.json", name) is not None
                         or (ours and name in ("README.md", "summary.json")))


def cmd_compare(args) -> int:
    import shlex
    from pathlib import Path

    from rltok.analysis.compare import method_config, reference_budget, run_sweep, write_report
    from rltok.cli.paths import check_output_folder, refuse_other_files
    from rltok.config.files import read_record
    from rltok.data.corpus import resolve_split
    from rltok.training.device import resolve_device
    from rltok.training.fits import refuse_what_cannot_fit

    out = check_output_folder(args.out, "--out")
    refuse_other_files(out, "--out", _compare_file(out), "a comparison's")
    for m in args.methods:  # every method and its NAME@key=value overrides are checked before any run
        try:
            cfg = method_config(m, args.overrides, args.data, out, 0, args.preset)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        refuse_what_cannot_fit(cfg, resolve_device(cfg.train.device))  # not after the methods before it trained
    split = resolve_split(args.data, args.split, fallback=True)  # the split every number is really on
    if split != args.split:
        print(f"note: {args.data} has no {args.split!r} split: evaluating on {split!r}", file=sys.stderr)
    ref = method_config("rl", args.overrides, args.data, out, 0, args.preset)
    budget = reference_budget(ref, args.budget_bytes)
    print(f"budget: {budget:.3e} training FLOPs (= {args.budget_bytes:,} bytes of the hierarchical model "
          f"at rate {ref.model.target_rate})", file=sys.stderr)
    results = run_sweep(args.data, args.methods, args.seeds, out, budget, args.overrides, args.preset,
                        split, args.max_eval_windows, log=_log,
                        eval_context=args.eval_context)
    command = "rltok " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if args.command_line is None else args.command_line
    # the report covers every finished run in the folder (earlier invocations with other seeds too)
    names = {(r["method"], r["seed"]) for r in results}
    for path in sorted(out.glob("*_s*.json")):
        r = read_record(path, "result")  # a damaged one is named and left out of the report
        if r is not None and "method" in r and "seed" in r and (r["method"], r["seed"]) not in names:
            results.append(r)
    report = write_report(results, out, args.title or f"{Path(args.data).name} ({split} split)", command)
    print(report.read_text())
    return 0


def cmd_scaling(args) -> int:
    """The isoFLOP study of a grid file: the runs not done yet, then the fits and plots per corpus."""
    from rltok.analysis.scaling import check_committed, fit_corpus, load_grid, merge_records, one_corpus, study_table
    from rltok.analysis.scaling_adapt import run_grid
    from rltok.cli.paths import check_output_folder

    out = check_output_folder(args.out, "--out")
    grid = load_grid(args.grid)
    if args.corpus:
        grid = one_corpus(grid, args.corpus)
    if args.merge:
        merge_records(args.merge, out, _log)
    elif not args.fit_only:
        check_committed(grid, args.allow_dirty)
        try:
            run_grid(grid, out, _log, shard=args.shard)
        except KeyboardInterrupt:
            _log(f"interrupted: the records of the finished points stay in {out} and the point being run keeps its "
                 "checkpoints; run the same command again to go on from there")
            return 130
    if args.shard:  # a shard holds part of the study: fit once every shard is merged
        _log(f"shard {args.shard[0]}/{args.shard[1]} done; merge the shards (--merge) to fit")
        return 0
    for corpus in grid.corpora:
        folder = out / corpus
        if not folder.is_dir():
            _log(f"{corpus}: no runs yet")
            continue
        study = fit_corpus(folder, grid.n_boot, grid.groups, grid.crossovers, _scaling_command(args),
                           budgets=grid.budgets, interior_only=grid.interior_only,  # holdout budgets stay out
                           fit_from=grid.fit_from)
        print(f"## {corpus}\n\n{study_table(study)}\n\nfits, plots and report: {folder / 'report.md'}\n")
    return 0


def _scaling_command(args) -> str:
    """The command that regenerates a corpus's fits and report.md (written into it)."""
    import shlex

    words = ["rltok", "scaling", "--grid", str(args.grid), "--out", str(args.out),
             *(["--corpus", args.corpus] if args.corpus else [])]
    return shlex.join(words + (["--fit-only"] if args.fit_only or args.merge else []))
