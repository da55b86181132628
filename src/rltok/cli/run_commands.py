"""The commands that make runs: `rltok train`, `prepare`, `presets`, `export`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rltok.config import PRESETS, ConfigError, load_config


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
    if args.resume:  # continue the run the folder holds, from its own saved config and data
        from rltok.training import run_folder

        run_dir = (args.out if args.out is not None else _last_override(overrides, "train.out_dir")) or "runs/default"
        run_folder.require_run_folder(run_dir)  # so the folder holds a config.json
        cfg = run_folder.resume_config(run_dir, run_folder.saved_config(run_dir), args.preset, args.config,
                                       overrides, allow_change=args.allow_config_change)
    else:
        from rltok.training.run_folder import absolute_data

        cfg = absolute_data(load_config(args.preset or "tiny", args.config, overrides))
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    from rltok.cli.paths import check_output_folder, refuse_foreign_folder
    from rltok.training import distributed

    check_output_folder(cfg.train.out_dir, "cannot use run folder")
    if not args.resume and not args.overwrite:
        refuse_foreign_folder(cfg.train.out_dir, "--out")

    try:
        result = train(cfg, resume=args.resume)
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:  # a second Ctrl-C during a step: say what is on disk
        print(f"interrupted before a checkpoint of this step was written; {resume_point(cfg.train.out_dir)}",
              file=sys.stderr)
        return 130
    main_rank = distributed.is_main_process()
    distributed.shutdown()  # a no-op in one process; under torchrun a clean exit of every rank
    if not main_rank:  # rank 0 alone prints the summary
        return 0
    val = result.val
    if val:
        summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in val.items() if k != "chunk_length_hist"}
        print(json.dumps({"step": result.step, "run_dir": str(result.run_dir), **summary}))
    return 0


def resume_point(run_dir: str) -> str:
    """Where `rltok train --resume` would continue the run in `run_dir`, in words."""
    from rltok.training.checkpoint import checkpoint_step, list_checkpoints

    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return f"no checkpoint was saved: `--resume --out {run_dir}` starts from scratch"
    return f"`--resume --out {run_dir}` continues from step {checkpoint_step(ckpts[-1])} ({ckpts[-1]})"


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
    from rltok.cli.paths import check_output_folder

    check_output_folder(args.out, "--out")
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


def _exported_file(out: str):
    """Whether a name in `out` is an earlier export's: its model files, when its config.json is
    an exported model's (a folder of a user's own config.json and README.md is not)."""
    from rltok.model.pretrained import CheckpointError, PretrainedError, read_config

    try:
        read_config(Path(out))
        exported = True
    except (CheckpointError, PretrainedError, ConfigError, OSError, ValueError):
        exported = False
    return lambda name: exported and name in ("model.safetensors", "config.json", "README.md")


def cmd_export(args) -> int:
    from rltok.cli.paths import check_output_folder, refuse_other_files
    from rltok.model.pretrained import push_to_hub, refuse_run_or_checkpoint, save_pretrained
    from rltok.training.loading import load_checkpoint

    if args.out:  # before loading: never into the run or checkpoint it reads, or any other
        check_output_folder(args.out, "--out")
        refuse_run_or_checkpoint(args.out, "--out")
        refuse_other_files(args.out, "--out", _exported_file(args.out), "an exported model's")
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
