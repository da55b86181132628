"""trainer.pt: everything besides the weights that the next step depends on (optimiser, data
position, every RNG stream, the objective's prices and controllers, counters, the metric sums
of the current logging interval), written with each checkpoint and read back on resume, so a
resumed run continues bit for bit."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from rltok.training import distributed as ddp
from rltok.training.checkpoint import SHARDED, CheckpointError
from rltok.config import ConfigError, ModelConfig

if TYPE_CHECKING:
    from rltok.training.trainer import Trainer

# bump when its keys change meaning (2: the objective's state under "objective", optimiser state by
# name; 3: under FSDP the optimiser state is in the checkpoint's dcp/ folder, "optimizer" is None)
STATE_VERSION = 3


def capture(tr: Trainer) -> dict:
    """The trainer's state. Under data parallelism a collective: every rank calls it together."""
    state = {
        "version": STATE_VERSION,
        "step": tr.step,
        "bytes_seen": tr.bytes_seen,
        "objective": tr.objective.state_dict(),
        # FSDP: written with the model's shards by every rank (checkpoint.SHARDED, Trainer.save)
        "optimizer": None if ddp.is_fsdp(tr.model) else ddp.optimizer_state_by_name(tr.model, tr.opt),
        "sampler": tr.sampler.state_dict(),  # the data position
        "boundary_gen": tr.boundary_gen.get_state(),
        "torch_rng": torch.get_rng_state(),  # dropout
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "bad_steps": tr.bad_steps,
        "skipped_steps": tr.skipped_steps,
        "warnings": tr.report.warnings,
        "collapse_streak": tr.report.collapse_streak,
        "log_acc": dict(tr.meter.sums),  # so the first record after a resume averages the same steps
        "log_n": tr.meter.n,
        "data": tr.data_id,
    }
    if tr.device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(tr.device)
    if tr.dist.enabled:
        # the global means so far: each rank restarts from them and adds its own new sums,
        # and the all-reduce at the next record still averages the same steps
        state["log_acc"] = ddp.mean_of_sums(tr.meter.sums, tr.dist, tr.device)
        rngs = (torch.get_rng_state(), torch.cuda.get_rng_state(tr.device) if tr.device.type == "cuda" else None)
        state["rank_rng"] = ddp.all_gather_object(rngs, tr.dist)  # each rank's dropout stream
        state["world_size"] = tr.dist.world_size
    return state


def check_resumable(state: dict | None, ckpt: Path, saved: ModelConfig, wanted: ModelConfig) -> None:
    """Refuse a checkpoint that cannot continue this run: no trainer state, a newer format, or
    another model."""
    if state is None:
        raise CheckpointError(f"checkpoint {ckpt} has no trainer.pt: it can be evaluated but not resumed")
    if state.get("version", 1) > STATE_VERSION:
        raise CheckpointError(f"checkpoint {ckpt} was written by a newer rltok; upgrade to resume it")
    changed = [f"{f.name} {getattr(saved, f.name)!r} -> {getattr(wanted, f.name)!r}"
               for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(wanted, f.name)]
    if changed:
        raise ConfigError(f"cannot resume {ckpt}: the model config differs from the checkpoint's "
                          f"({'; '.join(changed)}); resume with the original model settings")


def restore(tr: Trainer, state: dict, ckpt: Path) -> None:
    """Put `state` back into the trainer (its weights are loaded already). A checkpoint written
    under FSDP holds the optimiser state (and the model's) in its dcp/ folder, which loads into
    any layout; the others, in trainer.pt."""
    if state.get("optimizer") is None and (ckpt / SHARDED).is_dir():
        ddp.load_sharded_state(tr.model, tr.opt, ckpt / SHARDED)
    else:
        ddp.load_full_optimizer_state(tr.model, tr.opt, state["optimizer"])
    tr.sampler.load_state_dict(state["sampler"])
    tr.boundary_gen.set_state(state["boundary_gen"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    if "cuda_rng" in state and tr.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], tr.device)
    rank_rng = state.get("rank_rng")
    if tr.dist.enabled and rank_rng and len(rank_rng) == tr.dist.world_size:
        cpu_rng, cuda_rng = rank_rng[tr.dist.rank]
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None and tr.device.type == "cuda":
            torch.cuda.set_rng_state(cuda_rng, tr.device)
    tr.step = state["step"]
    tr.bytes_seen = state["bytes_seen"]
    tr.objective.load_state_dict(state.get("objective", state))  # older states: top-level keys
    tr.bad_steps = state.get("bad_steps", 0)
    tr.skipped_steps = state.get("skipped_steps", 0)
    tr.report.warnings = state.get("warnings", 0)
    tr.report.collapse_streak = state.get("collapse_streak", 0)
    tr.meter.sums = dict(state.get("log_acc", {}))
    tr.meter.n = state.get("log_n", 0)
    if state.get("data", tr.data_id) != tr.data_id:
        tr.report.log(f"warning: the training data changed since {ckpt.name} "
                      f"({state['data']['train_bytes']:,} -> {tr.data_id['train_bytes']:,} bytes); "
                      "the run continues, but not as an exact continuation")
