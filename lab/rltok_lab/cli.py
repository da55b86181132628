"""The lab's command line: the study's own steps of a scaling grid (status, the held-out prediction
and its test, the optimum check) and the research instruments (the gradient estimators' noise, a
cut's true advantage, lexicon costs, the learned vocabulary). `python -m rltok_lab --help`. It
uses rltok; rltok never uses it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rltok.cli import run_command
from rltok.cli.model_commands import _load
from rltok.cli.parser import MAX_SEED, MAX_THREADS, Parser, add_model_args, add_plugin_arg, count, number
from rltok.cli.streams import output_never_fails
from rltok.config import ConfigError


def has_learned_rule(model) -> bool:
    """Whether the model draws its boundaries with a policy the objective trains."""
    rule = getattr(model, "chunker", None)
    return rule is not None and rule.learned


def cmd_study(args) -> int:
    """A grid's study steps beyond its runs and fits (those are `rltok scaling`)."""
    from rltok.analysis.scaling import load_grid, one_corpus
    from rltok.cli.paths import check_output_folder

    out = check_output_folder(args.out, "--out")
    grid = load_grid(args.grid)
    if args.corpus:
        if args.predict:
            raise ConfigError("--predict fits every corpus into one prediction file, written once: drop --corpus")
        grid = one_corpus(grid, args.corpus)

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    if args.status:
        from rltok_lab.scaling_status import holdout_status, holdout_table, status_table, study_status

        print(status_table(study_status(grid, out)))
        held = holdout_status(grid, out)
        if held:
            print(f"\n{holdout_table(held)}")
        return 0
    if args.holdout or args.check_optimum is not None or args.predict:  # from committed code where the grid asks
        from rltok.analysis.scaling import check_committed

        check_committed(grid, args.allow_dirty)
        if grid.committed_only and not args.allow_dirty and _lab_changed():
            raise ConfigError("the grid asks for committed code (committed_only) and lab/rltok_lab, which chooses the "
                              "sizes, runs the checks and writes the prediction, has uncommitted changes: commit first")
    if args.predict or args.holdout:
        return _scaling_holdout(args, grid, out, log)
    if args.at:
        raise ConfigError("--at goes with --predict or --holdout")
    if args.family and args.check_optimum is None:
        raise ConfigError("--family goes with --check-optimum (a study's fits need every family)")
    if args.family:
        names = [f.name for f in grid.families]
        unknown = [n for n in args.family if n not in names]
        if unknown:
            raise ConfigError(f"--family {', '.join(unknown)}: the grid's families are {', '.join(names)}")
        grid = dataclasses.replace(grid, families=tuple(f for f in grid.families if f.name in args.family))
    if args.check_optimum is not None:
        from rltok_lab.scaling_check import check_markdown, parse_variant, run_optimum_check

        variants = [parse_variant(v) for v in args.variant]
        result = run_optimum_check(grid, out, args.check_optimum, tuple(args.lr_mults), variants, args.tolerance,
                                   log, command=_scaling_command(args), policy_mults=tuple(args.policy_lr_mults))
        print(check_markdown(result))
        return 0
    if args.variant or args.lr_mults != [0.5, 2.0] or args.policy_lr_mults:
        raise ConfigError("--variant, --lr-mults and --policy-lr-mults go with --check-optimum")
    if args.fit_only:
        from rltok_lab.scaling_status import unfinished_budgets

        for corpus, budget in unfinished_budgets(grid, out):
            log(f"note: {corpus} {budget:.3g} is not complete: its fits in report.md are provisional "
                "(a partial ladder fits its own parabola)")
        return 0
    raise ConfigError("name a step: --status, --predict, --holdout, --check-optimum or --fit-only")


