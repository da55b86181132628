"""The research instruments: `rltok compare`, `scaling`, `diagnose`, `vocab`."""

from __future__ import annotations

import dataclasses
import json
import sys

from rltok.cli.model_commands import _load
from rltok.config import ConfigError



def has_learned_rule(model) -> bool:
    """Whether the model draws its boundaries with a policy the objective trains."""
    rule = getattr(model, "chunker", None)
    return rule is not None and rule.learned

def cmd_compare(args) -> int:
    import shlex
    from pathlib import Path

    from rltok.analysis.compare import method_config, reference_budget, run_sweep, write_report

    from rltok.cli.paths import check_output_folder

    out = check_output_folder(args.out, "--out")
    for m in args.methods:  # every method and its NAME@key=value overrides are checked before any run
        try:
            method_config(m, args.overrides, args.data, out, 0, args.preset)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    from rltok.data.corpus import resolve_split

    split = resolve_split(args.data, args.split, fallback=True)  # the split every number is really on
    if split != args.split:
        print(f"note: {args.data} has no {args.split!r} split: evaluating on {split!r}", file=sys.stderr)
    ref = method_config("rl", args.overrides, args.data, out, 0, args.preset)
    budget = reference_budget(ref, args.budget_bytes)
    print(f"budget: {budget:.3e} training FLOPs (= {args.budget_bytes:,} bytes of the hierarchical model "
          f"at rate {ref.model.target_rate})", file=sys.stderr)
    results = run_sweep(args.data, args.methods, args.seeds, out, budget, args.overrides, args.preset,
                        split, args.max_eval_windows, log=lambda m: print(m, file=sys.stderr),
                        eval_context=args.eval_context)
    command = "rltok " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if args.command_line is None else args.command_line
    # the report covers every finished run in the folder (earlier invocations with other seeds too)
    names = {(r["method"], r["seed"]) for r in results}
    for path in sorted(out.glob("*_s*.json")):
        r = json.loads(path.read_text())
        if (r["method"], r["seed"]) not in names:
            results.append(r)
    report = write_report(results, out, args.title or f"{Path(args.data).name} ({split} split)", command)
    print(report.read_text())
    return 0


def cmd_scaling(args) -> int:
    """The isoFLOP study of a grid file: the runs not done yet, then the fits and plots per corpus."""
    from rltok.analysis.scaling import fit_corpus, load_grid, study_table
    from rltok.analysis.scaling_adapt import run_grid
    from rltok.cli.paths import check_output_folder

    out = check_output_folder(args.out, "--out")
    grid = load_grid(args.grid)
    if args.corpus:  # one corpus per process: two processes run a grid's corpora side by side
        if args.predict:
            raise ConfigError("--predict fits every corpus into one prediction file, written once: drop --corpus")
        if args.corpus not in grid.corpora:
            raise ConfigError(f"--corpus {args.corpus}: the grid's corpora are {', '.join(grid.corpora)}")
        grid = dataclasses.replace(grid, corpora={args.corpus: grid.corpora[args.corpus]})

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    if args.status:
        from rltok.analysis.scaling_status import holdout_status, holdout_table, status_table, study_status

        print(status_table(study_status(grid, out)))
        held = holdout_status(grid, out)
        if held:
            print(f"\n{holdout_table(held)}")
        return 0
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
        from rltok.analysis.scaling_check import check_markdown, parse_variant, run_optimum_check

        variants = [parse_variant(v) for v in args.variant]
        result = run_optimum_check(grid, out, args.check_optimum, tuple(args.lr_mults), variants, args.tolerance,
                                   log, command=_scaling_command(args))
        print(check_markdown(result))
        return 0
    if args.variant or args.lr_mults != [0.5, 2.0]:
        raise ConfigError("--variant and --lr-mults go with --check-optimum")
    if not args.fit_only:
        run_grid(grid, out, log)
    for corpus in grid.corpora:
        folder = out / corpus
        if not folder.is_dir():
            log(f"{corpus}: no runs yet")
            continue
        study = fit_corpus(folder, grid.n_boot, grid.groups, grid.crossovers, _scaling_command(args),
                           budgets=grid.budgets, interior_only=grid.interior_only,  # holdout budgets stay out
                           fit_from=grid.fit_from)
        print(f"## {corpus}\n\n{study_table(study)}\n\nfits, plots and report: {folder / 'report.md'}\n")
    if args.fit_only:
        from rltok.analysis.scaling_status import unfinished_budgets

        for corpus, budget in unfinished_budgets(grid, out):
            log(f"note: {corpus} {budget:.3g} is not complete: its fits in report.md are provisional "
                "(a partial ladder fits its own parabola)")
    return 0


