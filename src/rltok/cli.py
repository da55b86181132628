"""Command line: `rltok train`, `rltok prepare`, `rltok eval`, `rltok segment`, `rltok generate`,
`rltok presets`, `rltok export`, `rltok lm-eval` ...
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from rltok.config import PRESETS, ConfigError, load_config

# `rltok --help` and `rltok presets` load no torch: every module that needs it is imported by the
# command that uses it. The user errors of modules not loaded cannot have been raised.
_ERROR_CLASSES = (("rltok.data.sources", "DataError"), ("rltok.training.checkpoint", "CheckpointError"))


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions that end a command with one `error:` line: ConfigError, DataError, CheckpointError."""
    return (ConfigError, *(getattr(sys.modules[m], n) for m, n in _ERROR_CLASSES if m in sys.modules))


def __getattr__(name: str):
    if name == "USER_ERRORS":  # the full tuple, for callers that want it (loads its modules)
        from rltok.data.sources import DataError
        from rltok.training.checkpoint import CheckpointError

        return (ConfigError, DataError, CheckpointError)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, e.g. train.max_steps=2000 model.d_chunk=384")
    p.add_argument("--preset", default=None, help=f"named preset ({', '.join(PRESETS)}); default: tiny "
                                                  "(with --resume: the run's own saved config)")
    p.add_argument("--config", help="JSON or TOML config file applied on top of the preset")
    p.add_argument("--data", help="training data: 'stdlib' (default), a file, a folder, a glob or hf:name")
    p.add_argument("--out", help="run folder (checkpoints, metrics.jsonl); default runs/default")
    p.add_argument("--steps", type=int, help="shorthand for train.max_steps")


def cmd_train(args) -> int:
    from rltok.training.trainer import TrainingDiverged, train

    overrides = list(args.overrides)
    if args.data is not None:  # `--data ""` is an error, not the default corpus
        overrides.append(f"data.train={args.data}")
    if args.out is not None:
        overrides.append(f"train.out_dir={args.out}")
    if args.steps is not None:  # so `--steps 0` is refused rather than ignored
        overrides.append(f"train.max_steps={args.steps}")
    if args.list_presets:
        return cmd_presets(argparse.Namespace(name=None))
    saved = None
    if args.resume:  # continue the run the folder holds, from its own saved config and data
        from rltok.training import run_folder

        run_dir = args.out if args.out is not None else _last_override(overrides, "train.out_dir")
        saved = run_folder.saved_config(run_dir or "runs/default")
    if saved is not None:
        cfg = run_folder.resume_config(run_dir or "runs/default", saved, args.preset, args.config, overrides,
                                       allow_change=args.allow_config_change)
    else:
        cfg = load_config(args.preset or "tiny", args.config, overrides)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    from rltok.training import distributed

    try:
        result = train(cfg, resume=args.resume)
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    main_rank = distributed.is_main_process()
    distributed.shutdown()  # a no-op in one process; under torchrun a clean exit of every rank
    if not main_rank:  # rank 0 alone prints the summary
        return 0
    val = result.val
    if val:
        summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in val.items() if k != "chunk_length_hist"}
        print(json.dumps({"step": result.step, "run_dir": str(result.run_dir), **summary}))
    return 0


def _last_override(overrides: list[str], key: str) -> str | None:
    values = [ov.split("=", 1)[1].strip() for ov in overrides if "=" in ov and ov.split("=", 1)[0].strip() == key]
    return values[-1] if values else None