def _lab_changed() -> bool:
    """Whether the lab's package differs from HEAD (tracked files; False where git cannot tell)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "lab/rltok_lab"], cwd=root,
                              stderr=subprocess.DEVNULL).returncode == 1
    except OSError:
        return False


def _scaling_command(args) -> str:
    """The command that regenerates the step's tables (written into them)."""
    import shlex

    words = ["python", "-m", "rltok_lab", "study", "--grid", str(args.grid), "--out", str(args.out),
             *(["--corpus", args.corpus] if args.corpus else [])]
    if getattr(args, "check_optimum", None) is not None:
        words += ["--check-optimum", f"{args.check_optimum:g}", "--lr-mults", *(f"{m:g}" for m in args.lr_mults),
                  *(["--policy-lr-mults", *(f"{m:g}" for m in args.policy_lr_mults)] if getattr(args, "policy_lr_mults", None) else []),
                  *(w for v in args.variant for w in ("--variant", v)), "--tolerance", f"{args.tolerance:g}",
                  *(["--family", *args.family] if getattr(args, "family", None) else [])]
    return shlex.join(words)


def _scaling_holdout(args, grid, out, log) -> int:
    """`rltok scaling --predict` / `--holdout`: the prediction held out from the fit, and its test."""
    from rltok_lab.scaling_holdout import (forecast_grid, forecast_table, prediction_name, run_forecast_score,
                                                run_holdout, score_name, score_table, write_prediction)

    if args.at:  # a forecast of the study's own budgets: fitted below them, scored against their ladders
        fitted = forecast_grid(grid, args.at)
        at = fitted.holdout_budgets
        if args.predict:
            print(f"forecast: {write_prediction(fitted, out, log, prediction_name(at))}")
            return 0
        scores = run_forecast_score(grid, out, at, log)
        print(f"{forecast_table(scores)}\n\nscores: {out / score_name(at)}")
        return 0
    if args.predict:
        print(f"prediction: {write_prediction(grid, out, log)}")
        return 0
    from rltok_lab.scaling_summary import paired_table

    scores, paired = run_holdout(grid, out, log)
    print(score_table(scores))
    for budget in grid.holdout_budgets:
        table = paired_table({c: {"paired": rows} for c, rows in paired.items()}, budget)
        if table:
            print(f"\nAt {budget:.3g} FLOPs, each side at its predicted size, paired by seed (test bpb, a − b, "
                  f"mean [95% t interval] (seeds)):\n\n{table}")
    print(f"\nscores: {out / 'prediction_score.json'}")
    return 0


def cmd_diagnose(args) -> int:
    """`diagnose`: variance, SNR and alignment of the boundary-policy gradient per variant."""
    from pathlib import Path

    from rltok.data.corpus import run_split_bytes
    from rltok.data.windows import eval_windows
    from rltok_lab.diagnose import VARIANTS, checkpoint_lexicon, diagnose, markdown

    if args.out:  # before hours of computing, not after
        from rltok.cli.paths import check_output_file

        check_output_file(args.out, "--out")
    for v in args.variants or []:
        if v not in VARIANTS:
            raise ConfigError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
        k = VARIANTS[v].get("group_size", 1)
        if args.batch % k:
            raise ConfigError(f"variant {v!r} needs --batch a multiple of its group size {k}")
    if args.batch < 1 or args.estimates < 2 or args.reference < 1:
        raise ConfigError("--batch and --reference must be >= 1, --estimates >= 2")
    if args.reference_group < 2:
        raise ConfigError("--reference-group must be >= 2 (segmentations per sequence in the reference)")
    model, cfg, ckpt, device = _load(args)
    if not has_learned_rule(model):
        raise ConfigError("diagnose needs a checkpoint of the hierarchical model with a learned boundary policy (rl)")
    lexicon = checkpoint_lexicon(ckpt, cfg, device) if args.objective == "lexicon" else None
    data = run_split_bytes(cfg.data, args.split, source=args.data)
    x, y = eval_windows(data, args.seq_len or cfg.train.seq_len, args.batch)
    if len(x) < args.batch:
        raise ConfigError(f"only {len(x)} windows of evaluation data; lower --batch or --seq-len")
    result = diagnose(model, x.to(device), y.to(device), cfg.objective, cfg.model.target_rate,
                      variants=args.variants, n_estimates=args.estimates, n_reference=args.reference,
                      reference_group=args.reference_group, seed=args.seed,
                      log=lambda m: print(m, file=sys.stderr), lexicon=lexicon)
    result.update(checkpoint=str(ckpt), data=args.data or cfg.data.train, split=args.split)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