def _scaling_holdout(args, grid, out, log) -> int:
    """`rltok scaling --predict` / `--holdout`: the prediction held out from the fit, and its test."""
    from rltok.analysis.scaling_holdout import (forecast_grid, forecast_table, prediction_name, run_forecast_score,
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
    from rltok.analysis.scaling_summary import paired_table

    scores, paired = run_holdout(grid, out, log)
    print(score_table(scores))
    for budget in grid.holdout_budgets:
        table = paired_table({c: {"paired": rows} for c, rows in paired.items()}, budget)
        if table:
            print(f"\nAt {budget:.3g} FLOPs, each side at its predicted size, paired by seed (test bpb, a − b, "
                  f"mean [95% t interval] (seeds)):\n\n{table}")
    print(f"\nscores: {out / 'prediction_score.json'}")
    return 0


def _scaling_command(args) -> str:
    """The command that regenerates a corpus's fits and report.md (written into it)."""
    import shlex

    words = ["rltok", "scaling", "--grid", str(args.grid), "--out", str(args.out),
             *(["--corpus", args.corpus] if args.corpus else [])]
    if getattr(args, "check_optimum", None) is not None:
        words += ["--check-optimum", f"{args.check_optimum:g}", "--lr-mults", *(f"{m:g}" for m in args.lr_mults),
                  *(w for v in args.variant for w in ("--variant", v)), "--tolerance", f"{args.tolerance:g}",
                  *(["--family", *args.family] if getattr(args, "family", None) else [])]
    return shlex.join(words + (["--fit-only"] if args.fit_only else []))


def cmd_diagnose(args) -> int:
    from pathlib import Path

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes
    from rltok.analysis.diagnose import checkpoint_lexicon, diagnose, known_variants, markdown

    if args.out:  # before hours of computing, not after
        from rltok.cli.paths import check_output_file

        check_output_file(args.out, "--out")
    if args.true_advantage:
        return _diagnose_true_advantage(args)
    if args.lexicon_costs:
        return _diagnose_lexicon_costs(args)
    known = known_variants(args.objective)
    for v in args.variants or []:
        if v not in known:
            raise ConfigError(f"unknown variant {v!r}; choose from {', '.join(known)}")
        k = known[v].get("group_size", 1)
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
    data = load_eval_bytes(args.data or cfg.data.train, args.split, val_fraction=cfg.data.val_fraction)
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


def _diagnose_true_advantage(args) -> int:
    """`rltok diagnose --true-advantage`: what a boundary at t does to the loss, per byte class,
    and how well the estimators' advantages track it."""

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes
    from rltok.analysis.true_advantage import format_true_advantage, true_advantage

    if args.per_class < 1 or args.variant_batch < 1 or args.batch < 1:
        raise ConfigError("--per-class, --variant-batch and --batch must be >= 1")
    if args.horizon is not None and args.horizon < 0:
        raise ConfigError("--horizon must be >= 0")
    model, cfg, ckpt, device = _load(args)
    if not getattr(model, "hierarchical", False):
        raise ConfigError("--true-advantage needs a checkpoint of the hierarchical (hourglass) model")
    if model.cfg.stages == 2:
        raise ConfigError("--true-advantage does not support two-stage (model.stages=2) checkpoints")
    spec = args.data or cfg.data.train
    data = load_eval_bytes(spec, args.split, val_fraction=cfg.data.val_fraction)
    x, y = eval_windows(data, args.seq_len or cfg.train.seq_len, args.batch)
    if x.shape[1] < 3:
        raise ConfigError("windows of at least 3 bytes are needed; raise --seq-len or give more data")
    result = true_advantage(model, x.to(device), y.to(device), cfg.objective, n_per_class=args.per_class,
                            horizon=args.horizon, batch_size=args.variant_batch, seed=args.seed)
    result.update(checkpoint=str(ckpt), data=spec, split=args.split)
    return _write_and_print(result, args.out, format_true_advantage)


def _write_and_print(result: dict, out: str | None, render) -> int:
    """An instrument's result: as JSON to `out` when given, as a table on stdout."""
    if out:
        from pathlib import Path

        Path(out).write_text(json.dumps(result, indent=2))
        print(f"wrote {out}", file=sys.stderr)
    print(render(result))
    return 0


def _diagnose_lexicon_costs(args) -> int:
    """`rltok diagnose --lexicon-costs`: where a lexicon-trained policy cuts and what flipping each
    decision changes in the lexicon's code length, per byte class."""

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes
    from rltok.analysis.diagnose import checkpoint_lexicon
    from rltok.analysis.lexicon_costs import format_lexicon_costs, lexicon_costs_by_class

    model, cfg, ckpt, device = _load(args)
    if not has_learned_rule(model):
        raise ConfigError("--lexicon-costs needs a checkpoint of the hierarchical model with a learned boundary "
                          "policy (rl)")
    lexicon = checkpoint_lexicon(ckpt, cfg, device)
    spec = args.data or cfg.data.train
    x, _ = eval_windows(load_eval_bytes(spec, args.split, val_fraction=cfg.data.val_fraction),
                        args.seq_len or cfg.train.seq_len, args.batch)
    result = lexicon_costs_by_class(model, lexicon, x.to(device), seed=args.seed)
    result.update(checkpoint=str(ckpt), data=spec, split=args.split, windows=list(x.shape))
    return _write_and_print(result, args.out, format_lexicon_costs)


def cmd_vocab(args) -> int:
    from rltok.analysis.vocab import load_vocab_data, vocab_report
    from rltok.analysis.vocab_render import print_report, write_json, write_markdown

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
    result.update(checkpoint=str(ckpt), data=spec, split=args.split)
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
