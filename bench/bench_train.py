"""Training-throughput benchmark of the core, as ratios measured side by side in one run.

    python bench/bench_train.py             # 4-6 minutes on 2 CPU cores
    python bench/bench_train.py --quick     # ~30 s smoke run (indicative numbers only)
    python bench/bench_train.py --repeats 20 --steps 2     # longer, tighter medians
    python bench/bench_train.py --sweep     # also time alternative default configs (~8 min)

Every timed unit is one full `Trainer.train_step` (forward, loss, backward, gradient clipping,
AdamW step; fp32 unless --dtype bf16) of:
  hier_rl        the hierarchical model, default ModelConfig (RL chunker, target rate 0.2)
  hier_fixed     the same model with a boundary every 1/target_rate bytes (same mean chunk count)
  hier_rl_given  diagnostic: the RL model fed hier_fixed's boundaries, so the policy head,
                 log-probs, policy and rate losses run but sampling and chunk counts that vary
                 between rows do not; it splits the RL cost into those two parts
  hier_rl_padded hier_rl with model.pack_chunks=false: every row's chunks padded to the batch's
                 largest count, as before packing (the chunk level runs on B x max chunks)
  flat           a flat byte transformer (FlatByteLM) of the same parameter count
It reports bytes/s, the speed-up hier_rl vs flat (target >= 2.5x), the RL machinery cost
(hier_rl vs hier_fixed, target <= 3% of step time; the same for hier_rl_padded, and what
packing saves), analytical FLOPs/byte (rltok.model.flops) with the model FLOP utilisation against a
measured matmul peak, peak memory of one step (each config in a fresh subprocess) and a
torch.profiler table of the hier_rl step.

The machine may be shared, so timings are noisy. Configs are measured interleaved (A, B, C, D,
A, ... with the order rotated every repeat) after a warm-up; reported times are medians over
repeats, and ratios are medians of per-repeat ratios (measurements seconds apart). Wall-clock
time is the headline; process CPU time is reported too, because with one thread it is nearly
immune to other processes taking the core. The default is one torch thread for the same
reason: with two threads on a loaded 2-core machine, every parallel region waits for a
descheduled thread and step times jump 3-7x at random; pass --threads 2 (or 0 for torch's
default) to measure the whole machine when it is quiet.

Why one file of this length: it is a standalone script that also re-runs itself as the
fresh-process memory measurement (--memory-child), so the configs, timing, memory, profile and
report all live in the one file that gets executed.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import torch

from rltok.config import CHUNKERS, RECIPES, Config, ConfigError, ModelConfig, apply_dict
from rltok.data.sources import Corpus
from rltok.data.corpus import load_corpus
from rltok.model.factory import planned_model
from rltok.model.flops import model_flops, train_flops_per_byte
from rltok.model import FlatByteLM, HourglassLM
from rltok.model.factory import build_model
from rltok.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = 2.5
TARGET_RL_OVERHEAD = 0.03

# --sweep: alternatives to the default config with about its parameter count (4.50M) unless
# noted, as ModelConfig overrides; timed interleaved with the others, RL chunker throughout.
SWEEP = {
    "window32": {"window": 32},
    "window128": {"window": 128},
    "enc2_dec1_chunk248": {"encoder_layers": 2, "decoder_layers": 1, "d_chunk": 248},
    "byte96_enc2_dec2": {"d_byte": 96, "encoder_layers": 2, "decoder_layers": 2},
    "chunk288x4": {"d_chunk": 288, "main_layers": 4},
    # the previous default (2 + 2 byte layers, 4 chunk layers): 9% fewer parameters
    "enc2_dec2_chunk256x4": {"encoder_layers": 2, "decoder_layers": 2, "d_chunk": 256, "main_layers": 4},
}


# ---- configurations ---------------------------------------------------------------------------
def flat_shape(n_params: int, seq_len: int, mlp_ratio: float = 4.0, head_dim: int = 64, tol: float = 0.05,
               min_layers: int = 4):
    """(d_model, n_layers) of the flat baseline: among FlatByteLMs within `tol` of n_params with
    at least `min_layers` layers, the one with the fewest FLOPs/byte (the widest, hence the
    fastest flat model of that size: the comparison is not tilted towards the hierarchy)."""
    best = None
    for d in range(128, 1025, head_dim):
        with torch.device("meta"):  # counts only: no memory, no init cost
            p1, p2 = (FlatByteLM(d, n, d // head_dim, mlp_ratio).num_params() for n in (1, 2))
        for n in range(min_layers, 33):
            p = p1 + (n - 1) * (p2 - p1)  # the count is affine in the number of layers
            if abs(p / n_params - 1) > tol:
                continue
            with torch.device("meta"):
                cost = model_flops(FlatByteLM(d, n, d // head_dim, mlp_ratio), seq_len)["total"]
            if best is None or cost < best[0]:
                best = (cost, d, n)
    if best is None:
        raise SystemExit(f"no flat model within {tol:.0%} of {n_params} parameters; pass --flat DxL")
    return best[1], best[2]


def build_configs(args) -> dict[str, dict]:
    """name -> {"kind": "hier" | "flat", "model": ModelConfig, ...}."""
    base = ModelConfig()
    apply_dict(base, json.loads(args.model) if args.model else {})  # unknown keys: a clear error
    base.validate()
    with torch.device("meta"):
        n_hier = HourglassLM(base).num_params()
    if args.flat:
        try:
            d, n = (int(v) for v in args.flat.lower().split("x"))
        except ValueError:
            raise ValueError(f"--flat expects D_MODELxLAYERS, e.g. 256x5, got {args.flat!r}") from None
    else:
        d, n = flat_shape(n_hier, args.seq_len, base.mlp_ratio)
    stride = round(1 / base.target_rate)
    fixed = copy.deepcopy(base)
    fixed.chunker = CHUNKERS.settings("fixed", stride=stride)
    specs = {
        "hier_rl": {"kind": "hier", "model": base},
        "hier_fixed": {"kind": "hier", "model": fixed},
        "hier_rl_given": {"kind": "hier", "model": base, "given_stride": stride},
        "hier_rl_padded": {"kind": "hier", "model": replace(base, pack_chunks=False)},
        # the trainer builds it from the config (model.arch=flat: d_chunk x flat_layers)
        "flat": {"kind": "flat", "model": ModelConfig(
            arch="flat", d_chunk=d, flat_layers=n, n_heads_chunk=max(1, d // 64), mlp_ratio=base.mlp_ratio,
            max_seq_len=base.max_seq_len)},
    }
    if args.sweep:
        for name, over in SWEEP.items():
            specs["alt_" + name] = {"kind": "hier", "model": replace(copy.deepcopy(base), **over)}
    return specs


def make_trainer(spec: dict, args, corpus: Corpus) -> Trainer:
    """A real Trainer, so the timed step is exactly `Trainer.train_step`."""
    cfg = Config()
    cfg.model = spec["model"]
    cfg.objective.recipe = args.recipe
    apply_dict(cfg.objective, RECIPES[args.recipe], "objective.")
    tc = cfg.train
    tc.seq_len, tc.batch_size, tc.seed = args.seq_len, args.batch_size, 0
    tc.device, tc.dtype, tc.threads = args.device, args.dtype, args.threads
    tc.out_dir = tempfile.mkdtemp(prefix="rltok-bench-")  # its own: a run folder holds one trainer
    tc.eval_batches = 1
    trainer = Trainer(cfg, corpus=corpus, quiet=True)
    given = None
    if spec.get("given_stride"):
        t = torch.arange(args.seq_len, device=trainer.device)
        given = ((t + 1) % spec["given_stride"] == 0).expand(args.batch_size, -1)
    trainer.chunk_log = []  # chunks per sequence: the padded path pays for the batch's largest count
    inner = trainer.forward

    def forward(x, **kw):
        if given is not None:  # a fixed segmentation: the model scores it
            out = trainer.model.score(x, given[: x.shape[0]], generator=kw.get("generator"))
        else:
            out = inner(x, **kw)
        if out.n_chunks is not None:
            trainer.chunk_log.append(out.n_chunks.detach())  # no host sync here
        return out

    trainer.forward = forward
    return trainer


def n_params(spec: dict) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(spec["model"]).parameters())


def flops_of(spec: dict, seq_len: int, rate: float | None) -> dict[str, float]:
    """Forward FLOPs per byte by component, asked of the model the spec builds (on the meta device)."""
    return model_flops(planned_model(spec["model"]), seq_len, rate)


def describe(spec: dict) -> str:
    m = spec["model"]
    if spec["kind"] == "flat":
        return f"flat {m.d_chunk}x{m.flat_layers}"
    rule = f"fixed/{m.chunker.stride}" if hasattr(m.chunker, "stride") else m.chunker.kind.upper()
    if spec.get("given_stride"):
        rule += f", given fixed/{spec['given_stride']} boundaries"
    if not m.pack_chunks:
        rule += ", chunks padded"
    return (f"{rule}; byte {m.d_byte}, {m.encoder_layers}+{m.decoder_layers} layers, w{m.window}; "
            f"chunk {m.d_chunk}x{m.main_layers}")


# ---- timing -----------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(trainer: Trainer, steps: int) -> tuple[float, float, list[float]]:
    """Wall and process-CPU seconds per step over `steps` training steps, and their rates."""
    sync(trainer.device)
    w0, c0 = time.perf_counter(), time.process_time()
    rates = []
    for _ in range(steps):
        metrics = trainer.train_step()
        trainer.step += 1  # as fit() does: advances the warm-up schedule
        if metrics is not None and "chunks_per_byte" in metrics:
            rates.append(metrics["chunks_per_byte"])
    sync(trainer.device)
    wall, cpu = (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps
    return wall, cpu, [float(r) for r in rates]


def peak_shape(device: torch.device, dtype: str) -> tuple[torch.dtype, int]:
    """The matmul MFU is measured against: in the precision the steps' matmuls run in (the trainer's
    own rule, `resolve_dtype`), at 1024 on a CPU and at 8192 on a GPU, large enough there that the
    timing is not launch-bound (an fp32 1024 matmul would understate a GPU's bf16 peak many times
    over and so overstate MFU)."""
    from rltok.training.device import resolve_dtype

    return resolve_dtype(dtype, device) or torch.float32, (1024 if device.type == "cpu" else 8192)


def peak_label(dtype: torch.dtype, n: int) -> str:
    return f"{str(dtype).removeprefix('torch.')} {n}³"


def matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 1024, reps: int = 8) -> float:
    """Best observed GFLOP/s of a `dtype` n x n x n matmul (the reference for FLOP utilisation)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def timing_table(names, trainers, args, device, log) -> dict:
    warm = {}
    for name in names:  # warm-up: allocator, kernel selection, AdamW state
        if args.warmup > 1:
            run_steps(trainers[name], args.warmup - 1)
        warm[name] = run_steps(trainers[name], 1)[0]
        trainers[name].chunk_log.clear()
    # Equal exposure: a longer measurement window catches more interference from other
    # processes, which would bias ratios against the slower config. So every config runs about
    # as long per measurement as the slowest one does in `args.steps` steps.
    slowest = max(warm.values())
    steps = {n: max(1, round(args.steps * slowest / warm[n])) for n in names}
    log("  steps per measurement: " + ", ".join(f"{n} {steps[n]}" for n in names))
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    rates = {n: [] for n in names}
    peaks = []
    for r in range(args.repeats):
        peaks.append(matmul_peak(device, *peak_shape(device, args.dtype)))  # sampled throughout: the best is the reference
        order = names[r % len(names):] + names[:r % len(names)]  # rotate: no config always first
        for name in order:
            w, c, rs = run_steps(trainers[name], steps[name])
            wall[name].append(w)
            cpu[name].append(c)
            rates[name].extend(rs)
        log(f"  repeat {r + 1}/{args.repeats}: " + ", ".join(f"{n} {wall[n][-1]:.3f}s" for n in names))
    return {"wall": wall, "cpu": cpu, "rates": rates, "peaks": peaks, "steps": steps}


