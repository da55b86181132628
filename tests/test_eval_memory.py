"""`rltok eval` reads a long split a batch of windows at a time: its memory does not grow with the
input beyond the input's own bytes, and the numbers are those of the windows scored all at once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from conftest import corpus_folder
from rltok.data.corpus import load_eval_bytes
from rltok.config.loading import load_config
from rltok.data.windows import EvalWindows, eval_windows
from rltok.eval.evaluate import evaluate
from rltok.harness.run_eval import evaluate_run
from rltok.model.factory import build_model
from rltok.training.checkpoint import save_checkpoint
from test_segment_memory import word_salad

SRC = str(Path(__file__).resolve().parents[1] / "src")

# In a child process: evaluate a 1 MB file, then an 8 MB one; print the peak RSS after each (KB).
# The model's forward is a stand-in of the same shapes (zero loss on every byte): scoring 8 MB
# with any model takes minutes on a shared CPU, and what grew with the input was the windows.
MEASURE = """
import contextlib, io, json, resource, sys
import torch
import rltok.eval.evaluate as ev
from rltok.cli import main

class Out:
    boundaries = None

def scored(model, xb, yb, context, mode, generator, forced_split=True):
    return Out(), torch.zeros(yb.shape), torch.ones(yb.shape, dtype=torch.bool)

ev.scored_bytes = scored
run, small, big = sys.argv[1:4]
flags = ["--split", "all", "--seq-len", "1024", "--threads", "1"]
with contextlib.redirect_stdout(io.StringIO()):
    main(["eval", "-c", run, "--data", small, *flags])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["eval", "-c", run, "--data", big, *flags])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.stderr.write(f"rss {before} {after}\\n")
sys.stdout.write(out.getvalue())
"""


def test_eval_memory_does_not_grow_with_the_input(tmp_path):
    cfg = load_config("test", overrides=["model.arch=flat", "model.d_chunk=16", "model.flat_layers=1"])
    save_checkpoint(tmp_path / "run", 1, build_model(cfg.model), cfg.validate())
    text = word_salad(8_000_000)
    (tmp_path / "big.txt").write_bytes(text)
    (tmp_path / "small.txt").write_bytes(text[:1_000_000])
    done = subprocess.run([sys.executable, "-c", MEASURE, tmp_path / "run", tmp_path / "small.txt",
                           tmp_path / "big.txt"], capture_output=True, env={**os.environ, "PYTHONPATH": SRC},
                          timeout=300)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-4000:]
    before, after = map(int, next(line for line in err.splitlines() if line.startswith("rss ")).split()[1:])
    # every window at once held 8 bytes per input byte (64 MB here, ~60 MB more than for 1 MB); a
    # batch at a time, the input's own bytes and the copies made while reading it
    assert (after - before) * 1024 < 40 * 2**20, (before, after)
    windows = (len(text) - 1) // 1024
    assert json.loads(done.stdout)["bytes"] == windows * 1024  # every window scored


def test_windows_a_batch_at_a_time_give_the_numbers_of_all_at_once(tmp_path):
    cfg = load_config("test", overrides=["train.seq_len=32"])
    run = tmp_path / "run"
    save_checkpoint(run, 1, build_model(cfg.model), cfg.validate())
    data = corpus_folder(tmp_path)
    split = load_eval_bytes(str(data), "test")
    x, y = eval_windows(split, 32, context=4)
    assert len(x) > 3 * 5  # several batches, a short last one
    got = evaluate_run(run, str(data), "test", context=4, batch_size=5, seed=1)
    model = got.model
    assert got.result == evaluate(model, x, y, batch_size=5, seed=1, context=4)  # sampled boundaries too
    assert got.x.equal(x) and got.y.equal(y) and got.summary()["seq_len"] == 32
    windows = EvalWindows(split, 32, context=4)
    assert len(windows) == len(x) and torch.cat([b[0] for b in windows.batches(5)]).equal(x)