def cmd_true_advantage(args) -> int:
    """`true-advantage`: what a boundary at t does to the loss, per byte class,
    and how well the estimators' advantages track it."""

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import run_split_bytes
    from rltok_lab.true_advantage import format_true_advantage, true_advantage

    if args.per_class < 1 or args.variant_batch < 1 or args.batch < 1:
        raise ConfigError("--per-class, --variant-batch and --batch must be >= 1")
    if args.horizon is not None and args.horizon < 0:
        raise ConfigError("--horizon must be >= 0")
    model, cfg, ckpt, device = _load(args)
    if not getattr(model, "hierarchical", False):
        raise ConfigError("--true-advantage needs a checkpoint of the hierarchical (hourglass) model")
    if model.cfg.stages == 2:
        raise ConfigError("--true-advantage does not support two-stage (model.stages=2) checkpoints")
    data = run_split_bytes(cfg.data, args.split, source=args.data)
    x, y = eval_windows(data, args.seq_len or cfg.train.seq_len, args.batch)
    if x.shape[1] < 3:
        raise ConfigError("windows of at least 3 bytes are needed; raise --seq-len or give more data")
    result = true_advantage(model, x.to(device), y.to(device), cfg.objective, n_per_class=args.per_class,
                            horizon=args.horizon, batch_size=args.variant_batch, seed=args.seed)
    result.update(checkpoint=str(ckpt), data=args.data or cfg.data.train, split=args.split)
    return _write_and_print(result, args.out, format_true_advantage)


def _write_and_print(result: dict, out: str | None, render) -> int:
    """An instrument's result: as JSON to `out` when given, as a table on stdout."""
    if out:
        from pathlib import Path

        Path(out).write_text(json.dumps(result, indent=2))
        print(f"wrote {out}", file=sys.stderr)
    print(render(result))
    return 0


def cmd_lexicon_costs(args) -> int:
    """`lexicon-costs`: where a lexicon-trained policy cuts and what flipping each
    decision changes in the lexicon's code length, per byte class."""

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import run_split_bytes
    from rltok_lab.diagnose import checkpoint_lexicon
    from rltok_lab.lexicon_costs import format_lexicon_costs, lexicon_costs_by_class

    model, cfg, ckpt, device = _load(args)
    if not has_learned_rule(model):
        raise ConfigError("--lexicon-costs needs a checkpoint of the hierarchical model with a learned boundary "
                          "policy (rl)")
    lexicon = checkpoint_lexicon(ckpt, cfg, device)
    x, _ = eval_windows(run_split_bytes(cfg.data, args.split, source=args.data),
                        args.seq_len or cfg.train.seq_len, args.batch)
    result = lexicon_costs_by_class(model, lexicon, x.to(device), seed=args.seed)
    result.update(checkpoint=str(ckpt), data=args.data or cfg.data.train, split=args.split, windows=list(x.shape))
    return _write_and_print(result, args.out, format_lexicon_costs)


def cmd_vocab(args) -> int:
    from rltok_lab.vocab import load_vocab_data, vocab_report
    from rltok_lab.vocab_render import print_report, write_json, write_markdown

    from rltok.cli.paths import check_output_file

    if args.max_bytes < 0 or args.top < 1 or args.batch_size < 1 or args.bpe_sample_bytes < 1:
        raise ConfigError("--top, --batch-size and --bpe-sample-bytes must be >= 1, --max-bytes >= 0")
    for flag, out in (("--json", args.json), ("--markdown", args.markdown)):
        if out:
            check_output_file(out, flag)
    model, cfg, ckpt, device = _load(args)

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    spec = args.data or cfg.data.train
    # the BPE samples its training bytes from at most 25x its sample (and the run's own cap)
    read_cap = min(cfg.data.max_bytes or 1 << 62, 25 * args.bpe_sample_bytes)
    text, bpe_train = load_vocab_data(spec, args.split, args.max_bytes, cfg.data.val_fraction, read_cap, log=log)
    result = vocab_report(model, text, cfg.train.seq_len, mode=args.mode, seed=args.seed, top=args.top,
                          bpe=not args.no_bpe, bpe_data=bpe_train, bpe_pretokenize=args.bpe_pretokenize,
                          bpe_sample_bytes=args.bpe_sample_bytes, device=device, batch_size=args.batch_size, log=log)
    result.update(checkpoint=str(ckpt), data=args.data or cfg.data.train, split=args.split)
    # the files first: a reader that stops early (`| head`) must not cost them
    if args.json:
        log(f"wrote {write_json(result, args.json)}")
    if args.markdown:
        log(f"wrote {write_markdown(result, args.markdown, min(args.top, 30))}")
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # chunks may not be encodable on this terminal
    try:
        print_report(result)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0