def ratio_stats(xs: list[float]) -> dict:
    return {"median": median(xs), "min": min(xs), "max": max(xs), "all": xs}


# ---- memory -----------------------------------------------------------------------------------
def proc_status_kib(key: str) -> int | None:
    """A field of /proc/self/status (VmRSS, VmHWM) in KiB on Linux, else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0). Needed because ru_maxrss survives exec:
    a child started from a big parent would report the parent's peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return proc_status_kib("VmHWM") is not None
    except OSError:
        return False


def memory_child(name: str, args) -> dict:
    """In a fresh process: peak memory of one training step of one config, measured on the
    second step, so paging in kernel code and creating the AdamW state are excluded and what
    remains is what a step needs (activations, gradients, temporaries). The persistent state
    (weights and AdamW moments) is reported separately."""
    spec = build_configs(args)[name]
    g = torch.Generator().manual_seed(0)
    corpus = Corpus(torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, generator=g),
                    torch.randint(0, 256, (1 << 16,), dtype=torch.uint8, generator=g), "random")
    trainer = make_trainer(spec, args, corpus)
    n = trainer.model.num_params()
    res = {"config": name, "params": n, "device": str(trainer.device),
           "persistent_bytes": 12 * n}  # fp32 weights + two AdamW moments (grads live per step)
    trainer.train_step()
    trainer.opt.zero_grad(set_to_none=True)  # the measured step starts without gradients
    gc.collect()
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        trainer.train_step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        res["method"] = "torch.cuda.max_memory_allocated minus memory allocated before the step"
    elif reset_peak_rss():
        # median of three steps, in case of stray allocations
        deltas = []
        for _ in range(3):
            trainer.opt.zero_grad(set_to_none=True)
            gc.collect()
            reset_peak_rss()
            before = proc_status_kib("VmRSS") * 1024
            trainer.train_step()
            peak = proc_status_kib("VmHWM") * 1024
            deltas.append((peak - before, before, peak))
        _, before, peak = sorted(deltas)[1]
        res["step_peak_bytes_all"] = [d[0] for d in deltas]
        res["method"] = "peak RSS (VmHWM, reset before the step) minus RSS before the step, median of 3 steps"
    else:  # no /proc: only the whole process's high-water mark is available
        before = 0
        trainer.train_step()
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB elsewhere
        res["method"] = "ru_maxrss of the whole process (no per-step figure on this OS)"
    res.update(before_bytes=before, peak_bytes=peak, step_peak_bytes=peak - before)
    return res


def child_args(args) -> list[str]:
    a = ["--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--device", args.device,
         "--dtype", args.dtype, "--threads", str(args.threads), "--recipe", args.recipe]
    if args.model:
        a += ["--model", args.model]
    if args.flat:
        a += ["--flat", args.flat]
    return a


def measure_memory(names, args, log) -> dict:
    out = {}
    for name in names:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", name, *child_args(args)]
        # glibc serves big blocks from the heap once one was freed (a dynamic mmap threshold) and
        # keeps them resident, so a step's RSS would depend on what ran before; a fixed threshold
        # maps and unmaps every block >= 128 KiB, which makes peak RSS track live tensors
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            log(f"  memory child {name} failed:\n{proc.stderr[-2000:]}")
            out[name] = {"error": proc.stderr[-500:]}
            continue
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        log(f"  {name}: step peak {out[name]['step_peak_bytes'] / 2**20:.0f} MiB "
            f"(process peak {out[name]['peak_bytes'] / 2**20:.0f} MiB)")
    return out


# ---- profile ----------------------------------------------------------------------------------
class _Restore:
    """Undo an instance-attribute override (same `remove()` as a hook handle)."""

    def __init__(self, obj, attr):
        self.obj, self.attr = obj, attr

    def remove(self):
        self.obj.__dict__.pop(self.attr, None)

def profile_step(trainer: Trainer, steps: int, top: int = 15) -> dict:
    """torch.profiler over `steps` training steps: the top ops by self time, and the step split
    into phases (forward by module, optimizer, and the rest: loss, backward, clipping)."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    model, handles = trainer.model, []
    for name, mod in model.named_children():  # label each top-level module's forward
        if any(True for _ in mod.parameters()) or name == "chunker":
            ctx = {}
            def enter(m, a, name=name, ctx=ctx):
                ctx["rf"] = record_function("fwd:" + name).__enter__()

            def leave(m, a, o, ctx=ctx):  # returns None: the module's output is left alone
                ctx.pop("rf").__exit__(None, None, None)

            handles += [mod.register_forward_pre_hook(enter), mod.register_forward_hook(leave)]
    for name, mod in model.named_modules():  # label attention proper (scores, softmax, AV)
        if hasattr(mod, "attend") and callable(mod.attend):
            level = "byte" if getattr(mod, "window", None) is not None else "chunk"

            def attend(*a, _inner=mod.attend, _label=f"attn:{level}", **kw):
                with record_function(_label):
                    return _inner(*a, **kw)

            mod.attend = attend
            handles.append(_Restore(mod, "attend"))
    inner = trainer.forward

    def forward(x, **kw):
        with record_function("phase:forward"):
            return inner(x, **kw)

    trainer.forward = forward
    run_steps(trainer, 1)
    try:
        with profile(activities=acts) as prof:
            for _ in range(steps):
                with record_function("phase:step"):
                    run_steps(trainer, 1)
    finally:
        trainer.forward = inner
        for h in handles:
            h.remove()
    events = prof.key_averages()
    real = [e for e in events if not e.key.startswith(("phase:", "fwd:", "attn:"))]
    total = sum(e.self_cpu_time_total for e in real)
    rows = sorted(real, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    incl = {e.key: e.cpu_time_total / 1000 / steps for e in events}
    step_ms = incl.get("phase:step", float("nan"))
    phases = {k: v for k, v in incl.items() if k.startswith("fwd:")}
    phases["forward (total)"] = incl.get("phase:forward", float("nan"))
    opt = sum(v for k, v in incl.items() if k.startswith("Optimizer.step"))
    phases["optimizer step"] = opt
    # everything the step does outside the forward and AdamW: the loss, backward and clipping, but also
    # drawing and moving the batch, the learning-rate set, zero_grad and the recipe's own work
    phases["everything else (loss, backward, clipping, batch, ...)"] = step_ms - phases["forward (total)"] - opt
    phases["step (total)"] = step_ms
    # attention proper: forward inside Attention.attend; backward as the autograd nodes of its
    # ops (bmm only appears in attention here: linear layers backpropagate through mm)
    for level in ("byte", "chunk"):
        phases[f"of which attention forward, {level} level"] = incl.get(f"attn:{level}", 0.0)
    phases["of which attention backward (both levels)"] = sum(
        v for k, v in incl.items() if k.startswith("autograd::engine::evaluate_function:")
        and any(op in k for op in ("ScaledDotProduct", "BmmBackward", "SoftmaxBackward")))
    return {
        "note": "profiled CPU time (the profiler adds overhead; shares are what matter)",
        "top_ops": [{"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1000 / steps,
                     "share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps} for e in rows],
        "phases_ms_per_step": phases,
    }


# ---- report -----------------------------------------------------------------------------------
def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(res: dict) -> str:
    meta, rows, r = res["meta"], res["configs"], res["ratios"]
    lines = [
        f"Measured {meta['date']} at commit `{meta['commit']}` on {meta['machine']}, torch {meta['torch']}, "
        f"{meta['threads']} torch thread(s); load average {meta['loadavg_before']} before, "
        f"{meta['loadavg_after']} after. Batch {meta['batch_size']} x seq_len {meta['seq_len']}, {meta['dtype']}, {meta.get('recipe', 'reference')} recipe, "
        f"{meta['repeats']} interleaved repeats after {meta['warmup']} warm-up step(s); steps per measurement "
        + ", ".join(f"{k} {v}" for k, v in meta["steps_per_measurement"].items())
        + " (equal time per measurement); medians over repeats.",
        "",
        "| config | params | rate | chunks/seq mean / batch max | step wall (s) | best (s) | step CPU (s) | "
        "bytes/s | speed-up vs flat (wall / CPU / best) | fwd MFLOP/byte | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in rows.items():
        rate = f"{c['rate']:.3f}" if c.get("rate") is not None else "—"
        ch = f"{c['chunks_mean']:.1f} / {c['chunks_padded']:.1f}" if c.get("chunks_mean") else "—"
        sp = r["speedup_vs_flat"].get(name)
        sp_s = f"{sp['wall']['median']:.2f} / {sp['cpu']['median']:.2f} / {sp['best']:.2f}" if sp else "1"
        lines.append(
            f"| {name}: {c['desc']} | {c['params'] / 1e6:.3f}M | {rate} | {ch} | {c['step_s']:.3f} | "
            f"{c['best_step_s']:.3f} | {c['cpu_step_s']:.3f} | {c['bytes_per_s']:,.0f} | {sp_s} | "
            f"{c['fwd_flops_per_byte'] / 1e6:.2f} | {c['mfu']:.0%} |")
    sp, ov = r["speedup"], r["rl_overhead"]
    lines += [
        "",
        "| comparison | wall: median of per-repeat ratios (min–max) | CPU time: median | best wall times | "
        "target | met (wall median) |",
        "|---|---|---|---|---|---|",
        f"| speed-up hier_rl vs flat | {sp['wall']['median']:.2f}x ({sp['wall']['min']:.2f}–{sp['wall']['max']:.2f}) | "
        f"{sp['cpu']['median']:.2f}x | {sp['best']:.2f}x | ≥ {TARGET_SPEEDUP}x | {'yes' if sp['met'] else 'no'} |",
        f"| RL cost: (hier_rl − hier_fixed) / hier_rl | {ov['wall']['median']:+.1%} "
        f"({ov['wall']['min']:+.1%}–{ov['wall']['max']:+.1%}) | {ov['cpu']['median']:+.1%} | {ov['best']:+.1%} | "
        f"≤ {TARGET_RL_OVERHEAD:.0%} | {'yes' if ov['met'] else 'no'} |",
        f"| – policy head, log-probs, policy + rate losses: (hier_rl_given − hier_fixed) / hier_rl | "
        f"{r['rl_overhead_losses']['wall']['median']:+.1%} | {r['rl_overhead_losses']['cpu']['median']:+.1%} | | | |",
        f"| – sampling + chunk counts that vary by row: (hier_rl − hier_rl_given) / hier_rl | "
        f"{r['rl_overhead_sampling']['wall']['median']:+.1%} | {r['rl_overhead_sampling']['cpu']['median']:+.1%} "
        "| | | |",
        f"| RL cost with padded chunks: (hier_rl_padded − hier_fixed) / hier_rl_padded | "
        f"{r['rl_overhead_padded']['wall']['median']:+.1%} ({r['rl_overhead_padded']['wall']['min']:+.1%}–"
        f"{r['rl_overhead_padded']['wall']['max']:+.1%}) | {r['rl_overhead_padded']['cpu']['median']:+.1%} | | | |",
        f"| packing saves: (hier_rl_padded − hier_rl) / hier_rl_padded | "
        f"{r['packing_saves']['wall']['median']:+.1%} | {r['packing_saves']['cpu']['median']:+.1%} | | | |",
        f"| RL cost per forward FLOP (the rate difference taken out) | "
        f"{r['rl_overhead_per_flop']['wall']['median']:+.1%} | {r['rl_overhead_per_flop']['cpu']['median']:+.1%} "
        "| | | |",
        f"| FLOPs/byte, flat / hier_rl (analytical, at the achieved rate) | {r['flop_ratio']:.2f}x | | | | |",
        "",
        f"MFU = 3 × forward FLOPs/byte × bytes/s / matmul peak; peak = best {meta.get('matmul_peak_shape', 'float32 1024³')} matmul "
        f"seen during the run: {meta['matmul_peak_gflops']:.0f} GFLOP/s.",
    ]
    mem = {k: v for k, v in res["memory"].items() if "step_peak_bytes" in v}
    if mem:
        lines += ["", f"Peak memory of one training step, fresh process per config "
                  f"({next(iter(mem.values()))['method']}, after a warm-up step):", "",
                  "| config | step peak (MiB) | process peak RSS (MiB) | weights + AdamW moments (MiB) |",
                  "|---|---|---|---|"]
        for name, m in mem.items():
            lines.append(f"| {name} | {m['step_peak_bytes'] / 2**20:.0f} | {m['peak_bytes'] / 2**20:.0f} | "
                         f"{m['persistent_bytes'] / 2**20:.0f} |")
    if res.get("profile"):
        prof = res["profile"]
        ph = prof["phases_ms_per_step"]
        step = ph["step (total)"]
        lines += ["", "Where the hier_rl training step spends its time (torch.profiler; forward by module, "
                  "inclusive CPU time):", "", "| phase | ms/step | share of step |", "|---|---|---|"]
        for k, v in ph.items():
            lines.append(f"| {k} | {v:.1f} | {v / step:.1%} |")
        lines += ["", "Top ops (self CPU time):", "", "| op | ms/step | share | calls/step |", "|---|---|---|---|"]
        for p in prof["top_ops"]:
            lines.append(f"| `{p['op'][:60]}` | {p['self_ms_per_step']:.1f} | {p['share']:.1%} | "
                         f"{p['calls_per_step']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10, help="interleaved repeats (medians over these)")
    ap.add_argument("--steps", type=int, default=1,
                    help="training steps per measurement of the slowest config (faster ones run as long)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per config first (>= 1)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "auto"])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: robust on a shared machine; 0: torch's default)")
    ap.add_argument("--recipe", default="lexicon", choices=["lexicon", "reference"],
                    help="boundary-learning recipe of the RL configs (lexicon: the CPU presets' default)")
    ap.add_argument("--model", default="", help='JSON ModelConfig overrides, e.g. \'{"window": 64}\'')
    ap.add_argument("--flat", default="", help="flat model as DxL, e.g. 256x5 (default: matched parameters)")
    ap.add_argument("--sweep", action="store_true", help="also time the alternative configs in SWEEP")
    ap.add_argument("--data-bytes", type=int, default=4 << 20, help="bytes of the stdlib corpus to sample")
    ap.add_argument("--profile-steps", type=int, default=2, help="0 disables the profile")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--quick", action="store_true", help="~30 s smoke run (indicative numbers only)")
    ap.add_argument("--out", default="", help="JSON path (default bench/results/train.json, train_sweep.json "
                                              "with --sweep, the temp dir with --quick); a .md table goes next to it")
    ap.add_argument("--memory-child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.repeats, args.steps, args.warmup) < 1:
        ap.error("--repeats, --steps and --warmup must be >= 1")
    if args.quick:
        args.repeats, args.steps, args.warmup, args.profile_steps = 2, 1, 1, 1
        args.batch_size = min(args.batch_size, 4)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args)))
        return 0

    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:5.0f}s] {msg}", file=sys.stderr, flush=True)

    try:
        specs = build_configs(args)
    except (ConfigError, ValueError) as e:  # a bad --model / --flat: a message, not a traceback
        ap.error(str(e))
    names = list(specs)
    with warnings.catch_warnings():  # the stdlib holds empty __init__.py files: expected, not news
        warnings.simplefilter("ignore", UserWarning)
        corpus = load_corpus("stdlib", max_bytes=args.data_bytes)
    trainers = {n: make_trainer(specs[n], args, corpus) for n in names}
    log("built the models")
    device = trainers[names[0]].device
    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    log(f"rltok bench: {', '.join(f'{n}={n_params(specs[n]) / 1e6:.3f}M' for n in names)} params; "
        f"batch {args.batch_size} x {args.seq_len} on {device}, {torch.get_num_threads()} thread(s)")
    timing = timing_table(names, trainers, args, device, log)
    peak = max(timing["peaks"])

    step_bytes = args.batch_size * args.seq_len
    wall, cpu = timing["wall"], timing["cpu"]
    configs = {}
    for n in names:
        spec, tr = specs[n], trainers[n]
        step_s = median(wall[n])
        rate = median(timing["rates"][n]) if timing["rates"][n] else None
        chunks = torch.stack(tr.chunk_log).float() if tr.chunk_log else None
        fl = flops_of(spec, args.seq_len, rate)
        configs[n] = {
            "desc": describe(spec), "params": n_params(spec),
            "model": asdict(spec["model"]),
            "step_s": step_s, "best_step_s": min(wall[n]), "cpu_step_s": median(cpu[n]),
            "step_s_all": wall[n], "cpu_step_s_all": cpu[n], "bytes_per_s": step_bytes / step_s,
            "rate": rate,
            "chunks_mean": float(chunks.mean()) if chunks is not None else None,
            "chunks_padded": float(chunks.max(1).values.mean()) if chunks is not None else None,
            "fwd_flops_per_byte": fl["total"], "flops_by_component": fl,
            "train_flops_per_byte": train_flops_per_byte(fl),
            "mfu": train_flops_per_byte(fl) * step_bytes / step_s / (peak * 1e9),
        }

    def per_repeat(f):
        return {kind: ratio_stats([f(t, i) for i in range(args.repeats)])
                for kind, t in (("wall", wall), ("cpu", cpu))}

    speedups = {n: {**per_repeat(lambda t, i, n=n: t["flat"][i] / t[n][i]),
                    "best": min(wall["flat"]) / min(wall[n])}  # ratio of the least disturbed runs
                for n in names if specs[n]["kind"] == "hier"}
    sp = speedups["hier_rl"]
    ov = per_repeat(lambda t, i: (t["hier_rl"][i] - t["hier_fixed"][i]) / t["hier_rl"][i])
    ov["best"] = 1 - min(wall["hier_fixed"]) / min(wall["hier_rl"])
    ratios = {
        "speedup": {**sp, "target": TARGET_SPEEDUP, "met": sp["wall"]["median"] >= TARGET_SPEEDUP},
        "speedup_vs_flat": speedups,
        "rl_overhead": {**ov, "target": TARGET_RL_OVERHEAD, "met": ov["wall"]["median"] <= TARGET_RL_OVERHEAD},
        # the RL cost split in two: losses and log-probs | sampling and chunk counts varying by row
        "rl_overhead_losses": per_repeat(
            lambda t, i: (t["hier_rl_given"][i] - t["hier_fixed"][i]) / t["hier_rl"][i]),
        "rl_overhead_sampling": per_repeat(
            lambda t, i: (t["hier_rl"][i] - t["hier_rl_given"][i]) / t["hier_rl"][i]),
        # the same RL cost with the chunks padded (as before packing), and what packing saves
        "rl_overhead_padded": per_repeat(
            lambda t, i: (t["hier_rl_padded"][i] - t["hier_fixed"][i]) / t["hier_rl_padded"][i]),
        "packing_saves": per_repeat(
            lambda t, i: (t["hier_rl_padded"][i] - t["hier_rl"][i]) / t["hier_rl_padded"][i]),
        "flop_ratio": configs["flat"]["fwd_flops_per_byte"] / configs["hier_rl"]["fwd_flops_per_byte"],
    }
    # the policy trains while it is timed, so its rate drifts from the fixed rule's; the RL cost
    # per forward FLOP (at each config's achieved rate) takes out the chunks it drew beyond them
    flops_rl = configs["hier_rl"]["fwd_flops_per_byte"] / configs["hier_fixed"]["fwd_flops_per_byte"]
    ratios["rl_overhead_per_flop"] = per_repeat(
        lambda t, i: 1 - t["hier_fixed"][i] * flops_rl / t["hier_rl"][i])
    prof = {}
    if args.profile_steps > 0:
        log("profiling hier_rl")
        prof = profile_step(trainers["hier_rl"], args.profile_steps)
    del trainers
    gc.collect()
    memory = {}
    if not args.no_memory:
        log("memory (fresh subprocess per config):")
        memory = measure_memory(["hier_rl"] if args.quick else ["hier_rl", "hier_rl_padded", "hier_fixed", "flat"],
                                args, log)

    res = {
        "meta": {
            "command": " ".join(["python", os.path.relpath(__file__, ROOT)]
                                + (list(argv) if argv is not None else sys.argv[1:])),
            "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs" + (
                f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""),
            "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
            "threads": torch.get_num_threads(), "dtype": args.dtype, "seq_len": args.seq_len,
            "batch_size": args.batch_size, "recipe": args.recipe, "repeats": args.repeats, "steps": args.steps,
            "steps_per_measurement": timing["steps"],
            "warmup": args.warmup, "quick": args.quick, "loadavg_before": loadavg_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()], "matmul_peak_gflops": peak,
            "matmul_peak_shape": peak_label(*peak_shape(device, args.dtype)),
            "matmul_peaks": timing["peaks"], "wall_s": round(time.perf_counter() - t_start, 1),
        },
        "configs": configs, "ratios": ratios, "memory": memory, "profile": prof,
    }
    if args.out:
        out = Path(args.out)
    elif args.quick:  # a smoke run's numbers are not results: keep them out of the tree
        out = Path(tempfile.gettempdir()) / "rltok-bench-quick.json"
    else:
        out = ROOT / "bench" / "results" / ("train_sweep.json" if args.sweep else "train.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    md = markdown(res)
    out.with_suffix(".md").write_text(md)
    print(md)
    log(f"wrote {out} and {out.with_suffix('.md')} in {res['meta']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
