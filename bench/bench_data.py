"""Data at scale: memory, start-up and loader throughput of training on prepared byte shards.

    python bench/bench_data.py                        # 0.1, 1 and 4 GB corpora: ~8 minutes on 2 busy cores
                                                      # when the in-memory run trained 10 steps (now --steps)
    python bench/bench_data.py --sizes 0.05 0.2 --steps 20 --no-unprepared     # a quick look

For each size it generates a corpus (a folder of ~1 MB text files, distinct documents), runs
`rltok prepare` on it in a fresh process (the prepare call's wall time inside that process, so
no interpreter start-up or imports; the process' peak RSS), then trains the default model for
--steps steps on the prepared folder in a fresh process, measuring:
  start-up     seconds to build the Trainer (open the corpus, build the model, draw the
               validation windows) and its RSS (VmRSS) right after
  RSS          after the steps (the run's final validation and checkpoint included)
  train B/s    the training throughput of the default model (median of the logged 10-step
               records, the first one, with the cold first step, left out)
  loader B/s   WindowSampler.next() alone on the same stream with the run's batch shape, from
               the warm page cache (prepare has just written the shards and the run read them)
The same corpus read into memory as today (data.prepare_above=0) is measured once, at the
smallest size, for contrast, with the same steps and records. Generated corpora are deleted after
each size. Sizes that do not fit the disk (source + staging + shards, about 3x the size) are left
out, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GB = 1e9
DOC_BYTES = 1 << 20  # about one document per MB


def rss_mb(key: str = "VmRSS") -> float:
    """This process' resident memory (VmRSS) or its peak so far (VmHWM), in MB."""
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def generate(folder: Path, size: float, seed: int = 0) -> int:
    """A folder of text documents totalling `size` bytes: slices of a random word pool, each
    starting with its own header so that no two are alike."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words = [bytes(rng.choice(letters, rng.integers(2, 10))) for _ in range(5000)]
    freq = 1 / np.arange(1, len(words) + 1)  # Zipf-like word frequencies
    picks = rng.choice(len(words), 600_000, p=freq / freq.sum())  # a pool of about 4 MB
    seps = np.array([b" ", b" ", b" ", b"\n", b", ", b". "], dtype=object)[rng.integers(0, 6, len(picks))]
    pool = b"".join(w + s for w, s in zip((words[i] for i in picks.tolist()), seps.tolist()))
    folder.mkdir(parents=True)
    written, i = 0, 0
    while written < size:
        header = f"# document {i}\n".encode()
        n = int(min(size - written, rng.integers(DOC_BYTES // 2, 3 * DOC_BYTES // 2)))
        start = int(rng.integers(0, len(pool) - n))
        doc = header + pool[start:start + max(0, n - len(header))]
        (folder / f"doc{i:06d}.txt").write_bytes(doc)
        written += len(doc)
        i += 1
    return written


def run(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of a child process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
        out = proc.stdout.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.read().decode(errors='replace')[-3000:]}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024, out


def child_prepare(src: str, out: str) -> None:
    """In a fresh process: `rltok prepare SRC --out OUT`, then its summary, wall time and peak RSS."""
    import contextlib
    import io

    import rltok.data.prepare  # noqa: F401  imported before the clock starts: the command's own time, not imports
    from rltok.cli import main as cli

    buf = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc = cli(["prepare", src, "--out", out, "-q"])
    wall = time.perf_counter() - start
    if rc:
        sys.exit(rc)
    print(json.dumps({**json.loads(buf.getvalue()), "prepare_s": wall, "peak_rss_mb": rss_mb("VmHWM")}))


def steady_rates(history: list[dict]) -> list[float]:
    """bytes/s of the logged records after the first (which holds the cold first step)."""
    rates = [r["bytes_per_s"] for r in history if "bytes_per_s" in r][1:]
    if not rates:
        raise SystemExit("bench_data: no logged record after the first: train at least 20 steps (--steps)")
    return rates


def child_train(data: str, steps: int, out: str, extra: list[str]) -> None:
    """In a fresh process: start-up, RSS, training and loader throughput on `data`."""
    t0 = time.perf_counter()
    import torch

    from rltok.config import load_config
    from rltok.data.windows import WindowSampler
    from rltok.training.trainer import Trainer

    imported = time.perf_counter()
    rss_imported = rss_mb()
    cfg = load_config("tiny", overrides=[f"data.train={data}", f"train.out_dir={out}", f"train.max_steps={steps}",
                                         f"train.eval_every={steps}", f"train.checkpoint_every={steps}",
                                         "train.log_every=10", *extra])
    trainer = Trainer(cfg, quiet=True)
    startup = time.perf_counter() - imported
    rss_startup = rss_mb()
    result = trainer.fit()
    rss_after, rss_peak = rss_mb(), rss_mb("VmHWM")
    bps = steady_rates(result.history)
    # the loader alone: the sampler's draws and reads, with the run's batch shape
    sampler = WindowSampler(trainer.corpus.train, cfg.train.batch_size, cfg.train.seq_len, seed=1)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 2.0:
        x, _ = sampler.next()
        n += x.numel()
    loader = n / (time.perf_counter() - start)
    print(json.dumps({"steps": result.step, "import_s": imported - t0, "startup_s": startup, "rss_imported_mb": rss_imported,
                      "rss_startup_mb": rss_startup, "rss_after_mb": rss_after, "rss_peak_mb": rss_peak,
                      "train_bytes_per_s": statistics.median(bps),
                      "loader_bytes_per_s": loader, "train_bytes": len(trainer.corpus.train),
                      "prepared": bool(trainer.corpus.prepared), "torch_threads": torch.get_num_threads()}))


def measure(size: float, root: Path, steps: int, extra: list[str], unprepared: bool, log) -> list[dict]:
    src, prep, run_dir = root / "src", root / "prep", root / "runs"
    for p in (src, prep, run_dir):
        shutil.rmtree(p, ignore_errors=True)
    t = time.perf_counter()
    written = generate(src, size * GB)
    log(f"{size:g} GB: generated {written:,} bytes in {len(list(src.iterdir())):,} files ({time.perf_counter() - t:.0f} s)")
    rows = []
    me = Path(__file__).resolve()
    try:
        process_s, _, out = run([sys.executable, str(me), "--child-prepare", str(src), "--child-out", str(prep)])
        summary = json.loads(out)
        wall, rss = summary["prepare_s"], summary["peak_rss_mb"]
        log(f"  prepare: {wall:.1f} s ({process_s:.1f} s with the process' start-up), peak RSS {rss:.0f} MB, "
            f"{summary['rule']} split")
        _, _, out = run([sys.executable, str(me), "--child-train", str(prep), "--steps", str(steps),
                         "--child-out", str(run_dir / "prep"), "--", *extra])
        rows.append({"size_gb": size, "source_bytes": written, "mode": "prepared", "prepare_s": wall,
                     "prepare_process_s": process_s, "prepare_rss_mb": rss,
                     "train_split_bytes": summary["splits"]["train"]["bytes"], **json.loads(out)})
        log(f"  train on shards: {rows[-1]}")
        if unprepared:
            _, _, out = run([sys.executable, str(me), "--child-train", str(src), "--steps", str(steps),
                             "--child-out", str(run_dir / "mem"), "--", *extra, "data.prepare_above=0"])
            rows.append({"size_gb": size, "source_bytes": written, "mode": "in memory", **json.loads(out)})
            log(f"  train in memory: {rows[-1]}")
    finally:
        for p in (src, prep, run_dir):
            shutil.rmtree(p, ignore_errors=True)
    return rows


def markdown(rows: list[dict], skipped: list[float], meta: dict) -> str:
    lines = [f"Measured {meta['date']} at commit `{meta['commit']}` on {meta['machine']}; training runs: the "
             f"default (tiny) config, batch 8 x 512 bytes, {rows[0]['torch_threads']} torch thread(s).", "",
             "| corpus | read as | prepare (s) | prepare peak RSS (MB) | start-up (s) | RSS after start-up (MB) "
             "| steps | RSS after the steps (MB) | peak RSS (MB) | train B/s | loader B/s | loader / train |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        prep = f"{r['prepare_s']:.1f} ({r['source_bytes'] / r['prepare_s'] / 1e6:.0f} MB/s)" if "prepare_s" in r else "—"
        prss = f"{r['prepare_rss_mb']:.0f}" if "prepare_rss_mb" in r else "—"
        lines.append(f"| {r['size_gb']:g} GB ({r['source_bytes'] / GB:.2f} GB) | {r['mode']} | {prep} | {prss} | "
                     f"{r['startup_s']:.2f} | {r['rss_startup_mb']:.0f} | {r['steps']} | {r['rss_after_mb']:.0f} | {r['rss_peak_mb']:.0f} | "
                     f"{r['train_bytes_per_s']:,.0f} | {r['loader_bytes_per_s'] / 1e6:,.1f}M | "
                     f"{r['loader_bytes_per_s'] / r['train_bytes_per_s']:,.0f}x |")
    prepared = [r for r in rows if r["mode"] == "prepared"]
    if len(prepared) > 1:
        for key, name in (("rss_startup_mb", "RSS after start-up"), ("rss_after_mb", "RSS after the steps")):
            v = [r[key] for r in prepared]
            lines.append("")
            lines.append(f"{name} on shards: {min(v):.0f}–{max(v):.0f} MB across sizes, spread "
                         f"{100 * (max(v) - min(v)) / min(v):.1f}% (target ≤ 10%).")
        s = [r["startup_s"] for r in prepared]
        lines.append(f"Start-up on shards: {min(s):.2f}–{max(s):.2f} s.")
    if skipped:
        lines.append("")
        lines.append(f"Left out, not enough free disk: {', '.join(f'{s:g} GB' for s in skipped)}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1, 4], help="corpus sizes in GB")
    ap.add_argument("--steps", type=int, default=100, help="training steps per run (at least 20: records of 10 "
                    "steps, the first left out)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the training runs (default 1: steady timings on a shared machine)")
    ap.add_argument("--root", default="", help="where to write the corpora (default: a temporary folder)")
    ap.add_argument("--no-unprepared", action="store_true", help="skip the in-memory contrast run")
    ap.add_argument("--json", help="also write the rows as JSON")
    ap.add_argument("--markdown", help="also write the table as markdown")
    ap.add_argument("--child-train", help=argparse.SUPPRESS)
    ap.add_argument("--child-prepare", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_train:
        return child_train(args.child_train, args.steps, args.child_out, args.extra)
    if args.child_prepare:
        return child_prepare(args.child_prepare, args.child_out)
    if args.steps < 20:
        ap.error("--steps must be at least 20: the train rate is taken over 10-step records after the first")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    root = Path(args.root or tempfile.mkdtemp(prefix="rltok_bench_data_"))
    root.mkdir(parents=True, exist_ok=True)
    rows, skipped = [], []
    try:
        for i, size in enumerate(sorted(args.sizes)):
            free = shutil.disk_usage(root).free
            if 3 * size * GB + 2 * GB > free:  # source, staging and shards, plus a margin
                log(f"{size:g} GB does not fit in {free / GB:.1f} GB free under {root}: left out")
                skipped.append(size)
                continue
            rows += measure(size, root, args.steps, [f"train.threads={args.threads}"], unprepared=i == 0 and not args.no_unprepared, log=log)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit or "?", "steps": args.steps,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"}
    table = markdown(rows, skipped, meta)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows, "skipped_gb": skipped}, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
