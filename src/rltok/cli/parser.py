"""The argument parser of the `rltok` command: one subcommand per job, each with its flags."""

from __future__ import annotations

import argparse

from rltok.cli.analysis_commands import cmd_compare, cmd_scaling
from rltok.cli.model_commands import MAX_COUNT, cmd_eval, cmd_generate, cmd_lm_eval, cmd_segment
from rltok.cli.run_commands import cmd_export, cmd_prepare, cmd_presets, cmd_train
from rltok.config import PRESETS


# Numeric flags are range-checked as they are parsed: one `error:` line naming the flag and its
# range, before anything is loaded or computed.
MAX_THREADS = 1024  # more threads than any machine has cores: torch would try to start them and crash
MAX_SEED = (1 << 32) - 1  # NumPy's seeds are 32-bit


def count(low: int = 0, high: int = MAX_COUNT):
    """An argparse type: a whole number in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value
    return parse


def number(low: float, high: float, low_open: bool = False, high_open: bool = False):
    """An argparse type: a finite number in [low, high] (either end open with low_open, high_open)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a number, got {text!r}") from None
        if not (low < value if low_open else low <= value) or not (value < high if high_open else value <= high):
            raise argparse.ArgumentTypeError(f"must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
                                             f", got {text}")  # NaN fails both
        return value
    return parse


def shard(text: str) -> tuple[int, int]:
    """An argparse type: K/N with 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects K/N, e.g. 1/4, got {text!r}") from None
    if not 1 <= k <= n <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"needs 1 <= K <= N, got {text}")
    return k, n


class Parser(argparse.ArgumentParser):
    """argparse, with its errors in the CLI's form: one `error:` line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}\n")


# Each `_add_<command>` adds one subcommand, its flags and its handler; build_parser adds them in
# the order `rltok --help` lists them.
Subcommands = argparse._SubParsersAction


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, e.g. train.max_steps=2000 model.d_chunk=384")
    p.add_argument("--preset", default=None, help=f"named preset ({', '.join(PRESETS)}); default: tiny "
                                                  "(with --resume: the run's own saved config)")
    p.add_argument("--config", help="JSON or TOML config file applied on top of the preset")
    p.add_argument("--data", help="training data: 'stdlib' (default), a file (.gz/.bz2/.xz/.zst read as text), a "
                                  "folder, a glob, a folder from `rltok prepare`, mix:DIR=W,DIR=W or hf:NAME "
                                  "(docs/DATA.md)")
    p.add_argument("--out", help="run folder (checkpoints, metrics.jsonl); default runs/default")
    p.add_argument("--steps", type=count(0),  # 0: the config says why not
                   help="shorthand for train.max_steps")


def add_model_args(q: argparse.ArgumentParser) -> None:
    """The flags of every command that loads a trained model: where it is, where it runs, how it decides."""
    q.add_argument("--checkpoint", "-c", default="runs/default", help="checkpoint or run folder (newest checkpoint)")
    q.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:N, mps or auto (default: CUDA where available, else the CPU)")
    q.add_argument("--threads", type=count(0, MAX_THREADS), default=0, help="CPU threads (default 0: torch's choice)")
    q.add_argument("--mode", choices=("sample", "greedy"), default=None,
                   help="boundary decisions: sampled from the policy or thresholded at p=0.5")
    q.add_argument("--seed", type=count(0, MAX_SEED), default=0,
                   help="seed of the sampled boundary decisions (and of sampled bytes in generate); default 0")


def _add_train(sub: Subcommands) -> None:
    p = sub.add_parser("train", help="train a model (defaults: the stdlib corpus, a few minutes on 2 CPU cores)")
    _add_config_args(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest valid checkpoint, with the run's own saved "
                        "config and data; only train.max_steps, logging/eval/checkpoint cadence, threads, "
                        "device, tensorboard/wandb, train.schedule_on_resume and train.optimizer_kernel may be "
                        "given again")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: continue even though other config keys differ from the run's")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in an --out folder that already holds other files (its config.json "
                        "and metrics.jsonl are replaced); a folder holding a run's checkpoints still needs --resume")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--list-presets", action="store_true", help="list the named presets and exit")
    p.set_defaults(func=cmd_train)


