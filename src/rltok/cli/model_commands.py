"""The commands that use a trained model: `rltok eval`, `segment`, `generate`, `lm-eval`."""

from __future__ import annotations

import json
import sys

from rltok.config import ConfigError

MAX_COUNT = (1 << 31) - 1  # sizes and counts: torch indexes with int64, but nothing sane is larger


def cmd_lm_eval(args) -> int:
    from rltok.harness.lm_eval_adapter import main as lm_eval_main

    return lm_eval_main(args.lm_eval_args)


def _device(args):
    """The device --device names, with torch's CPU threads set from --threads."""
    import torch

    from rltok.training.device import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    return resolve_device(args.device)


def _load(args):
    from rltok.training.loading import load_checkpoint, refuse_non_finite

    device = _device(args)
    model, cfg, _, ckpt = load_checkpoint(args.checkpoint, device=device)
    refuse_non_finite(model, ckpt)
    model.eval()
    return model, cfg, ckpt, device


def cmd_eval(args) -> int:
    from rltok.harness.run_eval import evaluate_run

    run = evaluate_run(args.checkpoint, args.data, args.split, fallback_to_val=args.fallback_to_val,
                       max_bytes=args.max_bytes, seq_len=args.seq_len or None, max_windows=args.max_windows,
                       context=args.context, batch_size=args.batch_size, mode=args.mode, seed=args.seed,
                       device=_device(args), code_metrics=args.code, forced_split=args.forced_split,
                       progress=sys.stderr.isatty())
    if run.split != args.split:
        print(f"note: {run.data} has no {args.split!r} split: evaluating on {run.split!r}", file=sys.stderr)
    result = run.summary()
    if not args.hist:
        result.pop("chunk_length_hist", None)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}, indent=2))
    return 0


def cmd_segment(args) -> int:
    from rltok.cli.paths import check_output_file, read_input
    from rltok.data.sources import DataError
    from rltok.model.segment import print_colored, render_pipes, segment_boundaries, split_chunks

    if args.text is None and args.file is None:
        raise ConfigError("give a text to segment, or --file PATH ('-' for stdin)")
    for flag, out in (("--html", args.html), ("--png", args.png)):
        if out:
            check_output_file(out, flag)
    data = read_input(args.file, "input file") if args.file is not None else args.text.encode("utf-8", "surrogateescape")
    if args.max_bytes:
        data = data[: args.max_bytes]
    if not data:
        raise DataError("nothing to segment: the input is empty")
    model, cfg, _, device = _load(args)
    if not hasattr(model, "chunker") and not model.reads_tokens:
        raise ConfigError(f"segment shows where a model ends its chunks; {args.checkpoint} is a {type(model).__name__} "
                          f"(model.arch={cfg.model.arch}), which reads bytes one at a time and draws none")
    b, probs = segment_boundaries(model, data, mode=args.mode, seed=args.seed, device=device)
    chunks = split_chunks(data, b)
    use_color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if use_color:
        print_colored(chunks)
    else:
        print(render_pipes(chunks, args.sep))
    n = len(data)
    # the rate as everywhere else: boundaries over the positions the rule decides (not the first, not the last)
    rate = f"; rate {float(b[1:-1].float().mean()):.3f} over the {n - 2} positions the rule decides" if n > 2 else ""
    print(f"\n{len(chunks)} chunks over {n} bytes ({n / len(chunks):.2f} bytes per chunk){rate}", file=sys.stderr)
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
    """Stop strings from the shell: \\n, \\t, \\r, \\\\ and \\xNN escapes become bytes; any other
    backslash is refused (a mistyped escape would otherwise be a stop string never produced)."""
    import re

    simple = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\"}

    def one(m: re.Match) -> bytes:
        e = m.group(1).decode("utf-8", errors="surrogateescape")
        if re.fullmatch(r"x[0-9a-fA-F]{2}", e):
            return bytes([int(e[1:], 16)])
        if e in simple:
            return simple[e]
        what = f"unknown escape '\\{e}'" if e else "a backslash at the end"
        raise ConfigError(f"--stop '{s}': {what}; escapes are \\n, \\t, \\r, \\xNN (two hex digits) and \\\\ "
                          "for a backslash")

    return re.sub(rb"\\(x[0-9a-fA-F]{0,2}|.|$)", one, s.encode("utf-8", errors="surrogateescape"), flags=re.DOTALL)


def cmd_generate(args) -> int:
    import time

    from rltok.model.generate import GenerationError, Utf8Streamer, check_args, context_length, generate

    if args.text is not None and args.prompt_file is not None:
        raise ConfigError("give a prompt or --prompt-file, not both")
    if args.max_bytes < 0:  # named as the user typed it, not as the API calls it
        raise ConfigError(f"-n/--max-bytes must be >= 0, got {args.max_bytes}")
    if args.max_bytes > MAX_COUNT:
        raise ConfigError(f"-n/--max-bytes must be at most {MAX_COUNT}, got {args.max_bytes}")
    try:  # before loading anything: bad arguments should fail fast
        check_args(args.max_bytes, args.temperature, args.top_k, args.top_p, args.mode)
    except GenerationError as e:
        raise ConfigError(str(e)) from None
    stops = [_unescape(s) for s in args.stop]
    if args.prompt_file is not None:  # raw bytes: any byte string is a valid prompt
        from rltok.cli.paths import read_input

        prompt = read_input(args.prompt_file, "prompt file")
    else:
        prompt = (args.text or "").encode("utf-8", errors="surrogateescape")
    model, cfg, _, _ = _load(args)
    if not hasattr(model, "start_decoding"):
        raise ConfigError(f"generate writes bytes one at a time; {args.checkpoint} is a {type(model).__name__} "
                          f"(model.arch={cfg.model.arch}), which predicts tokens, not bytes: generate with a "
                          "byte-level model (model.arch=hourglass or flat)")
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
                          top_p=args.top_p, seed=args.seed, stop=stops,
                          mode=args.mode, on_bytes=lambda _, data: out.write(data))
        out.close()
        if sys.stdout.isatty() and not result.output.endswith(b"\n"):
            print()
    except GenerationError as e:  # (a closed pipe, piped into `head`, is run_command's to handle)
        raise ConfigError(str(e)) from None
    secs = time.perf_counter() - start
    n = len(result.output)
    print(f"[{n} bytes in {secs:.2f} s ({n / max(secs, 1e-9):.0f} bytes/s), stop: {result.stop_reason}]",
          file=sys.stderr)
    return 0
