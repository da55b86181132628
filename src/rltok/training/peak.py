"""The peak FLOP/s that MFU divides by, from the config, a datasheet or a measurement; a peak that an
interval beats is re-measured once, then distrusted (docs/BENCHMARKS.md, "MFU in the training log")."""

from __future__ import annotations

import re
import time
from typing import Callable

import torch
from torch import nn

# Dense peak FLOP/s per device (bf16 and tf32 tensor core, fp32 without tensor cores) from NVIDIA's
# datasheets (H100 SXM/PCIe/NVL, H200, GH200, A100, L40S, L4; the sparse figures they quote
# halved) and the Ada Lovelace whitepaper (RTX 4090: bf16 with fp32 accumulate, what torch uses).
# Patterns are matched against torch.cuda.get_device_name, first match wins.
KNOWN_PEAKS: list[tuple[str, dict[str, float]]] = [
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756.5e12, "tf32": 378e12, "fp32": 51e12}),
    (r"\bH[12]00\b.*\bNVL\b", {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    (r"\bG?H[12]00\b", {"bf16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    (r"\bA100\b", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (r"\bL40S\b", {"bf16": 366.5e12, "tf32": 183e12, "fp32": 91.6e12}),
    (r"\bL4\b", {"bf16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    (r"\bRTX 4090\b", {"bf16": 165.2e12, "tf32": 82.6e12, "fp32": 82.6e12}),
]

UNRELIABLE_NOTE = "peak unreliable on a busy machine: MFU not shown"
# why a peak of each source can be beaten (the note says which)
_WHY_BEATEN = {"measured": UNRELIABLE_NOTE,
               "config": "peak unreliable (train.peak_flops is below the achieved FLOP/s): MFU not shown",
               "datasheet": "peak unreliable (above the datasheet peak: the FLOP count overstates the work): "
                            "MFU not shown"}


def _precision(dtype: torch.dtype | None) -> str:
    """The table column a run's matmuls use: bf16 under autocast (also for fp16: the same tensor
    rate), else tf32 where torch lets fp32 matmuls use it, else fp32."""
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    return "tf32" if _tf32_allowed() else "fp32"


def _tf32_allowed() -> bool:
    return bool(torch.backends.cuda.matmul.allow_tf32)


def known_peak(name: str, dtype: torch.dtype | None = None) -> float | None:
    """The dense datasheet peak of the GPU called `name` for matmuls in `dtype` (None: fp32)."""
    for pattern, peaks in KNOWN_PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            return peaks[_precision(dtype)]
    return None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


# ---- measuring ----------------------------------------------------------------------------------
def model_matmul_shape(model: nn.Module, rows: int, max_rows: int) -> tuple[int, int, int]:
    """(rows, in, out) of the model's largest linear layer applied to `rows` positions (at most
    `max_rows`, so that the timing stays short): a matmul the size of the model's own."""
    largest = max((m for m in model.modules() if isinstance(m, nn.Linear)),
                  key=lambda m: m.in_features * m.out_features, default=None)
    k, n = (largest.in_features, largest.out_features) if largest is not None else (256, 256)
    return max(1, min(rows, max_rows)), k, n


def _time_matmul(a: torch.Tensor, b: torch.Tensor, reps: int) -> float:
    """Seconds for `reps` products a @ b, the device synchronised before the clock stops."""
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if a.device.type == "cuda":
        torch.cuda.synchronize(a.device)
    return time.perf_counter() - t0


def best_matmul_flops(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int],
                      budget_s: float, min_timings: int = 5) -> float:
    """The best FLOP/s of at least `min_timings` timings (more while `budget_s` lasts) of an
    (m, k) @ (k, n) matmul: the maximum, since other work on the machine only ever slows one down."""
    m, k, n = shape
    gen = torch.Generator(device=device).manual_seed(0)  # never the global RNG: training draws dropout from it
    a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
    reps = 4 if device.type == "cuda" else 1
    _time_matmul(a, b, 1)  # warm-up: kernel selection, page faults
    best, timings, deadline = 0.0, 0, time.perf_counter() + budget_s
    while timings < min_timings or time.perf_counter() < deadline:
        best = max(best, reps * 2.0 * m * k * n / max(1e-12, _time_matmul(a, b, reps)))
        timings += 1
    return best


_MEASURED: dict[tuple, float] = {}  # per process: a second Trainer in it does not time again


def measured_peak(device: torch.device, dtypes: tuple[torch.dtype, ...], shapes: list[tuple[int, int, int]],
                  budget_s: float, fresh: bool = False) -> float:
    """The best FLOP/s over every (dtype, shape) pair, each the best of several timings; cached
    per process. `fresh`: time again and keep the better of the cached and the new."""
    key = (str(device), tuple(map(str, dtypes)), tuple(shapes))
    if key in _MEASURED and not fresh:
        return _MEASURED[key]
    share = budget_s / (len(dtypes) * len(shapes))
    new = max(best_matmul_flops(device, dt, s, share) for dt in dtypes for s in shapes)
    _MEASURED[key] = max(new, _MEASURED.get(key, 0.0))
    return _MEASURED[key]


def measured_peak_flops(device: torch.device, dtype: torch.dtype | None = None, budget_s: float = 0.5) -> float:
    """Best FLOP/s of a square matmul on `device` in `dtype` (fp32 if None), the best of several
    timings within about `budget_s` seconds; cached per process."""
    n = 8192 if device.type == "cuda" else 512
    return measured_peak(device, (dtype or torch.float32,), [(n, n, n)], budget_s)


# ---- the peak a run uses ------------------------------------------------------------------------
class PeakFlops:
    """One device's peak FLOP/s for MFU, where it came from, and whether it is still trusted."""

    def __init__(self, flops: float, source: str, remeasure: Callable[[], float] | None = None, detail: str = ""):
        self.flops, self.source, self.detail = flops, source, detail
        self._remeasure = remeasure  # a measured peak's second chance: called once at most
        self.trusted = True

    def describe(self) -> str:
        return f"{self.flops / 1e12:.3g} TFLOP/s per device ({self.detail or self.source})"

    def mfu(self, flops_per_s: float, devices: int = 1) -> tuple[float | None, str | None]:
        """(MFU, note): MFU in [0, 1], or None once the peak is not trusted; the note is given
        once, on the interval where trust was lost."""
        if not self.trusted:
            return None, None
        mfu = flops_per_s / (self.flops * devices)
        if mfu > 1 and self._remeasure is not None:
            self.flops = max(self.flops, self._remeasure())
            self._remeasure = None
            mfu = flops_per_s / (self.flops * devices)
        if mfu <= 1:
            return mfu, None
        self.trusted = False
        return None, (f"{_WHY_BEATEN.get(self.source, UNRELIABLE_NOTE)} (achieved "
                      f"{flops_per_s / devices / 1e12:.3g} TFLOP/s per device > {self.source} peak "
                      f"{self.flops / 1e12:.3g})")


def device_peak(device: torch.device, amp_dtype: torch.dtype | None, model: nn.Module, rows: int) -> PeakFlops:
    """The run's peak: the device's datasheet peak where it is known, else measured on it (the
    model's largest layer at `rows` positions and a square matmul, fp32 and the autocast dtype)."""
    if device.type == "cuda":
        name = device_name(device)
        peak = known_peak(name, amp_dtype)
        if peak is not None:
            return PeakFlops(peak, "datasheet", detail=f"{name} {_precision(amp_dtype)} datasheet")
    cuda = device.type == "cuda"
    shapes = [model_matmul_shape(model, rows, 16384 if cuda else 1024), (8192,) * 3 if cuda else (512,) * 3]
    dtypes = (torch.float32,) + ((amp_dtype,) if amp_dtype not in (None, torch.float32) else ())
    budget = 0.5 if cuda else 0.25

    def measure(fresh: bool = False) -> float:
        return measured_peak(device, dtypes, shapes, budget, fresh=fresh)

    return PeakFlops(measure(), "measured", remeasure=lambda: measure(fresh=True),
                     detail="best of several matmul timings")