def _add_prepare(sub: Subcommands) -> None:
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
    p.add_argument("--val-fraction", type=number(0, 0.5, low_open=True, high_open=True), default=0.02,
                   help="share of the bytes held out (default 0.02)")
    p.add_argument("--max-bytes", type=count(0), default=0, help="read at most this many bytes of the source (0 = all)")
    p.add_argument("--text-field", default="text", help="hub datasets: the record field holding the text")
    p.add_argument("--shard-size", default="256M", help="bytes per shard, e.g. 256M (default), 64k, 1G")
    p.add_argument("--num-proc", type=count(1, 256), default=1,
                   help="processes reading and decompressing files in parallel (local files; default 1)")
    p.add_argument("--verify", action="store_true", help="check every shard's SHA-256 against the manifest")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_prepare)


def _add_presets(sub: Subcommands) -> None:
    p = sub.add_parser("presets", help="list the named config presets (size, shape, purpose)")
    p.add_argument("name", nargs="?", help="print this preset's full resolved config")
    p.set_defaults(func=cmd_presets)


def _add_export(sub: Subcommands) -> None:
    p = sub.add_parser("export", help="write a checkpoint as a Hub-style model folder (safetensors, config, model card)")
    p.add_argument("--checkpoint", "-c", default="runs/default", help="checkpoint or run folder (newest checkpoint)")
    p.add_argument("--out", "-o", help="folder to write (model.safetensors, config.json, README.md)")
    p.add_argument("--push-to-hub", metavar="REPO_ID", help="also upload to this Hugging Face Hub repo (network, token)")
    p.add_argument("--private", action="store_true", help="create the Hub repo private")
    p.set_defaults(func=cmd_export)


def _add_lm_eval(sub: Subcommands) -> None:
    p = sub.add_parser("lm-eval", add_help=False,
                       help="lm-evaluation-harness with the 'rltok' model (needs rltok[eval]); arguments go to lm_eval")
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_lm_eval)


def _add_eval(sub: Subcommands) -> None:
    p = sub.add_parser("eval", help="bpb, boundary rate, bytes per chunk and whitespace alignment on any data")
    add_model_args(p)
    p.add_argument("--data", help="data to evaluate (default: the training source); a split folder uses --split")
    p.add_argument("--split", default="val", help="val (held-out part, default), test (split folders and prepared "
                                                  "folders that have one), train or all; a split the data lacks is "
                                                  "an error")
    p.add_argument("--fallback-to-val", action="store_true",
                   help="evaluate on val when the data has no such split (the output's split names the one used)")
    p.add_argument("--seq-len", type=count(0, 1 << 20), default=0, help="window length (default: training seq_len)")
    p.add_argument("--batch-size", type=count(1), default=8, help="windows per forward pass (default 8)")
    p.add_argument("--max-windows", type=count(0), default=0,
                   help="evaluate on at most this many windows (default 0: the whole split, which on a large "
                        "split takes a while)")
    p.add_argument("--context", type=count(1, 1 << 20), default=1,
                   help="score bytes context.. of each window, the same bytes for every model family (windows "
                        "overlap by context bytes, so each byte is scored once; default 1)")
    p.add_argument("--forced-split", action=argparse.BooleanOptionalAction, default=True,
                   help="a BPE-token model tokenises the context and the scored bytes on their own (default); "
                        "--no-forced-split: the window whole, scored from its first token boundary at or after "
                        "the context (fewer bytes; what the forced boundary costs is the difference)")
    p.add_argument("--max-bytes", type=count(0), default=0,
                   help="evaluate the first N bytes of the split (0 = all; the split itself stays as training held it out)")
    p.add_argument("--hist", action="store_true", help="include the chunk-length histogram")
    p.add_argument("--code", action=argparse.BooleanOptionalAction, default=None,
                   help="report token_end_* and token_start_* precision/chance/recall (chunk ends at Python "
                        "token ends, or one byte late: on the byte that starts the next token); default: "
                        "on when the data is Python source ('stdlib', .py files)")
    p.set_defaults(func=cmd_eval, default_mode="sample")


def _add_segment(sub: Subcommands) -> None:
    p = sub.add_parser("segment", help="show how a trained model chunks a text")
    add_model_args(p)
    p.add_argument("text", nargs="?", help="text to segment (UTF-8)")
    p.add_argument("--file", "--prompt-file", "-f", dest="file",
                   help="read the bytes from a file ('-' for stdin); --prompt-file is the same (as in generate)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--sep", default="|", help="separator printed between chunks without colour")
    p.add_argument("--max-bytes", type=count(0), default=0, help="segment the first N bytes (0 = all)")
    p.add_argument("--html", metavar="OUT.html", help="also write an HTML heat map of per-byte boundary probabilities")
    p.add_argument("--png", metavar="OUT.png", help="also write a PNG heat map (needs matplotlib)")
    p.set_defaults(func=cmd_segment, default_mode="sample")