def _size(text: str) -> int:
    """'256M', '64k', '1G' or a plain number of bytes."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)i?[bB]?\s*", text)
    if not m:
        raise ConfigError(f"not a size: {text!r} (e.g. 256M, 64k, 1G or a number of bytes)")
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()])


def cmd_prepare(args) -> int:
    """`rltok prepare SRC --out DIR`: byte shards + manifest; `rltok prepare --verify DIR` checks them."""
    from rltok.data.prepare import prepare, summary
    from rltok.data.shards import verify_prepared

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if args.out is None:
        if not args.verify:
            raise ConfigError("give --out DIR (the folder to write), or --verify DIR to check a prepared folder")
        checked = verify_prepared(args.source, log=log)
        print(json.dumps({**summary(args.source), "verified_bytes": checked["bytes"]}))
        return 0
    if args.num_proc < 1:
        raise ConfigError("--num-proc must be >= 1")
    try:
        out = prepare(args.source, args.out, val=args.val, val_fraction=args.val_fraction, max_bytes=args.max_bytes,
                      text_field=args.text_field, shard_bytes=_size(args.shard_size), num_proc=args.num_proc,
                      progress=not args.quiet, log=log)
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to resume the preparation of {args.out}", file=sys.stderr)
        return 130
    result = summary(out)
    if args.verify:
        result["verified_bytes"] = verify_prepared(out, log=log)["bytes"]
    print(json.dumps(result))
    return 0


# Parameters of each preset's model, so that `rltok presets` answers without loading torch;
# tests/test_faults.py counts them on the meta device and fails when one goes stale. A preset
# missing here is counted (loading torch).
PRESET_PARAMS = {"tiny": 4496001, "small": 1663201, "test": 103585, "nl-147m": 145340673, "code-90m": 90868993}


def count_params(name: str) -> int | None:
    """A preset's parameter count, built on the meta device (no memory, no time besides torch's
    import); None when data-fitted parts (BPE) need training bytes."""
    import torch

    from rltok.model.factory import build_model

    try:
        with torch.device("meta"):
            return build_model(load_config(name).model).num_params()
    except ValueError:
        return None


def cmd_presets(args) -> int:
    """The named presets with their size, or one preset's resolved config."""
    from rltok.config import PRESET_NOTES

    if args.name:
        print(json.dumps(load_config(args.name).to_dict(), indent=2))
        return 0
    print(f"{'preset':<10} {'params':>8}  {'byte d x layers':<16} {'chunk d x layers':<17} {'seq':>5} {'batch':>5}  "
          f"{'dtype':<5} description")
    for name in PRESETS:
        cfg = load_config(name)
        m, t = cfg.model, cfg.train
        count = PRESET_PARAMS[name] if name in PRESET_PARAMS else count_params(name)
        n = "?" if count is None else f"{count / 1e6:.1f}M"
        print(f"{name:<10} {n:>8}  {f'{m.d_byte} x {m.encoder_layers}+{m.decoder_layers}':<16} "
              f"{f'{m.d_chunk} x {m.main_layers}':<17} {t.seq_len:>5} {t.batch_size:>5}  {t.dtype:<5} "
              f"{PRESET_NOTES.get(name, '')}")
    print("\nuse: rltok train --preset NAME [section.key=value ...]; details: rltok presets NAME", file=sys.stderr)
    return 0


def _run_results(ckpt, cfg) -> dict:
    """Validation results logged up to the checkpoint's step, from its run's metrics.jsonl."""
    from rltok.training.checkpoint import checkpoint_step, run_results

    try:
        step = checkpoint_step(ckpt)
    except ValueError:  # a model folder, not a checkpoint of a run
        return {}
    return run_results(ckpt.parent.parent, step)


def cmd_export(args) -> int:
    from rltok.training.checkpoint import load_checkpoint
    from rltok.training.hub import push_to_hub, save_pretrained

    model, cfg, _, ckpt = load_checkpoint(args.checkpoint)
    results = _run_results(ckpt, cfg)
    if args.out:
        out = save_pretrained(model, args.out, cfg, results)
        print(f"wrote {out} (model.safetensors, config.json, README.md) from {ckpt}", file=sys.stderr)
    if args.push_to_hub:
        url = push_to_hub(model, args.push_to_hub, cfg, results, private=args.private)
        print(f"pushed to {url}", file=sys.stderr)
    if not args.out and not args.push_to_hub:
        raise ConfigError("give --out FOLDER and/or --push-to-hub REPO_ID")
    print(json.dumps({"checkpoint": str(ckpt), **results}))
    return 0


def cmd_lm_eval(args) -> int:
    from rltok.eval.lm_eval_adapter import main as lm_eval_main

    return lm_eval_main(args.lm_eval_args)


def _load(args):
    import torch

    from rltok.training.checkpoint import load_checkpoint
    from rltok.training.device import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, cfg, _, ckpt = load_checkpoint(args.checkpoint, device=device)
    model.eval()
    return model, cfg, ckpt, device


