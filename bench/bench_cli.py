"""How long `rltok --help` (and `rltok presets`) take, each in a fresh process: the start-up a
user waits for before any command does work. A benchmark, not a test: it prints the median of a
few runs. The prompt commands load no torch (tests/test_faults.py holds that); this shows what
that is worth.

    PYTHONPATH=src python bench/bench_cli.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def median_time(cmd: list[str], repeats: int, env: dict) -> float:
    """Median wall time of `cmd` in a fresh process: a cold first run does not move it."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_command(argv: list[str], repeats: int) -> float:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return median_time([sys.executable, "-m", "rltok.cli", *argv], repeats, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch_s = median_time([sys.executable, "-c", "import torch"], args.repeats, {**os.environ, "PYTHONPATH": SRC})
    for argv in (["--help"], ["presets"]):
        print(f"rltok {' '.join(argv):<8} {time_command(argv, args.repeats):.3f} s (median of {args.repeats})")
    print(f"for scale, python -c 'import torch': {torch_s:.3f} s (median of {args.repeats})")


if __name__ == "__main__":
    main()