def _add_generate(sub: Subcommands) -> None:
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
    p.add_argument("--temperature", "-t", type=number(0, 1e6), default=1.0, help="sampling temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=count(0), default=0, help="sample among the k likeliest bytes (0 = off)")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=1.0,
                   help="nucleus sampling: smallest set with this mass (1 = off)")
    p.add_argument("--stop", action="append", default=[], metavar="STR",
                   help="stop when this string is produced (not printed); repeatable; escapes: \\n \\t \\r "
                        "\\xNN, and \\\\ for a backslash")
    p.add_argument("--echo", action="store_true", help="print the prompt before the continuation")
    p.set_defaults(func=cmd_generate, default_mode="sample")


def _add_compare(sub: Subcommands) -> None:
    p = sub.add_parser("compare", help="train several boundary rules at equal training FLOPs and tabulate them")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="base config overrides for every method")
    p.add_argument("--data", required=True, help="training data (a folder with train/val/test files is best)")
    p.add_argument("--methods", nargs="+", default=["rl", "hnet", "gumbel", "dynamic_pooling", "entropy", "whitespace",
                                                     "bpe", "fixed", "uniform", "flat", "bpe_token"],
                   help="named methods (rl_reference, bpe_line, ...) or any registered boundary rule or model family "
                        "(a plugin's too), each optionally NAME+PIECE...@key=value,... (default: all of "
                        "%(default)s)")
    p.add_argument("--seeds", nargs="+", type=count(0, MAX_SEED), default=[0], help="seeds per method (default 0)")
    p.add_argument("--budget-bytes", type=count(1, 1 << 50), default=1_000_000,
                   help="budget in bytes of the hierarchical model at the target rate; every method gets "
                        "the same training FLOPs (default %(default)s)")
    p.add_argument("--preset", default="tiny", help=f"named preset of every method ({', '.join(PRESETS)}); "
                                                     "default tiny")
    p.add_argument("--split", default="test", help="held-out split to evaluate on (test or val)")
    p.add_argument("--max-eval-windows", type=count(0), default=0)
    p.add_argument("--eval-context", type=count(1, 1 << 20), default=1,
                   help="score bytes context.. of each evaluation window, the same bytes for every family (default 1)")
    p.add_argument("--out", required=True, help="folder for per-run JSON, runs, the table and plots")
    p.add_argument("--title", default="")
    p.add_argument("--command-line", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_compare)


def _add_scaling(sub: Subcommands) -> None:
    p = sub.add_parser("scaling", help="the compute-optimal (isoFLOP) study of a grid file: resumable runs, "
                                       "fits and plots per corpus")
    p.add_argument("--grid", required=True, help="grid file, TOML or JSON (docs/SCALING.md: The grid file)")
    p.add_argument("--out", required=True, help="results folder: one subfolder per corpus with a JSON per run, "
                                                "fits.json, report.md and the plots")
    p.add_argument("--corpus", help="only this corpus of the grid (run one process per corpus side by side)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--fit-only", action="store_true", help="fit, plot and rewrite report.md from the runs already there; train nothing")
    mode.add_argument("--shard", type=shard, metavar="K/N",
                      help="run only shard K of N (every N-th corpus-budget-family cell, K from 1; e.g. a job "
                           "array's index): its records, no fit")
    mode.add_argument("--merge", nargs="+", metavar="FOLDER",
                      help="copy the run records of these results folders (shards) into --out, then fit")
    p.add_argument("--allow-dirty", action="store_true",
                   help="with a grid that sets committed_only: run from a tree with uncommitted changes under src/; "
                        "its records are marked and left out of every fit and table")
    p.set_defaults(func=cmd_scaling)


def add_plugin_arg(p: argparse.ArgumentParser) -> None:
    """--plugin on every command: what a run or model needs must load wherever it is read."""
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="load components (boundary rules, rewards, model families ...) from a module on "
                        "sys.path (pkg.rules, pkg.rules:register) or a .py file first; repeatable. Installed "
                        "plugins (entry points in the group rltok.plugins) load by themselves")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rltok", description="Byte-level LMs that learn their own tokenization with RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_prepare, _add_presets, _add_export, _add_lm_eval, _add_eval, _add_segment,
                _add_generate, _add_compare, _add_scaling):
        add(sub)
    for name, command in sub.choices.items():
        if name != "lm-eval":  # its arguments are lm_eval's (main takes --plugin out of them)
            add_plugin_arg(command)
    return parser
