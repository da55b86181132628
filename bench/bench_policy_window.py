"""The learned rule with a decision window > 1: sampling by prefix scan against sampling one
position after another, side by side in one process.

    python bench/bench_policy_window.py                 # ~2 minutes on a CPU core
    python bench/bench_policy_window.py --windows 8 --repeats 5 --out bench/results/policy_window.json

Two timings per window, each with both samplers interleaved (A, B, B, A, ...) after a warm-up:
  sample  the policy's `sample` alone on a (batch, seq_len) row of logits (what one training step
          draws per segmentation);
  step    one full `Trainer.train_step` of the tiny preset with `model.chunker.window=W` (forward,
          loss, backward, AdamW), so the ratio says what the sampler costs a run. The model is
          narrowed by --overrides (default: 16 wide, the size of a compute-optimal CPU study point,
          where per-op overheads such as the sampler's weigh most).
The sequential sampler is forced by setting the scan's size limit to 0. Both samplers give the same
decisions bit for bit (tests/test_chunkers.py), so the steps compute the same thing. Process CPU
time with one thread is the headline: on a shared machine it is nearly immune to other processes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from rltok.analysis.compare import git_commit  # HEAD, marked +dirty when src/ differs
from rltok.config import load_config
from rltok.data import load_corpus
from rltok.model.chunkers import policy as policy_module
from rltok.training import Trainer


def timed(fn, repeats: int) -> list[float]:
    """Process CPU seconds of each of `repeats` calls."""
    out = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return out


def side_by_side(fn, repeats: int) -> dict[str, float]:
    """Median CPU seconds of fn under the scan and under the sequential sampler, interleaved."""
    limit = policy_module.SCAN_LIMIT
    times = {"scan": [], "sequential": []}
    order = ["scan", "sequential"]
    try:
        for r in range(repeats + 1):  # the first round warms both up and is not kept
            for name in order if r % 2 == 0 else order[::-1]:
                policy_module.SCAN_LIMIT = limit if name == "scan" else 0
                t = timed(fn, 1)
                if r:
                    times[name] += t
    finally:
        policy_module.SCAN_LIMIT = limit
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"scan_s": med["scan"], "sequential_s": med["sequential"],
            "speedup": med["sequential"] / med["scan"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--overrides", nargs="*", default=["model.d_byte=16", "model.d_chunk=16", "model.n_heads_byte=1",
                                                        "model.n_heads_chunk=1", "model.main_layers=3"],
                    help="config overrides on the tiny preset for the train-step timing")
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    corpus = load_corpus("stdlib", max_bytes=2_000_000)
    results = []
    for window in args.windows:
        policy = policy_module.RLPolicy(64, window=window)
        g = torch.Generator().manual_seed(0)
        base = torch.randn(args.batch_size, args.seq_len, generator=g)
        forced = torch.zeros_like(base, dtype=torch.bool)
        sample = side_by_side(lambda: policy.sample(base, forced, False, g), 4 * args.repeats)
        cfg = load_config("tiny", overrides=[*args.overrides, f"model.chunker.window={window}",
                                             f"train.seq_len={args.seq_len}",
                                             f"train.batch_size={args.batch_size}", "train.threads=1",
                                             f"train.out_dir={tempfile.mkdtemp(prefix='rltok-bench-')}"])
        trainer = Trainer(cfg, corpus=corpus, quiet=True)

        def train_step():  # as fit() does: each step at its own learning rate, not all at warm-up step 0's
            trainer.train_step()
            trainer.step += 1

        step = side_by_side(train_step, args.repeats)
        row = {"window": window, "sample": sample, "step": step}
        results.append(row)
        print(f"window {window}: sample {sample['sequential_s'] * 1e3:.1f} -> {sample['scan_s'] * 1e3:.1f} ms "
              f"({sample['speedup']:.1f}x); train step {step['sequential_s'] * 1e3:.0f} -> "
              f"{step['scan_s'] * 1e3:.0f} ms ({step['speedup']:.2f}x)", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"batch_size": args.batch_size, "seq_len": args.seq_len, "threads": 1,
                                        "overrides": args.overrides, "commit": git_commit(),
                                        "torch": torch.__version__, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