def _model_args(p) -> None:
    """rltok's flags of a command that loads a model, and those of a fixed batch of windows."""
    add_model_args(p)
    p.add_argument("--data", help="data for the fixed batch (default: the training source)")
    p.add_argument("--split", default="val")
    p.add_argument("--batch", type=count(1), default=8, help="sequences in the fixed batch")
    p.add_argument("--seq-len", type=count(0, 1 << 20), default=0)
    p.add_argument("--out", "--json", dest="out", help="write the result as JSON")


def cmd_why_cuts(args) -> int:
    """`why-cuts`: where each hierarchy of a grid cuts at one budget, and what a cut is worth there."""
    from pathlib import Path

    import torch

    from rltok.analysis.scaling import load_grid
    from rltok.cli.paths import check_output_file
    from rltok_lab.why_cuts import report, to_plain, why_cuts

    folder = Path(args.out)
    if not folder.is_dir():
        raise ConfigError(f"--out {folder}: no such results folder")
    if args.json:  # before the checkpoints are read, not after
        check_output_file(args.json, "--json")
    torch.set_num_threads(args.threads)
    readings = why_cuts(load_grid(args.grid), folder, args.budget, args.corpus, args.families, args.data_root,
                        args.per_class, args.batch, args.seq_len, args.seed, args.per_seed,
                        log=lambda m: print(m, file=sys.stderr))
    if not readings:
        raise ConfigError(f"no hierarchy family has finished runs at {args.budget:g}")
    if args.json:
        Path(args.json).write_text(json.dumps({"budget": args.budget, "readings": to_plain(readings)}, indent=1))
    text = report(readings, args.budget)
    if args.splice:
        from rltok_lab.audit import splice

        splice(Path(args.splice), text, marker="why-cuts")
    else:
        print(text)
    return 0


