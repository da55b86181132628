"""GPU check: train the reference-scale preset (nl-147m, 145M parameters, 4096-byte windows,
bf16 autocast, fused SDPA attention) for a few hundred steps and report training bytes/s and
model FLOP utilisation. Sized to finish within 5 minutes on one H200 (the training loop stops
early at --time-limit and reports what it measured).

    bash bench/gpu_check.sh --out gpu_check.json          # one GPU, ~2-4 minutes
    bash bench/gpu_check.sh --compile --out gpu_check.json
    python bench/gpu_check.py --tiny                      # CPU smoke run of the same code, seconds

MFU = analytical training FLOPs per byte (rltok.model.flops, at the achieved boundary rate) x bytes/s,
divided by the device peak: both the bf16 matmul peak measured here and, when the device is
known, its datasheet dense bf16 peak. Timing starts after --warmup steps (allocator, kernel
selection, compilation) and every timed step ends with a device synchronisation.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from rltok.config import load_config
from rltok.data.sources import Corpus
from rltok.data.corpus import load_corpus
from rltok.training.peak import known_peak, measured_peak_flops
from rltok.training.trainer import Trainer


def nominal_peak(device: torch.device) -> tuple[str, float | None]:
    """The device's name and its datasheet dense bf16 peak (rltok.training.peak.KNOWN_PEAKS)."""
    if device.type != "cuda":
        return platform.processor() or "cpu", None
    name = torch.cuda.get_device_name(device)
    return name, known_peak(name, torch.bfloat16)


