"""Refuse a training config whose model and batch cannot fit in memory, before anything is allocated
(the model built on the meta device). The estimate is a lower bound, so only impossible sizes are
refused: a test-preset step measures ~16 KB per position, this counts ~3 KB."""

from __future__ import annotations

import os

import torch

from rltok.config import FAMILIES, VOCAB_SIZE, Config, ConfigError
from rltok.model.factory import planned_model


def training_bytes(cfg: Config, world_size: int = 1) -> tuple[int, int]:
    """(parameter state, activations) in bytes: the lower bound one rank needs to train `cfg`."""
    m, tc = cfg.model, cfg.train
    params = sum(p.numel() for p in planned_model(m).parameters())
    state = 16 * params
    if tc.fsdp:  # sharded across the ranks
        state //= max(1, world_size)
    positions = tc.batch_size * tc.seq_len
    family = FAMILIES.component(m.arch)
    if family.hierarchical:
        # encoder and decoder on every byte, the chunk level on ~target_rate of them; the
        # next-byte head and the early-exit head on every byte
        per_position = (2 * m.d_byte * (m.encoder_layers + m.decoder_layers)
                        + 2 * m.d_chunk * m.main_layers * m.target_rate + 2 * VOCAB_SIZE * 6)
    elif getattr(family, "reads_tokens", False):  # one position per token, at least ~target_rate tokens per byte
        per_position = m.target_rate * (2 * m.d_chunk * m.flat_layers + (m.bpe_vocab or VOCAB_SIZE) * 6)
    else:
        per_position = 2 * m.d_chunk * m.flat_layers + VOCAB_SIZE * 6
    return state, int(positions * per_position)


def host_memory() -> int | None:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit if smaller."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                total = min(total, int(f.read().strip()))
        except (OSError, ValueError):  # absent, or "max"
            continue
    return total


def size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def refuse_what_cannot_fit(cfg: Config, device: torch.device | str = "cpu", world_size: int = 1) -> None:
    """ConfigError, in one line naming both numbers, when training `cfg` on `device` needs more
    memory than it has. On a GPU the model is still built on the host first (its weights)."""
    device = torch.device(device)
    state, acts = training_bytes(cfg, world_size)
    need = state + acts
    parts = (f"{size(state)} of weights, gradients and AdamW state + {size(acts)} of activations for "
             f"train.batch_size={cfg.train.batch_size} x train.seq_len={cfg.train.seq_len}")
    checks = [(need, host_memory(), "memory", parts)] if device.type == "cpu" else \
        [(state // 4, host_memory(), "host memory", "its fp32 weights, built on the host first")]
    if device.type == "cuda" and torch.cuda.is_available():
        checks.append((need, torch.cuda.mem_get_info(device)[1], f"{device} memory", parts))
    for needed, have, what, why in checks:
        if have is not None and needed > have:
            raise ConfigError(f"training this model needs at least {size(needed)} ({why}), more than the "
                              f"{size(have)} of {what} here: make the model or the batch smaller")