def cmd_audit(args) -> int:
    from pathlib import Path

    from rltok_lab.audit import grid_report, report, splice

    if bool(args.grid) != bool(args.out):
        raise ConfigError("--grid and --out go together (a study's grid and its results folder)")
    if args.reference and not args.grid:
        raise ConfigError("--reference goes with --grid and --out")
    if args.complete_only and not args.grid:
        raise ConfigError("--complete-only goes with --grid and --out")
    if args.grid:
        from rltok.analysis.scaling import load_grid

        text = grid_report(load_grid(args.grid), Path(args.out), complete_only=args.complete_only,
                           references=args.reference)
    else:
        text = report()
    if args.splice:
        splice(Path(args.splice), text)
    else:
        print(text, end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m rltok_lab", description="The lab's study steps and research instruments.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("study", help="a scaling grid's study steps: status, the held-out prediction and its test, "
                                     "the optimum check (its runs and fits are `rltok scaling`)")
    p.add_argument("--grid", required=True, help="grid file, TOML or JSON")
    p.add_argument("--out", required=True, help="the study's results folder (as given to `rltok scaling`)")
    p.add_argument("--corpus", help="only this corpus of the grid")
    p.add_argument("--family", nargs="+", metavar="NAME",
                   help="with --check-optimum: only these families of the grid (their rows of an earlier check "
                        "are replaced, the others kept)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--fit-only", action="store_true", help="say which budgets are not complete (their fits are provisional)")
    mode.add_argument("--status", action="store_true",
                      help="where the study stands per corpus and budget: runs done, complete or not, seconds per "
                           "run, the time left estimated; trains nothing")
    mode.add_argument("--predict", action="store_true",
                      help="fit without the grid's holdout_budgets and write OUT/prediction.json (once: an existing "
                           "one is never overwritten); train nothing")
    mode.add_argument("--holdout", action="store_true",
                      help="run each family at the size OUT/prediction.json predicts for each holdout budget, then "
                           "score the prediction into OUT/prediction_score.json")
    mode.add_argument("--check-optimum", type=number(0, 1e30, low_open=True), metavar="BUDGET",
                      help="at each family's best size of this budget (the study's runs there): the learning-rate "
                           "rule against --lr-mults times its rate, and each --variant; runs under "
                           "OUT/optimum_check/, table in OUT/optimum_check/C<budget>.md (e.g. C3e11.md)")
    p.add_argument("--at", type=number(0, 1e30, low_open=True), nargs="+", metavar="BUDGET",
                   help="with --predict / --holdout: a forecast of these budgets of the grid's own ladders, fitted "
                        "on the budgets below them, into OUT/prediction_C<B>.json before any run at them; "
                        "--holdout then scores it against their isoFLOP fits (trains nothing)")
    p.add_argument("--lr-mults", type=number(0, 1e6, low_open=True), nargs="+", default=[0.5, 2.0],
                   help="with --check-optimum: multiples of the rule's rate to run (default 0.5 2)")
    p.add_argument("--policy-lr-mults", type=number(0, 1e6, low_open=True), nargs="+", default=[],
                   help="with --check-optimum: multiples of the policy's own rate (objective.policy_lr_mult) to run "
                        "for each family whose boundary rule has parameters of its own (e.g. 0.5 2)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=FAMILY[:OVERRIDES]",
                   help="with --check-optimum: FAMILY's best size again with these comma-separated overrides in "
                        "place of the family's own, e.g. flat_full=flat:model.flat_window=0 (repeatable)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="with --holdout / --check-optimum and a grid that sets committed_only: run from a tree with "
                        "uncommitted changes under src/ (its records are left out of every fit and table)")
    p.add_argument("--tolerance", type=number(0, 100), default=0.02,
                   help="with --check-optimum: the rule holds within this many bpb of the best rate (default 0.02)")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("diagnose", help="variance, SNR and alignment of the boundary-policy gradient per variance "
                                        "reducer")
    _model_args(p)
    p.add_argument("--estimates", type=count(0, 1 << 20), default=32, help="independent estimates per variant")
    p.add_argument("--reference", type=count(1, 1 << 20), default=64, help="estimates averaged into the reference gradient")
    p.add_argument("--reference-group", type=count(0, 1 << 16), default=8, help="segmentations per sequence in the reference")
    p.add_argument("--variants", nargs="+", help="subset of variants (default: all; with --objective lexicon, "
                                                 "those that apply)")
    p.add_argument("--objective", choices=["lm", "lexicon"], default="lm",
                   help="the gradient estimated: of the LM loss (default), or of the segmentation's code length "
                        "under the checkpoint's lexicon (what the lexicon recipe's policy is trained on)")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("true-advantage", help="how much a boundary at t changes the loss (D_t = L(b_t=0) - "
                                              "L(b_t=1)) per byte class, and each estimator's correlation with it")
    _model_args(p)
    p.add_argument("--per-class", type=count(1, 1 << 20), default=32, help="positions per byte class")
    p.add_argument("--horizon", type=count(0), default=None,
                   help="bytes after t whose loss counts (default: to the end of the window)")
    p.add_argument("--variant-batch", type=count(1), default=32, help="rows per forward pass")
    p.set_defaults(func=cmd_true_advantage)

    p = sub.add_parser("lexicon-costs", help="lexicon-trained checkpoints: per byte class, how often the policy "
                                             "cuts and what one cut more or less changes in the code length")
    _model_args(p)
    p.set_defaults(func=cmd_lexicon_costs)

    p = sub.add_parser("vocab", help="the learned vocabulary of a checkpoint on a corpus, against a BPE of the same rate")
    p.add_argument("checkpoint", help="checkpoint or run folder (newest checkpoint)")
    p.add_argument("--data", help="corpus: a file, folder, glob, 'stdlib' or hf:name (default: the training source)")
    p.add_argument("--split", default="test", help="test (default) or val of a split folder (else the validation "
                                                   "part the data loader holds out: whole documents, or the tail "
                                                   "of each when there are fewer than 20), or all (the whole source)")
    p.add_argument("--max-bytes", type=count(0), default=200_000, help="analyse the first N bytes of the split (default 200k; 0 = all)")
    p.add_argument("--mode", choices=("greedy", "sample"), default="sample",
                   help="boundary decisions: sampled with --seed (default: how the model trains and is "
                        "evaluated) or thresholded at p=0.5 (few boundaries where the policy is unsure)")
    p.add_argument("--seed", type=count(0, MAX_SEED), default=0)
    p.add_argument("--top", type=count(1), default=30, help="most frequent chunks to list (default 30)")
    p.add_argument("--bpe-pretokenize", choices=("line", "gpt2"), default="line",
                   help="BPE pre-tokenisation: line (tokens may span words; default) or gpt2 (within words)")
    p.add_argument("--bpe-sample-bytes", type=count(1), default=4_000_000,
                   help="bytes the BPE is trained on, random blocks of the train split (default 4M)")
    p.add_argument("--no-bpe", action="store_true", help="skip the BPE comparison")
    p.add_argument("--json", metavar="PATH", help="also write the full result as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write a markdown report")
    p.add_argument("--batch-size", type=count(1), default=16, help="windows per forward pass")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=count(0, MAX_THREADS), default=0)
    p.set_defaults(func=cmd_vocab)
    p = sub.add_parser("audit", help="the compute-optimal study read from its records: sizes chosen on val at every "
                                     "budget, verdicts under both FLOP counts with Holm's correction, the steps "
                                     "trend over shape-matched cells, bytes against BPE at equal parameters")
    p.add_argument("--grid", help="read this grid's study (with --out, its results folder) instead of the first study's records")
    p.add_argument("--out", help="the grid's results folder (as given to `rltok scaling`)")
    p.add_argument("--complete-only", action="store_true",
                   help="with --grid: where the study stands, then only its budgets with nothing left to run")
    p.add_argument("--reference", action="append", default=[], metavar="FAMILY",
                   help="with --grid: first a table in the reference's form against this family (repeatable): every "
                        "family the grid's crossovers pair with it, each at its val-chosen size at the corpus's "
                        "largest budget read and held-out budgets, Holm over the table's own verdicts")
    p.add_argument("--splice", metavar="MARKDOWN", help="write the tables between <!-- audit:begin --> and "
                                                        "<!-- audit:end --> of this file instead of printing them")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("why-cuts", help="each hierarchy of a grid at its val-chosen size at one budget: where its "
                                        "cuts fall per byte class, what a cut is worth there (the true advantage), "
                                        "and how much its placement gains over random cuts")
    p.add_argument("--grid", required=True, help="the grid file (as given to `rltok scaling`)")
    p.add_argument("--out", required=True, help="its results folder, run folders with checkpoints included")
    p.add_argument("--budget", type=number(1.0, 1e30), required=True, help="the budget whose cells are read")
    p.add_argument("--corpus", nargs="+", help="corpora (default: the grid's)")
    p.add_argument("--families", nargs="+", help="families (default: every hierarchy)")
    p.add_argument("--data-root", help="a folder holding each corpus by name (default: the data each run trained on)")
    p.add_argument("--per-class", type=count(1, 1 << 16), default=64, help="positions per byte class and seed")
    p.add_argument("--batch", type=count(1, 4096), default=8, help="val windows in the fixed batch")
    p.add_argument("--seq-len", type=count(0, 1 << 20), default=0, help="window length (default: the run's)")
    p.add_argument("--seed", type=count(0, MAX_SEED), default=0)
    p.add_argument("--threads", type=count(1, MAX_THREADS), default=1)
    p.add_argument("--per-seed", action="store_true", help="a row per seed instead of the seeds pooled")
    p.add_argument("--json", help="also write the readings as JSON")
    p.add_argument("--splice", metavar="MARKDOWN", help="write the tables between <!-- why-cuts:begin --> and "
                                                        "<!-- why-cuts:end --> of this file instead of printing them")
    p.set_defaults(func=cmd_why_cuts)
    for command in sub.choices.values():  # a run trained with a plugin loads with it
        add_plugin_arg(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:  # a bad flag is an exit status, also for in-process callers
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    if getattr(args, "mode", "unset") is None:
        args.mode = "sample"
    with output_never_fails(stdout=False):
        return run_command(args)  # rltok's own: one error line for a user's mistake