def synthetic_corpus(n: int) -> Corpus:
    """Word-like bytes without any file: a fixed pseudo-random vocabulary of 'words' joined by
    spaces and newlines, so boundaries have structure to find."""
    g = torch.Generator().manual_seed(0)
    letters = torch.randint(97, 123, (4096, 12), generator=g)
    lengths = torch.randint(1, 12, (4096,), generator=g)
    words = [bytes(letters[i, : lengths[i]].tolist()) for i in range(4096)]
    picks = torch.randint(0, 4096, (n // 6 + 1,), generator=g).tolist()
    data = b" ".join(words[i] + (b"\n" if i % 13 == 0 else b"") for i in picks)[:n]
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    cut = len(t) * 49 // 50
    return Corpus(train=t[:cut].clone(), val=t[cut:].clone(), source="synthetic")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: the test preset, fp32, a few steps")
    ap.add_argument("--preset", default=None, help="default nl-147m (tiny: test)")
    ap.add_argument("--steps", type=int, default=None, help="timed + warm-up steps (default 300; tiny 12)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 10; tiny 2)")
    ap.add_argument("--batch-size", type=int, default=None, help="per-device batch (default: the preset's 16)")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (adds compile time)")
    ap.add_argument("--data", default="synthetic", help="synthetic (default, no files), stdlib, or a path")
    ap.add_argument("--time-limit", type=float, default=200.0, help="stop the timed loop after this many seconds")
    ap.add_argument("--out", help="write the JSON report here as well")
    ap.add_argument("overrides", nargs="*", help="extra section.key=value config overrides")
    args = ap.parse_args()

    tiny = args.tiny
    preset = args.preset or ("test" if tiny else "nl-147m")
    steps = args.steps or (12 if tiny else 300)
    warmup = args.warmup if args.warmup is not None else (2 if tiny else 10)
    device = "cpu" if tiny else "auto"
    out_dir = tempfile.mkdtemp(prefix="rltok_gpu_check_")
    overrides = [f"train.device={device}", f"train.out_dir={out_dir}", f"train.max_steps={steps}",
                 f"train.warmup_steps={min(50, steps // 4) or 1}", f"train.compile={str(args.compile).lower()}",
                 "train.eval_batches=1"]
    if tiny:
        overrides += ["train.dtype=fp32", "train.threads=1"]  # 2 threads on a shared 2-core box stall
    if args.batch_size:
        overrides.append(f"train.batch_size={args.batch_size}")
    if args.seq_len:
        overrides.append(f"train.seq_len={args.seq_len}")
    overrides += args.overrides
    cfg = load_config(preset, overrides=overrides)
    t0 = time.perf_counter()
    if args.data == "synthetic":
        corpus = synthetic_corpus(2_000_000 if tiny else 64_000_000)
    else:
        corpus = load_corpus(args.data, max_bytes=2_000_000 if tiny else 200_000_000)
    trainer = Trainer(cfg, corpus=corpus, quiet=True)
    dev = trainer.device
    setup_s = time.perf_counter() - t0

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    peak_measured = measured_peak_flops(dev, trainer.amp_dtype, budget_s=1.0 if dev.type == "cuda" else 0.25)
    device_name, peak_nominal = nominal_peak(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    step_bytes = cfg.train.batch_size * cfg.train.grad_accum * trainer.sampler.seq_len * trainer.dist.world_size
    print(f"gpu_check: {preset}, {trainer.model.num_params() / 1e6:.1f}M params on {device_name}, "
          f"{'bf16' if trainer.amp_dtype else 'fp32'}{', compiled' if args.compile else ''}, batch "
          f"{cfg.train.batch_size} x {trainer.sampler.seq_len} bytes; {steps} steps ({warmup} warm-up)", file=sys.stderr)

    times, rates, losses, skipped = [], [], [], 0
    t_warm = time.perf_counter()
    for i in range(steps):
        sync()
        t = time.perf_counter()
        metrics = trainer.train_step()
        sync()
        dt = time.perf_counter() - t
        trainer.step += 1
        if metrics is None:
            skipped += 1
            continue
        if i >= warmup:
            times.append(dt)
            rates.append(float(metrics["chunks_per_byte"]) if "chunks_per_byte" in metrics else None)
        losses.append(float(metrics["loss"]))
        if i == warmup - 1:
            print(f"  warm-up done in {time.perf_counter() - t_warm:.1f} s", file=sys.stderr)
        if (i + 1) % max(1, steps // 10) == 0:
            print(f"  step {i + 1}: loss {losses[-1]:.3f}, {step_bytes / dt / 1e3:.1f}k bytes/s", file=sys.stderr)
        if times and sum(times) > args.time_limit:
            print(f"  time limit reached after {i + 1} steps", file=sys.stderr)
            break
    if not times:
        print("error: no timed steps (raise --steps above --warmup)", file=sys.stderr)
        return 1
    total = sum(times)
    bytes_per_s = step_bytes * len(times) / total
    rate = sum(r for r in rates if r is not None) / max(1, sum(r is not None for r in rates)) if any(
        r is not None for r in rates) else None
    fpb = trainer.cost.at(trainer.sampler.seq_len).step_train_per_byte(rate)
    flops_per_s = fpb * bytes_per_s if fpb else None
    report = {
        "preset": preset, "device": device_name, "torch": torch.__version__,
        "dtype": "bf16" if trainer.amp_dtype else "fp32", "compile": args.compile,
        "params": trainer.model.num_params(), "batch_size": cfg.train.batch_size, "seq_len": trainer.sampler.seq_len,
        "timed_steps": len(times), "warmup_steps": warmup, "skipped_steps": skipped,
        "median_step_s": sorted(times)[len(times) // 2], "bytes_per_s": bytes_per_s,
        "train_flops_per_byte": fpb, "achieved_rate": rate, "train_flops_per_s": flops_per_s,
        "peak_flops_measured": peak_measured, "mfu_vs_measured_peak": flops_per_s / peak_measured if flops_per_s else None,
        "peak_flops_nominal": peak_nominal,
        "mfu_vs_nominal_peak": flops_per_s / peak_nominal if flops_per_s and peak_nominal else None,
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "setup_s": setup_s, "wall_s": time.perf_counter() - t0,
        "max_memory_gib": torch.cuda.max_memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else None,
        "command": " ".join(sys.argv),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    mfu = report["mfu_vs_nominal_peak"] or report["mfu_vs_measured_peak"]
    print(f"gpu_check: {bytes_per_s / 1e3:,.1f}k bytes/s, MFU {100 * (mfu or 0):.1f}% "
          f"({'datasheet' if report['mfu_vs_nominal_peak'] else 'measured'} peak), loss {report['loss_first']:.3f} -> "
          f"{report['loss_last']:.3f}, {report['wall_s']:.0f} s in all", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
