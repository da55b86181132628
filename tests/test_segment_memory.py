"""`rltok segment` reads a long input in windows: its memory does not grow with the input, and
the windowed decisions match one pass over the whole input (up to float rounding)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import randomize_, tiny_model_config
from rltok.config.loading import load_config
from rltok.model import HourglassLM
from rltok.model.segment import segment_boundaries
from rltok.training.checkpoint import save_checkpoint

SRC = str(Path(__file__).resolve().parents[1] / "src")

# in a child process: segment a small input, then the big one; print the peak RSS after each (KB)
MEASURE = """
import contextlib, io, resource, sys
from rltok.cli import main
run, small, big = sys.argv[1:4]
with contextlib.redirect_stdout(io.StringIO()):
    main(["segment", "-c", run, "-f", small, "--color", "never", "--threads", "1"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["segment", "-c", run, "-f", big, "--color", "never", "--threads", "1"])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.stderr.write(f"rss {before} {after}\\n")
sys.stdout.write(out.getvalue())
"""


def word_salad(n: int) -> bytes:
    import random

    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()
    rng = random.Random(0)
    return " ".join(rng.choice(words) for _ in range(n // 4)).encode()[:n]


def test_segment_memory_does_not_grow_with_the_input(tmp_path):
    cfg = load_config("test")
    save_checkpoint(tmp_path / "run", 1, HourglassLM(cfg.model), cfg.validate())
    text = word_salad(2_000_000)
    (tmp_path / "big.txt").write_bytes(text)
    (tmp_path / "small.txt").write_bytes(text[:20_000])
    done = subprocess.run([sys.executable, "-c", MEASURE, tmp_path / "run", tmp_path / "small.txt", tmp_path / "big.txt"],
                          capture_output=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-4000:]
    before, after = map(int, next(line for line in err.splitlines() if line.startswith("rss ")).split()[1:])
    # one pass kept ~1 KB per byte (2 GB here); the windows, the per-byte results and the
    # printed chunks need a few tens of MB
    assert (after - before) * 1024 < 300 * 2**20, (before, after)
    assert f"over {len(text)} bytes" in err
    out = done.stdout.decode()
    assert out.rstrip("\n").replace("|", "").encode() == text


def test_windows_decide_as_one_pass_does():
    torch.manual_seed(0)
    model = randomize_(HourglassLM(tiny_model_config(max_seq_len=4096, window=8))).eval()
    data = word_salad(3000)
    whole_b, whole_p = segment_boundaries(model, data, window=4096)
    b, p = segment_boundaries(model, data, window=256)
    assert b.shape == whole_b.shape == (len(data),) and b.dtype == torch.bool
    # context (64 bytes) covers the encoder's window: the same rule, up to float rounding
    assert (b != whole_b).float().mean() < 0.01
    assert torch.allclose(p, whole_p, atol=1e-3)
    # sampling goes through every window too
    assert segment_boundaries(model, data, mode="sample", window=256)[0].shape == (len(data),)


CAPPED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from rltok.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_segment_of_16_mib_finishes_under_a_3_gb_address_space(tmp_path):
    """The input limit's worth of text (16 MiB) under `ulimit -v` of 3 GB (torch's own mappings
    included): one pass would need about 18 GB."""
    cfg = load_config("test")
    save_checkpoint(tmp_path / "run", 1, HourglassLM(cfg.model), cfg.validate())
    text = word_salad(16 << 20)
    (tmp_path / "big.txt").write_bytes(text)
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        done = subprocess.run([sys.executable, "-c", CAPPED, "segment", "-c", str(tmp_path / "run"), "-f",
                               str(tmp_path / "big.txt"), "--color", "never", "--threads", "1"],
                              stdout=sink, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": SRC}, timeout=1800)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    assert out.read_bytes().rstrip(b"\n").replace(b"|", b"") == text
