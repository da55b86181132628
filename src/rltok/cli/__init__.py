"""Command line: `rltok train`, `rltok prepare`, `rltok eval`, `rltok segment`, `rltok generate`,
`rltok presets`, `rltok export`, `rltok lm-eval` ...
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from rltok.cli.model_commands import cmd_lm_eval
from rltok.cli.parser import build_parser
from rltok.cli.run_commands import PRESET_PARAMS, count_params
from rltok.cli.streams import output_never_fails, to_devnull
from rltok.config import ConfigError, load_plugins

__all__ = ["PRESET_PARAMS", "build_parser", "count_params", "main", "run_command", "user_errors"]

# `rltok --help` and `rltok presets` load no torch: every module that needs it is imported by the
# command that uses it. The user errors of modules not loaded cannot have been raised.
_ERROR_CLASSES = (("rltok.data.sources", "DataError"), ("rltok.training.checkpoint", "CheckpointError"))


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions that end a command with one `error:` line: ConfigError, DataError, CheckpointError."""
    return (ConfigError, *(getattr(sys.modules[m], n) for m, n in _ERROR_CLASSES if m in sys.modules))


def _plugin_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """(the --plugin values, the other arguments) of an argument list that argparse does not read."""
    specs, rest, it = [], [], iter(args)
    for arg in it:
        if arg.startswith("--plugin="):
            specs.append(arg.split("=", 1)[1])
        elif arg == "--plugin" and (value := next(it, None)) is not None:
            specs.append(value)
        else:
            rest.append(arg)
    return specs, rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:  # everything after it belongs to lm_eval's own parser, but --plugin
        specs, rest = _plugin_flags(argv[1:])
        try:
            load_plugins(specs)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return cmd_lm_eval(argparse.Namespace(lm_eval_args=rest))
    parser = build_parser()
    try:  # a bad flag is an exit status, also for in-process callers (argparse would raise SystemExit)
        args, extra = parser.parse_known_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    # argparse takes only one run of positionals, so overrides after options (`--data x
    # train.lr=1e-3`) arrive here; anything that is not an option is an override
    if extra and hasattr(args, "overrides") and not any(a.startswith("-") for a in extra):
        args.overrides += extra
    elif extra:
        print(f"error: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    if getattr(args, "mode", "unset") is None:
        args.mode = args.default_mode
    if sys.stdout is None:  # closed before the command started (`>&-`): what it prints goes nowhere
        sys.stdout = open(os.open(os.devnull, os.O_WRONLY), "w", closefd=False)  # held to the end: never closed
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    # a closed stderr never stops a command; for the long writers (train, prepare) not a closed
    # stdout either: their output is a by-product of the files they write
    with output_never_fails(stdout=args.command in ("train", "prepare")):
        return run_command(args)


def run_command(args) -> int:
    """A parsed command's handler, its user errors as one `error:` line and exit status 2."""
    try:
        load_plugins(getattr(args, "plugin", []))  # before any config is read; a failure is a user error
        code = args.func(args)
        sys.stdout.flush()  # here, so that a closed pipe is handled below and not at exit
        return code
    except BrokenPipeError:  # e.g. `rltok presets | head -1`: the reader has all it wanted
        to_devnull(sys.stdout)  # no second error at exit
        return 0
    except OSError as e:  # the system refused a read or a write (a full disk, /dev/full, a name too long)
        try:
            sys.stdout.flush()
        except OSError:  # what stdout holds cannot be written (a full /dev/full): no second failure at exit
            to_devnull(sys.stdout)
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except Exception as e:
        if not isinstance(e, user_errors()):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