def cmd_eval(args) -> int:
    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes, resolve_split
    from rltok.training.evaluate import evaluate
    from rltok.data.python_tokens import looks_like_python

    if args.data is not None:  # a wrong split fails before the model loads
        resolve_split(args.data, args.split, args.fallback_to_val)
    model, cfg, ckpt, device = _load(args)
    spec = args.data or cfg.data.train
    split = resolve_split(spec, args.split, args.fallback_to_val)
    if split != args.split:
        print(f"note: {spec} has no {args.split!r} split: evaluating on {split!r}", file=sys.stderr)
    data = load_eval_bytes(spec, split, args.max_bytes, cfg.data.val_fraction)
    seq_len = args.seq_len or cfg.train.seq_len
    x, y = eval_windows(data, seq_len, args.max_windows)
    code = args.code if args.code is not None else looks_like_python(spec)
    result = evaluate(model, x, y, batch_size=args.batch_size, mode=args.mode, seed=args.seed, device=device,
                      code_metrics=code)
    result.update(checkpoint=str(ckpt), data=spec, split=split, seq_len=x.shape[1], mode=args.mode)
    if split != args.split:
        result["split_requested"] = args.split
    if not args.hist:
        result.pop("chunk_length_hist", None)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}, indent=2))
    return 0


def cmd_segment(args) -> int:
    from rltok.data.sources import read_user_text
    from rltok.model.segment import print_colored, render_pipes, segment_boundaries, split_chunks

    if args.text is None and args.file is None:
        raise ConfigError("give a text to segment, or --file PATH ('-' for stdin)")
    data = read_user_text(args.text, args.file)
    if args.max_bytes:
        data = data[: args.max_bytes]
    if not data:
        from rltok.data.sources import DataError

        raise DataError("nothing to segment: the input is empty")
    model, _, _, device = _load(args)
    b, probs = segment_boundaries(model, data, mode=args.mode, seed=args.seed, device=device)
    chunks = split_chunks(data, b)
    use_color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if use_color:
        print_colored(chunks)
    else:
        print(render_pipes(chunks, args.sep))
    n = len(data)
    print(f"\n{len(chunks)} chunks over {n} bytes: rate {len(chunks) / n:.3f}, "
          f"{n / len(chunks):.2f} bytes per chunk", file=sys.stderr)
    if args.html or args.png:
        _write_heatmaps(args, data, b.tolist(), probs)
    return 0


def _write_heatmaps(args, data: bytes, flags: list[bool], probs) -> None:
    from rltok.analysis.heatmap import write_html, write_png

    if args.html:
        write_html(args.html, data, probs, flags)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--png needs matplotlib: pip install 'rltok[plot]'") from None
        write_png(args.png, data, probs, flags)
        print(f"wrote {args.png}", file=sys.stderr)


def _unescape(s: str) -> bytes:
    """Stop strings from the shell: \\n, \\t, \\r, \\\\ and \\xNN escapes become bytes."""
    import re

    simple = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\"}

    def one(m: re.Match) -> bytes:
        e = m.group(1).decode()
        return bytes([int(e[1:], 16)]) if e[0] == "x" else simple[e]

    return re.sub(rb"\\(x[0-9a-fA-F]{2}|[ntr\\])", one, s.encode("utf-8", errors="surrogateescape"))


