"""Data-parallel plumbing for `torchrun`: process-group set-up from its environment variables,
global means across ranks, and sharding helpers.

Nothing here does anything in a plain single process (WORLD_SIZE unset or 1): every helper
then returns its input unchanged, so single-process training stays bit-identical.

The invariant the trainer relies on: an N-rank run with per-rank batch B/N sees exactly the
batch (windows and boundary noise) of a 1-process run with batch B. Every rank draws the same
global random numbers from identically seeded generators and keeps its own slice of rows.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # None: not distributed

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = DistInfo()


def env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def init_from_env(device_type: str, timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT). NCCL when the ranks train on CUDA, gloo otherwise. An already initialised
    group (a second Trainer in the same process, or a caller's own) is reused."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")),
                        dist.get_backend())
    world = env_world_size()
    if world <= 1:
        return SINGLE
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # before init, so NCCL binds each rank to its own GPU
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_(t: torch.Tensor, info: DistInfo, op=None) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op)
    return t


def broadcast_object(obj, info: DistInfo, src: int = 0):
    """`obj` of rank `src` on every rank (pickled; for small things: results, errors)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj, info: DistInfo) -> list:
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def mean_of_sums(values: dict[str, torch.Tensor | float], info: DistInfo, device) -> dict[str, float]:
    """Average a dict of per-rank scalar sums over ranks, in one all-reduce (keys must match on
    every rank). Each rank's value is a mean over an equally sized shard, so the average over
    ranks is the global mean."""
    keys = sorted(values)
    if not info.enabled:
        return {k: float(values[k]) for k in keys}
    flat = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device).reshape(()) for k in keys])
    all_reduce_(flat, info)
    flat /= info.world_size
    return dict(zip(keys, flat.tolist()))


class GlobalBatchMean:
    """The per-position batch mean over the *global* batch, for `compute_loss(batch_mean=...)`.

    Called on a (B_local, T) tensor it all-reduces the per-position sums and the row count
    (one collective of T+1 numbers), so the batch-relative baseline is the same one a
    single process would compute over all B rows. `masked_mean(x, mask)` is the global
    scalar counterpart (the rate loss' stop-gradient mean boundary probability). Inputs are
    detached quantities; the collectives carry no gradient."""

    def __init__(self, info: DistInfo):
        self.info = info

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        buf = torch.cat([x.sum(0).float(), torch.tensor([x.shape[0]], dtype=torch.float32, device=x.device)])
        all_reduce_(buf, self.info)
        return (buf[:-1] / buf[-1]).unsqueeze(0).to(x.dtype)

    def masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        m = mask.to(torch.float32)
        buf = torch.stack([(x.float() * m).sum(), m.sum()])
        all_reduce_(buf, self.info)
        return (buf[0] / buf[1].clamp(min=1)).to(x.dtype)


def shard_rows(x: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """This rank's contiguous block of rows of a global batch (B_global divisible by N)."""
    if not info.enabled:
        return x
    n = x.shape[0] // info.world_size
    return x[info.rank * n:(info.rank + 1) * n]
