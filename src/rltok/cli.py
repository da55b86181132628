"""Command line: `rltok train`, `rltok eval`, `rltok segment`."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .checkpoint import CheckpointError
from .config import PRESETS, ConfigError, load_config
from .data import DataError

USER_ERRORS = (ConfigError, DataError, CheckpointError)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, e.g. train.max_steps=2000 model.d_chunk=384")
    p.add_argument("--preset", default="tiny", help=f"named preset ({', '.join(PRESETS)}); default: tiny")
    p.add_argument("--config", help="JSON or TOML config file applied on top of the preset")
    p.add_argument("--data", help="training data: 'stdlib' (default), a file, a folder, a glob or hf:name")
    p.add_argument("--out", help="run folder (checkpoints, metrics.jsonl); default runs/default")
    p.add_argument("--steps", type=int, help="shorthand for train.max_steps")


def cmd_train(args) -> int:
    from .train import TrainingDiverged, train

    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.train={args.data}")
    if args.out:
        overrides.append(f"train.out_dir={args.out}")
    if args.steps:
        overrides.append(f"train.max_steps={args.steps}")
    cfg = load_config(args.preset, args.config, overrides)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    try:
        result = train(cfg, resume=args.resume)
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    val = result.val
    if val:
        summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in val.items() if k != "chunk_length_hist"}
        print(json.dumps({"step": result.step, "run_dir": str(result.run_dir), **summary}))
    return 0


def _load(args):
    import torch

    from .checkpoint import load_checkpoint
    from .train import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, cfg, _, ckpt = load_checkpoint(args.checkpoint, device=device)
    model.eval()
    return model, cfg, ckpt, device


def cmd_eval(args) -> int:
    from .data import eval_windows, load_eval_bytes
    from .evaluate import evaluate

    model, cfg, ckpt, device = _load(args)
    spec = args.data or cfg.data.train
    data = load_eval_bytes(spec, args.split, args.max_bytes, cfg.data.val_fraction)
    seq_len = args.seq_len or cfg.train.seq_len
    x, y = eval_windows(data, seq_len, args.max_windows)
    result = evaluate(model, x, y, batch_size=args.batch_size, mode=args.mode, seed=args.seed, device=device)
    result.update(checkpoint=str(ckpt), data=spec, split=args.split, seq_len=x.shape[1], mode=args.mode)
    if not args.hist:
        result.pop("chunk_length_hist", None)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}, indent=2))
    return 0


def cmd_segment(args) -> int:
    from .data import read_user_text
    from .segment import print_colored, render_pipes, segment_bytes

    if args.text is None and args.file is None:
        raise ConfigError("give a text to segment, or --file PATH ('-' for stdin)")
    data = read_user_text(args.text, args.file)
    if args.max_bytes:
        data = data[: args.max_bytes]
    if not data:
        raise DataError("nothing to segment: the input is empty")
    model, _, _, device = _load(args)
    chunks, _ = segment_bytes(model, data, mode=args.mode, seed=args.seed, device=device)
    use_color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if use_color:
        print_colored(chunks)
    else:
        print(render_pipes(chunks, args.sep))
    n = len(data)
    print(f"\n{len(chunks)} chunks over {n} bytes: rate {len(chunks) / n:.3f}, "
          f"{n / len(chunks):.2f} bytes per chunk", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rltok", description="Byte-level LMs that learn their own tokenization with RL.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model (defaults: the stdlib corpus, a few minutes on 2 CPU cores)")
    _add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in the run folder")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=cmd_train)

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
    p.add_argument("--split", default="val", help="val (held-out part, default), test (split folders) or all")
    p.add_argument("--seq-len", type=int, default=0, help="window length (default: training seq_len)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-windows", type=int, default=0, help="evaluate on at most this many windows (0 = all)")
    p.add_argument("--max-bytes", type=int, default=0, help="read at most this many bytes")
    p.add_argument("--hist", action="store_true", help="include the chunk-length histogram")
    p.set_defaults(func=cmd_eval, default_mode="sample")

    p = sub.add_parser("segment", help="show how a trained model chunks a text")
    add_model_args(p)
    p.add_argument("text", nargs="?", help="text to segment (UTF-8)")
    p.add_argument("--file", "-f", help="read the bytes from a file ('-' for stdin)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--sep", default="|", help="separator printed between chunks without colour")
    p.add_argument("--max-bytes", type=int, default=0)
    p.set_defaults(func=cmd_segment, default_mode="greedy")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "mode", "unset") is None:
        args.mode = args.default_mode
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