def cmd_generate(args) -> int:
    import time

    from rltok.model.generate import GenerationError, Utf8Streamer, check_args, context_length, generate

    if args.text is not None and args.prompt_file is not None:
        raise ConfigError("give a prompt or --prompt-file, not both")
    try:  # before loading anything: bad arguments should fail fast
        check_args(args.max_bytes, args.temperature, args.top_k, args.top_p, args.mode)
    except GenerationError as e:
        raise ConfigError(str(e)) from None
    if args.prompt_file == "-":
        prompt = sys.stdin.buffer.read()
    elif args.prompt_file is not None:
        try:
            with open(args.prompt_file, "rb") as f:  # raw bytes: any byte string is a valid prompt
                prompt = f.read()
        except OSError as e:
            from rltok.data.sources import DataError

            raise DataError(f"cannot read prompt file {args.prompt_file}: {e.strerror}") from None
    else:
        prompt = (args.text or "").encode("utf-8", errors="surrogateescape")
    model, _, _, _ = _load(args)
    max_len = context_length(model)
    if not prompt:
        print("note: empty prompt, generating from a newline", file=sys.stderr)
    elif len(prompt) > max_len:
        print(f"note: the prompt has {len(prompt)} bytes, more than the model's context of {max_len}: "
              f"keeping the last {max_len}", file=sys.stderr)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # a non-UTF-8 terminal must not crash us
    out = Utf8Streamer(sys.stdout)
    if args.echo:
        out.write(prompt)
    start = time.perf_counter()
    try:
        result = generate(model, prompt, args.max_bytes, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, stop=[_unescape(s) for s in args.stop],
                          mode=args.mode, on_bytes=lambda _, data: out.write(data))
        out.close()
        if sys.stdout.isatty() and not result.output.endswith(b"\n"):
            print()
    except GenerationError as e:
        raise ConfigError(str(e)) from None
    except BrokenPipeError:  # e.g. piped into `head`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    secs = time.perf_counter() - start
    n = len(result.output)
    print(f"[{n} bytes in {secs:.2f} s ({n / max(secs, 1e-9):.0f} bytes/s), stop: {result.stop_reason}]",
          file=sys.stderr)
    return 0


def cmd_compare(args) -> int:
    import shlex
    from pathlib import Path

    from rltok.analysis.compare import method_config, run_sweep, write_report
    from rltok.model.flops import hourglass_flops, train_flops_per_byte

    out = Path(args.out)
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
    budget = args.budget_bytes * train_flops_per_byte(hourglass_flops(ref.model, ref.train.seq_len))
    print(f"budget: {budget:.3e} training FLOPs (= {args.budget_bytes:,} bytes of the hierarchical model "
          f"at rate {ref.model.target_rate})", file=sys.stderr)
    results = run_sweep(args.data, args.methods, args.seeds, out, budget, args.overrides, args.preset,
                        split, args.max_eval_windows, log=lambda m: print(m, file=sys.stderr))
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


def cmd_diagnose(args) -> int:
    from pathlib import Path

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes
    from rltok.analysis.diagnose import checkpoint_lexicon, diagnose, known_variants, markdown

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
    if model.__class__.__name__ != "HourglassLM" or model.cfg.chunker != "rl":
        raise ConfigError("diagnose needs a checkpoint of the hierarchical model with the rl chunker")
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
    from pathlib import Path

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes
    from rltok.analysis.true_advantage import format_true_advantage, true_advantage

    if args.per_class < 1 or args.variant_batch < 1 or args.batch < 1:
        raise ConfigError("--per-class, --variant-batch and --batch must be >= 1")
    if args.horizon is not None and args.horizon < 0:
        raise ConfigError("--horizon must be >= 0")
    model, cfg, ckpt, device = _load(args)
    if model.__class__.__name__ != "HourglassLM":
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
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}", file=sys.stderr)
    print(format_true_advantage(result))
    return 0


def _diagnose_lexicon_costs(args) -> int:
    """`rltok diagnose --lexicon-costs`: where a lexicon-trained policy cuts and what flipping each
    decision changes in the lexicon's code length, per byte class."""
    from pathlib import Path

    from rltok.data.windows import eval_windows
    from rltok.data.corpus import load_eval_bytes
    from rltok.analysis.diagnose import checkpoint_lexicon
    from rltok.analysis.lexicon_costs import format_lexicon_costs, lexicon_costs_by_class

    model, cfg, ckpt, device = _load(args)
    if model.__class__.__name__ != "HourglassLM" or model.cfg.chunker != "rl":
        raise ConfigError("--lexicon-costs needs a checkpoint of the hierarchical model with the rl chunker")
    lexicon = checkpoint_lexicon(ckpt, cfg, device)
    spec = args.data or cfg.data.train
    x, _ = eval_windows(load_eval_bytes(spec, args.split, val_fraction=cfg.data.val_fraction),
                        args.seq_len or cfg.train.seq_len, args.batch)
    result = lexicon_costs_by_class(model, lexicon, x.to(device), seed=args.seed)
    result.update(checkpoint=str(ckpt), data=spec, split=args.split, windows=list(x.shape))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}", file=sys.stderr)
    print(format_lexicon_costs(result))
    return 0


