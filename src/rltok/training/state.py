"""trainer.pt: everything besides the weights that the next step depends on, written with each
checkpoint and read back on resume, so a resumed run continues bit for bit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import random
from pathlib import Path

import numpy as np
import torch

from rltok.training import distributed as ddp
from rltok.training.checkpoint import SHARDED, CheckpointError
from rltok.config import ConfigError, ModelConfig
from rltok.data.windows import WindowSampler
from rltok.objective.loss import BoundaryObjective
from rltok.training.metrics import IntervalMeter, Reporter

# bump when its keys change meaning (2: the objective's state under "objective", optimiser state by
# name; 3: under FSDP the optimiser state is in the checkpoint's dcp/ folder, "optimizer" is None)
STATE_VERSION = 3


def check_resumable(state: dict | None, ckpt: Path, saved: ModelConfig, wanted: ModelConfig) -> None:
    """Refuse a checkpoint that cannot continue this run: no trainer state, a newer format, another model."""
    if state is None:
        raise CheckpointError(f"checkpoint {ckpt} has no trainer.pt: it can be evaluated but not resumed")
    if state.get("version", 1) > STATE_VERSION:
        raise CheckpointError(f"checkpoint {ckpt} was written by a newer rltok; upgrade to resume it")
    changed = [f"{f.name} {getattr(saved, f.name)!r} -> {getattr(wanted, f.name)!r}"
               for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(wanted, f.name)]
    if changed:
        raise ConfigError(f"cannot resume {ckpt}: the model config differs from the checkpoint's "
                          f"({'; '.join(changed)}); resume with the original model settings")


def numpy_rng_state() -> tuple:
    """NumPy's global RNG state with its key array as a list of ints, so that trainer.pt holds
    no NumPy objects and loads with torch's weights-only unpickler."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return (name, keys.tolist(), int(pos), int(has_gauss), float(gauss))


def set_numpy_rng_state(state: tuple) -> None:
    """Put back numpy_rng_state() (or the array form older trainer states hold)."""
    name, keys, *rest = state
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))


@dataclass
class TrainState:
    """The counters below and the stateful parts the trainer steps (optimiser, data sampler,
    boundary-noise generator, the objective's state, the logging interval's sums), saved and
    restored whole."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sampler: WindowSampler
    boundary_gen: torch.Generator
    objective: BoundaryObjective
    meter: IntervalMeter
    report: Reporter
    device: torch.device
    dist: ddp.DistInfo
    data_id: dict
    step: int = 0
    bytes_seen: int = 0
    bad_steps: int = 0  # consecutive non-finite steps
    skipped_steps: int = 0  # all non-finite steps so far
    # (step, progress): where the learning rate's decay went on from after a resume changed
    # max_steps (Trainer.schedule_progress); None: the plain schedule
    lr_anchor: tuple[int, float] | None = None

    def state_dict(self) -> dict:
        """The whole state. Under data parallelism a collective: every rank calls it together."""
        state = {
            "version": STATE_VERSION,
            "step": self.step,
            "bytes_seen": self.bytes_seen,
            "objective": self.objective.state_dict(),
            # FSDP: written with the model's shards by every rank (checkpoint.SHARDED, Trainer.save)
            "optimizer": None if ddp.is_fsdp(self.model) else ddp.optimizer_state_by_name(self.model, self.opt),
            "sampler": self.sampler.state_dict(),  # the data position
            "boundary_gen": self.boundary_gen.get_state(),
            "torch_rng": torch.get_rng_state(),  # dropout
            "python_rng": random.getstate(),
            "numpy_rng": numpy_rng_state(),
            "bad_steps": self.bad_steps,
            "skipped_steps": self.skipped_steps,
            "lr_anchor": None if self.lr_anchor is None else list(self.lr_anchor),
            "warnings": self.report.warnings,
            "collapse_streak": self.report.collapse_streak,
            "log_acc": dict(self.meter.sums),  # so the first record after a resume averages the same steps
            "log_n": self.meter.n,
            "data": self.data_id,
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        if self.dist.enabled:
            # the global means so far: each rank restarts from them and adds its own new sums,
            # and the all-reduce at the next record still averages the same steps
            state["log_acc"] = ddp.mean_of_sums(self.meter.sums, self.dist, self.device)
            rngs = (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None)
            state["rank_rng"] = ddp.all_gather_object(rngs, self.dist)  # each rank's dropout stream
            state["world_size"] = self.dist.world_size
        return state

    def load_state_dict(self, state: dict, ckpt: Path) -> None:
        """Put `state` back (the model's weights are loaded already). A checkpoint written
        under FSDP holds the optimiser state (and the model's) in its dcp/ folder, which loads into
        any layout; the others, in trainer.pt."""
        if state.get("optimizer") is None and (ckpt / SHARDED).is_dir():
            ddp.load_sharded_state(self.model, self.opt, ckpt / SHARDED)
        else:
            ddp.load_full_optimizer_state(self.model, self.opt, state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.boundary_gen.set_state(state["boundary_gen"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        set_numpy_rng_state(state["numpy_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        rank_rng = state.get("rank_rng")
        if self.dist.enabled and rank_rng and len(rank_rng) == self.dist.world_size:
            cpu_rng, cuda_rng = rank_rng[self.dist.rank]
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None and self.device.type == "cuda":
                torch.cuda.set_rng_state(cuda_rng, self.device)
        self.step = state["step"]
        self.bytes_seen = state["bytes_seen"]
        self.objective.load_state_dict(state.get("objective", state))  # older states: top-level keys
        self.bad_steps = state.get("bad_steps", 0)
        self.skipped_steps = state.get("skipped_steps", 0)
        anchor = state.get("lr_anchor")
        self.lr_anchor = None if anchor is None else (int(anchor[0]), float(anchor[1]))
        self.report.warnings = state.get("warnings", 0)
        self.report.collapse_streak = state.get("collapse_streak", 0)
        self.meter.sums = dict(state.get("log_acc", {}))
        self.meter.n = state.get("log_n", 0)
        if state.get("data", self.data_id) != self.data_id:
            self.report.log(f"warning: the training data changed since {ckpt.name} "
                          f"({state['data']['train_bytes']:,} -> {self.data_id['train_bytes']:,} bytes); "
                          "the run continues, but not as an exact continuation")
