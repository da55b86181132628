"""Which device and autocast dtype a `device` / `dtype` setting (train.device, train.dtype, the
command line's --device) names."""

from __future__ import annotations

import torch

from rltok.config import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available (train.device, or --device)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {name!r} requested but MPS is not available (train.device, or --device)")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if name == "bf16" or (name == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None