def cmd_vocab(args) -> int:
    from rltok.analysis.vocab import load_vocab_data, vocab_report
    from rltok.analysis.vocab_render import print_report, write_json, write_markdown

    if args.max_bytes < 0 or args.top < 1 or args.batch_size < 1 or args.bpe_sample_bytes < 1:
        raise ConfigError("--top, --batch-size and --bpe-sample-bytes must be >= 1, --max-bytes >= 0")
    model, cfg, ckpt, device = _load(args)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rltok", description="Byte-level LMs that learn their own tokenization with RL.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model (defaults: the stdlib corpus, a few minutes on 2 CPU cores)")
    _add_config_args(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest valid checkpoint, with the run's own saved "
                        "config and data; only train.max_steps, logging/eval/checkpoint cadence, threads, "
                        "device and tensorboard/wandb may be given again")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: continue even though other config keys differ from the run's")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--list-presets", action="store_true", help="list the named presets and exit")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "prepare", help="write a corpus once as byte shards that training reads without loading it",
        description="Read a source (file, folder, glob, archives, 'stdlib', hf:NAME[:CONFIG][@SPLIT], "
                    "hf:json:PATH / hf:parquet:PATH, a save_to_disk folder as hf:PATH) and write its "
                    "train/val(/test) byte streams as shards with a document index and a manifest. The "
                    "splits are those `rltok train --data SRC` makes in memory. Re-running is a no-op; "
                    "an interrupted run resumes. Then: rltok train --data DIR.")
    p.add_argument("source", help="the data to prepare (or, with --verify and no --out, a prepared folder)")
    p.add_argument("--out", "-o", help="folder to write (new or empty, or an unfinished preparation to resume)")
    p.add_argument("--val", default="", help="explicit validation source (default: the folder's val.* files, "
                                             "else whole held-out documents)")
    p.add_argument("--val-fraction", type=float, default=0.02, help="share of the bytes held out (default 0.02)")
    p.add_argument("--max-bytes", type=int, default=0, help="read at most this many bytes of the source (0 = all)")
    p.add_argument("--text-field", default="text", help="hub datasets: the record field holding the text")
    p.add_argument("--shard-size", default="256M", help="bytes per shard, e.g. 256M (default), 64k, 1G")
    p.add_argument("--num-proc", type=int, default=1,
                   help="processes reading and decompressing files in parallel (local files; default 1)")
    p.add_argument("--verify", action="store_true", help="check every shard's SHA-256 against the manifest")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("presets", help="list the named config presets (size, shape, purpose)")
    p.add_argument("name", nargs="?", help="print this preset's full resolved config")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("export", help="write a checkpoint as a Hub-style model folder (safetensors, config, model card)")
    p.add_argument("--checkpoint", "-c", default="runs/default", help="checkpoint or run folder (newest checkpoint)")
    p.add_argument("--out", "-o", help="folder to write (model.safetensors, config.json, README.md)")
    p.add_argument("--push-to-hub", metavar="REPO_ID", help="also upload to this Hugging Face Hub repo (network, token)")
    p.add_argument("--private", action="store_true", help="create the Hub repo private")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("lm-eval", add_help=False,
                       help="lm-evaluation-harness with the 'rltok' model (needs rltok[eval]); arguments go to lm_eval")
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_lm_eval)

    def add_model_args(q):
        q.add_argument("--checkpoint", "-c", default="runs/default", help="checkpoint or run folder (newest checkpoint)")
        q.add_argument("--device", default="auto")
        q.add_argument("--threads", type=int, default=0)
        q.add_argument("--mode", choices=("sample", "greedy"), default=None,
                       help="boundary decisions: sampled from the policy or thresholded at p=0.5")
        q.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("eval", help="bpb, boundary rate, bytes per chunk and whitespace alignment on any data")
    add_model_args(p)
    p.add_argument("--data", help="data to evaluate (default: the training source); a split folder uses --split")
    p.add_argument("--split", default="val", help="val (held-out part, default), test (split folders and prepared "
                                                  "folders that have one), train or all; a split the data lacks is "
                                                  "an error")
    p.add_argument("--fallback-to-val", action="store_true",
                   help="evaluate on val when the data has no such split (the output's split names the one used)")
    p.add_argument("--seq-len", type=int, default=0, help="window length (default: training seq_len)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-windows", type=int, default=0, help="evaluate on at most this many windows (0 = all)")
    p.add_argument("--max-bytes", type=int, default=0, help="read at most this many bytes")
    p.add_argument("--hist", action="store_true", help="include the chunk-length histogram")
    p.add_argument("--code", action=argparse.BooleanOptionalAction, default=None,
                   help="report token_end_* and token_start_* precision/chance/recall (chunk ends at Python "
                        "token ends, or one byte late: on the byte that starts the next token); default: "
                        "on when the data is Python source ('stdlib', .py files)")
    p.set_defaults(func=cmd_eval, default_mode="sample")

    p = sub.add_parser("segment", help="show how a trained model chunks a text")
    add_model_args(p)
    p.add_argument("text", nargs="?", help="text to segment (UTF-8)")
    p.add_argument("--file", "--prompt-file", "-f", dest="file",
                   help="read the bytes from a file ('-' for stdin); --prompt-file is the same (as in generate)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--sep", default="|", help="separator printed between chunks without colour")
    p.add_argument("--max-bytes", type=int, default=0)
    p.add_argument("--html", metavar="OUT.html", help="also write an HTML heat map of per-byte boundary probabilities")
    p.add_argument("--png", metavar="OUT.png", help="also write a PNG heat map (needs matplotlib)")
    p.set_defaults(func=cmd_segment, default_mode="sample")

    p = sub.add_parser(
        "generate", help="sample a continuation (cached decoding, streamed as it is produced)",
        description="Sample a continuation of a prompt with cached incremental decoding: each byte's "
                    "boundary decision is made once and kept. Output is streamed; bytes of an incomplete "
                    "UTF-8 character are held until it is complete (invalid bytes print as \\xNN).",
        epilog="Prompt rules: an empty prompt starts generation from a newline (b'\\n') as context. A prompt "
               "longer than the model's max_seq_len keeps only its last max_seq_len bytes. Positions are "
               "absolute, so when prompt + generated bytes reach max_seq_len the context slides: its oldest "
               "half is dropped and the rest re-read with the boundaries it already had, and generation "
               "goes on. Prompts are bytes: any byte string (also invalid UTF-8) is a valid prompt.")
    add_model_args(p)
    p.add_argument("text", nargs="?", help="prompt (UTF-8); empty or omitted: start from a newline")
    p.add_argument("--prompt-file", "--file", "-f", dest="prompt_file",
                   help="read the prompt as raw bytes from a file ('-' for stdin); --file is the same (as in segment)")
    p.add_argument("--max-bytes", "-n", type=int, default=256, help="generate at most this many bytes (default 256)")
    p.add_argument("--temperature", "-t", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest bytes (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: smallest set with this mass (1 = off)")
    p.add_argument("--stop", action="append", default=[], metavar="STR",
                   help="stop when this string is produced (not printed); repeatable; \\n \\t \\xNN escapes work")
    p.add_argument("--echo", action="store_true", help="print the prompt before the continuation")
    p.set_defaults(func=cmd_generate, default_mode="sample")
    p = sub.add_parser("diagnose", help="variance, SNR and alignment of the boundary-policy gradient per variance reducer")
    add_model_args(p)
    p.add_argument("--data", help="data for the fixed batch (default: the training source)")
    p.add_argument("--split", default="val")
    p.add_argument("--batch", type=int, default=8, help="sequences in the fixed batch")
    p.add_argument("--seq-len", type=int, default=0)
    p.add_argument("--estimates", type=int, default=32, help="independent estimates per variant")
    p.add_argument("--reference", type=int, default=64, help="estimates averaged into the reference gradient")
    p.add_argument("--reference-group", type=int, default=8, help="segmentations per sequence in the reference")
    p.add_argument("--variants", nargs="+", help="subset of variants (default: all; with --objective lexicon, "
                                                 "those that apply)")
    p.add_argument("--objective", choices=["lm", "lexicon"], default="lm",
                   help="the gradient estimated: of the LM loss (default), or of the segmentation's code length "
                        "under the checkpoint's lexicon (what the lexicon recipe's policy is trained on)")
    p.add_argument("--out", "--json", dest="out", help="write the result as JSON")
    p.add_argument("--true-advantage", action="store_true",
                   help="instead: how much a boundary at t changes the loss (D_t = L(b_t=0) - L(b_t=1)) per "
                        "byte class, and each estimator's correlation with the true advantage")
    p.add_argument("--per-class", type=int, default=32, help="--true-advantage: positions per byte class")
    p.add_argument("--horizon", type=int, default=None,
                   help="--true-advantage: bytes after t whose loss counts (default: to the end of the window)")
    p.add_argument("--variant-batch", type=int, default=32, help="--true-advantage: rows per forward pass")
    p.add_argument("--lexicon-costs", action="store_true",
                   help="instead (lexicon-trained checkpoints): per byte class, how often the policy cuts and "
                        "what removing or adding one cut changes in the lexicon's code length")
    p.set_defaults(func=cmd_diagnose, default_mode="sample")

    p = sub.add_parser("compare", help="train several boundary rules at equal training FLOPs and tabulate them")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="base config overrides for every method")
    p.add_argument("--data", required=True, help="training data (a folder with train/val/test files is best)")
    p.add_argument("--methods", nargs="+", default=["rl", "hnet", "gumbel", "entropy", "whitespace", "bpe", "fixed",
                                                     "uniform", "flat", "bpe_token"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--budget-bytes", type=int, default=1_000_000,
                   help="budget in bytes of the hierarchical model at the target rate; every method gets "
                        "the same training FLOPs")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--split", default="test", help="held-out split to evaluate on (test or val)")
    p.add_argument("--max-eval-windows", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for per-run JSON, runs, the table and plots")
    p.add_argument("--title", default="")
    p.add_argument("--command-line", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("vocab", help="the learned vocabulary of a checkpoint on a corpus, against a BPE of the same rate")
    p.add_argument("checkpoint", help="checkpoint or run folder (newest checkpoint)")
    p.add_argument("--data", help="corpus: a file, folder, glob, 'stdlib' or hf:name (default: the training source)")
    p.add_argument("--split", default="test", help="test (default) or val of a split folder (else the validation "
                                                   "part the data loader holds out: whole documents, or the tail "
                                                   "of each when there are fewer than 20), or all (the whole source)")
    p.add_argument("--max-bytes", type=int, default=200_000, help="analyse the first N bytes of the split (default 200k; 0 = all)")
    p.add_argument("--mode", choices=("greedy", "sample"), default="sample",
                   help="boundary decisions: sampled with --seed (default: how the model trains and is "
                        "evaluated) or thresholded at p=0.5 (few boundaries where the policy is unsure)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=30, help="most frequent chunks to list (default 30)")
    p.add_argument("--bpe-pretokenize", choices=("line", "gpt2"), default="line",
                   help="BPE pre-tokenisation: line (tokens may span words; default) or gpt2 (within words)")
    p.add_argument("--bpe-sample-bytes", type=int, default=4_000_000,
                   help="bytes the BPE is trained on, random blocks of the train split (default 4M)")
    p.add_argument("--no-bpe", action="store_true", help="skip the BPE comparison")
    p.add_argument("--json", metavar="PATH", help="also write the full result as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write a markdown report")
    p.add_argument("--batch-size", type=int, default=16, help="windows per forward pass")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(func=cmd_vocab)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:  # everything after it belongs to lm_eval's own parser
        return cmd_lm_eval(argparse.Namespace(lm_eval_args=argv[1:]))
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse takes only one run of positionals, so overrides after options (`--data x
    # train.lr=1e-3`) arrive here; anything that is not an option is an override
    if extra and hasattr(args, "overrides") and not any(a.startswith("-") for a in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "mode", "unset") is None:
        args.mode = args.default_mode
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, so that a closed pipe is handled below and not at exit
        return code
    except BrokenPipeError:  # e.g. `rltok presets | head -1`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Exception as e:
        if not isinstance(e, user_errors()):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
