"""How AdamW's kernel (`train.optimizer_kernel`) changes a training step, on the scaling study's
own models, as ratios measured side by side in one run.

    python bench/bench_optimizer.py                 # ~3 minutes on 2 CPU cores
    python bench/bench_optimizer.py --quick         # ~40 s, indicative only
    python bench/bench_optimizer.py --json bench/results/optimizer.json
    python bench/bench_optimizer.py --trace uniform  # why a kernel's weights drift: step by step

For each family of the CPU grid (lab/scripts/scaling_cpu_grid.toml) at one size of its 3e12 ladder,
three Trainers are built from the same config and seed, one per kernel: "loop" (torch's CPU
default: one tensor at a time), "foreach" (what `auto` takes on CPU) and "fused". Their full
`Trainer.train_step`s (forward, loss, backward, clipping, AdamW) are timed interleaved, one
torch thread, after a warm-up; the table gives median ms per step, each kernel's median
per-repeat ratio to "loop", and the largest weight difference from "loop" after the timed
steps (0 means the same numbers bit for bit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rltok.analysis.compare import git_commit  # HEAD, marked +dirty when src/ differs

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("loop", "foreach", "fused")
FAMILIES = ("flat", "flat_ngram", "bpe1024", "uniform", "whitespace", "rl")


def study_config(family: str, index: int, out_dir: str, data: str):
    """The config the study trains `family` with at the `index`-th size of its 3e12 ladder."""
    from rltok.analysis.compare import method_config
    from rltok.analysis.scaling import budget_ladders, load_grid
    from rltok.analysis.scaling_grid import point_lr, run_base
    from rltok.model.sizing import method_spec

    grid = load_grid(ROOT / "lab" / "scripts" / "scaling_cpu_grid.toml")
    fam = next(f for f in grid.families if f.name == family)
    rungs = budget_ladders(grid, fam, [3e12], log=lambda m: None)[3e12]
    rung = rungs[min(index, len(rungs) - 1)]
    lr = point_lr(grid, fam, rung.achieved)
    base = [*run_base(grid, fam), *([] if lr is None else [f"train.lr={lr!r}"])]
    method = method_spec(fam.method, rung.overrides)
    return method_config(method, base, data, Path(out_dir), 0, grid.preset), rung.achieved


def trainers(family: str, index: int, data: str, tmp: str) -> tuple[dict, int]:
    import copy

    from rltok.config import apply_override
    from rltok.training.trainer import Trainer

    base, n = study_config(family, index, f"{tmp}/{family}", data)  # the grid and its shape search, once
    out = {}
    for kernel in KERNELS:
        cfg = copy.deepcopy(base)
        apply_override(cfg, f"train.out_dir={tmp}/{family}_{kernel}")
        apply_override(cfg, f"train.optimizer_kernel={kernel}")
        apply_override(cfg, "train.threads=1")
        t = Trainer(cfg, quiet=True)
        t.peak_flops = 1e12  # no matmul timing: MFU is not what this measures
        out[kernel] = t
    return out, n


def measure(ts: dict, repeats: int, steps: int) -> dict:
    for t in ts.values():  # warm-up: allocator, first-step optimiser state
        t.train_step()
        t.step += 1  # as fit() does: each step at its own learning rate, not all at warm-up step 0's
    times = {k: [] for k in ts}
    for r in range(repeats):
        order = KERNELS[r % 3:] + KERNELS[:r % 3]  # rotate, so no kernel always follows another
        for k in order:
            t0 = time.perf_counter()
            for _ in range(steps):
                ts[k].train_step()
                ts[k].step += 1
            times[k].append((time.perf_counter() - t0) / steps)
    ref = [p.detach() for p in ts["loop"].model.parameters()]
    row = {}
    for k in KERNELS:
        diff = max(float((p.detach() - q).abs().max()) for p, q in zip(ts[k].model.parameters(), ref))
        row[k] = {"ms": 1e3 * statistics.median(times[k]), "diff_vs_loop": diff,
                  "ratio_to_loop": statistics.median(a / b for a, b in zip(times[k], times["loop"]))}
    return row


def trace(ts: dict, steps: int) -> list[dict]:
    """Step by step from the same start: each kernel's loss, and the largest weight difference from
    "loop" with the tensor that holds it. Shows where rounding differences are amplified (a loss
    spike moves every kernel, and each by its own amount), instead of only the difference at the end."""
    names = [n for n, _ in ts["loop"].model.named_parameters()]
    rows = []
    for step in range(steps):
        row = {"step": step}
        for k, t in ts.items():
            sums = t.train_step()  # None: a skipped (non-finite) step
            row[f"loss_{k}"] = float("nan") if sums is None else float(sums["loss"])
            row[f"grad_norm_{k}"] = float("nan") if sums is None else float(sums["grad_norm"])
            t.step += 1
        ref = dict(ts["loop"].model.named_parameters())
        for k in ("foreach", "fused"):
            mine = dict(ts[k].model.named_parameters())
            gaps = {n: (mine[n] - ref[n]).detach().abs() for n in names}
            diff, name = max((float(g.max()), n) for n, g in gaps.items())
            at = torch.unravel_index(gaps[name].argmax(), gaps[name].shape)  # a fused q/k/v matrix's row says which
            row[f"diff_{k}"], row[f"where_{k}"], row[f"index_{k}"] = diff, name, [int(i) for i in at]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats of 2 steps, 3 families")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="steps per timed repeat")
    ap.add_argument("--rung", type=int, default=2, help="which size of each 3e12 ladder (0: smallest)")
    ap.add_argument("--data", default=str(ROOT / "data" / "docs-en"), help="a corpus folder or file")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--trace", metavar="FAMILY", choices=FAMILIES,
                    help="instead of timing: FAMILY's loss and weight difference step by step")
    ap.add_argument("--trace-steps", type=int, default=21, help="steps --trace runs (default 21: the timed run's)")
    args = ap.parse_args(argv)
    if not Path(args.data).exists():
        sys.exit(f"bench_optimizer: no corpus at {args.data} (pass --data)")
    torch.set_num_threads(1)
    # what a reader needs to check the numbers: the code, the data, and how busy the machine was
    meta = {"torch": torch.__version__, "commit": git_commit(), "argv": sys.argv[1:] if argv is None else list(argv),
            "data": args.data, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    if args.trace:
        with tempfile.TemporaryDirectory() as tmp:
            ts, n = trainers(args.trace, args.rung, args.data, tmp)
            rows = trace(ts, args.trace_steps)
        print(f"{args.trace}, N = {n:,}: loss per kernel; largest weight difference from loop (tensor)")
        print("| step | loss loop | loss foreach | loss fused | grad norm loop | grad norm fused | foreach diff | fused diff | fused's tensor |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['step']} | {r['loss_loop']:.4f} | {r['loss_foreach']:.4f} | {r['loss_fused']:.4f} "
                  f"| {r['grad_norm_loop']:.3g} | {r['grad_norm_fused']:.3g} "
                  f"| {r['diff_foreach']:.1e} | {r['diff_fused']:.1e} | {r['where_fused']}{r['index_fused']} |")
        if args.json:
            Path(args.json).write_text(json.dumps({**meta, "family": args.trace, "n": n,
                                                   "rung": args.rung, "steps": rows}, indent=1) + "\n")
        return 0
    families = FAMILIES[:3] if args.quick else FAMILIES
    repeats, steps = (2, 2) if args.quick else (args.repeats, args.steps)
    rows = {}
    print("| family | N | loop ms/step | foreach (ratio, max diff) | fused (ratio, max diff) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            ts, n = trainers(fam, args.rung, args.data, tmp)
            row = measure(ts, repeats, steps)
            rows[fam] = {"n": n, **row}
            cell = [f"{row[k]['ratio_to_loop']:.2f}x, {row[k]['diff_vs_loop']:.1e}" for k in ("foreach", "fused")]
            print(f"| {fam} | {n:,} | {row['loop']['ms']:.1f} | {cell[0]} | {cell[1]} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**meta, "repeats": repeats, "steps": steps, "rung": args.rung,
                                               "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                                               "families": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
