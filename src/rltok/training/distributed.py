"""Data-parallel plumbing for `torchrun`: process groups, global means, sharding helpers (each the
identity in one process), so that N ranks see exactly the windows and noise of one process."""

from __future__ import annotations

import datetime
import os
import pickle
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

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


def env_ranks() -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as torchrun sets them, checked together (a stray RANK must
    neither skip the run folder's lock nor wait for peers): one ConfigError when they disagree."""
    from rltok.config import ConfigError

    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    given = {n: os.environ[n].strip() for n in names if os.environ.get(n, "").strip()}
    values = {}
    for name, text in given.items():
        if not text.isdigit() or len(text) > 6:
            raise ConfigError(f"{name}={text!r} in the environment is not a whole number >= 0 (torchrun sets it)")
        values[name] = int(text)
    world = values.get("WORLD_SIZE", 1)
    rank, local = values.get("RANK", 0), values.get("LOCAL_RANK", 0)
    shown = ", ".join(f"{n}={given[n]}" for n in names if n in given)
    if world < 1:
        raise ConfigError(f"WORLD_SIZE={world} in the environment: a run has at least one process")
    if world == 1 and (rank or local):
        raise ConfigError(f"the environment says {shown} without a WORLD_SIZE above 1: unset RANK and LOCAL_RANK "
                          "for a single-process run, or start the ranks with torchrun")
    if world > 1:
        missing = [n for n in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n, "").strip()]
        if missing:
            raise ConfigError(f"WORLD_SIZE={world} in the environment but {', '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not set: start the ranks with torchrun, "
                              "or unset WORLD_SIZE for a single-process run")
        if rank >= world or local >= world:
            raise ConfigError(f"the environment says {shown}: a rank must be below WORLD_SIZE")
    return rank, world, local


def init_from_env(device_type: str, timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT). NCCL when the ranks train on CUDA, gloo otherwise. An already initialised
    group (a second Trainer in the same process, or a caller's own) is reused."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")),
                        dist.get_backend())
    _, world, local_rank = env_ranks()
    if world <= 1:
        return SINGLE
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # before init, so NCCL binds each rank to its own GPU
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend)


def is_main_process() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        # Release what still holds the group (a DDP wrapper in a reference cycle) while every
        # peer is alive, then tear down together: a gloo group freed at interpreter exit, after
        # a peer has gone, aborts ("terminate called without an active exception").
        import gc

        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()


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
    """Average a dict of per-rank scalars (means over equal shards) over ranks, in one all-reduce."""
    keys = sorted(values)
    if not info.enabled or not keys:
        return {k: float(values[k]) for k in keys}
    flat = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device).reshape(()) for k in keys])
    all_reduce_(flat, info)
    flat /= info.world_size
    return dict(zip(keys, flat.tolist()))


class GlobalBatchMean:
    """The per-position batch mean over the *global* batch (one collective of T+1 numbers), for
    `compute_loss(batch_mean=...)`, and `masked_mean(x, mask)`, its global scalar counterpart. Of
    detached quantities: the collectives carry no gradient."""

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

    def rows(self, x: torch.Tensor) -> int:
        """The global batch's rows: every rank holds as many (data parallel's equal micro-batches)."""
        return int(x.shape[0]) * self.info.world_size


# ---- wrapping the model ---------------------------------------------------------------------
def wrap_model(model: torch.nn.Module, info: DistInfo, device: torch.device, fsdp: bool = False,
               find_unused: bool = False) -> torch.nn.Module:
    """The module the training forward/backward goes through: `model` in one process, a DDP around
    it, or (fsdp=True) `model` sharded in place with FSDP2's `fully_shard`, one unit per block."""
    if not info.enabled:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        from rltok.model.layers import Block

        for module in list(model.modules()):
            if isinstance(module, Block):
                fully_shard(module)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused)


def is_fsdp(module: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(module, FSDPModule)


def grad_sync(wrapped: torch.nn.Module, sync: bool):
    """Context for one micro-batch: gradients are all-reduced only on the last micro-batch of a
    step (DDP `no_sync` / FSDP2 `set_requires_gradient_sync`), the others accumulate locally."""
    if is_fsdp(wrapped):
        wrapped.set_requires_gradient_sync(sync)
    elif not sync and hasattr(wrapped, "no_sync"):
        return wrapped.no_sync()
    return nullcontext()


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly sharded DTensor) tensor that this rank holds."""
    return t.to_local() if hasattr(t, "to_local") else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _param_names(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[str]:
    """The optimiser's parameters' names, in the order of `opt.state_dict()`'s integer ids."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for g in opt.param_groups for p in g["params"]]


def _checked_by_name(state: dict, names: list[str], opt: torch.optim.Optimizer) -> dict:
    """`state` keyed by parameter name, checked against the optimiser: the same parameter groups,
    each with the same parameters. A state keyed by integer ids (checkpoints written before the
    optimiser state was keyed by name) is read in the optimiser's own order."""
    from rltok.training.checkpoint import CheckpointError

    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or not isinstance(state.get("state"), dict):
        raise CheckpointError("the optimiser state in trainer.pt is not an optimiser state dict")
    saved = [p for g in groups for p in g["params"]]
    if saved and all(isinstance(p, int) for p in saved):  # the integer-id format
        if sorted(saved) != list(range(len(names))):
            raise CheckpointError(f"the optimiser state in trainer.pt (integer ids) holds {len(saved)} parameters, "
                                  f"the model's optimiser {len(names)}: it belongs to another model")
        state = {"state": {names[i]: v for i, v in state["state"].items()},
                 "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups]}
        groups = state["param_groups"]
    own, start = [], 0  # the optimiser's own groups, as names
    for g in opt.param_groups:
        own.append(names[start:start + len(g["params"])])
        start += len(g["params"])
    if len(groups) != len(own) or any(set(g["params"]) != set(o) for g, o in zip(groups, own)):
        missing = sorted(set(names) - {p for g in groups for p in g["params"]})
        unexpected = sorted({p for g in groups for p in g["params"]} - set(names))
        raise CheckpointError(f"the optimiser state in trainer.pt does not match the model's optimiser "
                              f"({len(groups)} parameter groups, the optimiser {len(own)}; missing {missing}, "
                              f"unexpected {unexpected}); resume with the original settings (objective.policy_lr_mult)")
    if set(state["state"]) - set(names):
        raise CheckpointError(f"the optimiser state in trainer.pt names unknown parameters "
                              f"{sorted(set(state['state']) - set(names))}")
    return state


def optimizer_state_by_name(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """`opt.state_dict()` with every integer id replaced by its parameter's name in `model`."""
    names = _param_names(model, opt)
    sd = opt.state_dict()
    return {"state": {names[i]: v for i, v in sd["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]}


def full_model_state(model: torch.nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """A full (unsharded) CPU state dict. Collective under FSDP: every rank must call it, and
    only rank 0 receives the tensors (others get an empty dict)."""
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def load_full_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(state)


def save_sharded_state(model: torch.nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    """Every rank writes its shards of the model and optimiser state into the folder `path`
    (torch.distributed.checkpoint, keyed by parameter name). Every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))


def load_sharded_state(model: torch.nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    """Read what save_sharded_state wrote into `model` and `opt`, whatever their layout now (matched
    by parameter name and resharded). Every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from rltok.model.chunkers import learned_rules
    from rltok.training.checkpoint import CheckpointError
    from rltok.training.safe_load import read_sharded_metadata, safe_sharded_reader

    try:  # checked first, so a refused metadata file is one clear error
        meta = read_sharded_metadata(path)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
        raise CheckpointError(f"cannot read the sharded state's metadata in {path} ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:300]})") from None
    # a rule that had settled holds buffers only from then on: register them, so they are read
    saved = set(getattr(meta, "state_dict_metadata", {}) or {})
    for name, rule in learned_rules(model):
        if f"model.{name}.settled" in saved and not rule.is_settled:
            rule.settle()
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    try:
        with warnings.catch_warnings():  # one process reading a checkpoint of several is intended
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            # the metadata is a pickle: read it with an unpickler that runs no code
            dcp.load(state, storage_reader=safe_sharded_reader(path))
    except Exception as e:  # torch.distributed.checkpoint wraps every rank's failure in its own type
        raise CheckpointError(f"cannot read the sharded state in {path} ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:500]})") from None
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_full_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    """Load a full optimiser state keyed by parameter name (or by older checkpoints' integer ids)
    into `opt`, matching parameters by name; under FSDP every rank calls it and it is sharded."""
    names = _param_names(model, opt)
    state = _checked_by_name(state, names, opt)
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, opt, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))
        return
    # torch's load_state_dict pairs saved and current parameters by position: give it the
    # current optimiser's own ids, each group's in its own order
    index = {n: i for i, n in enumerate(names)}
    groups, start = [], 0
    for g, own in zip(state["param_groups"], opt.param_groups):
        groups.append({**g, "params": list(range(start, start + len(own["params"])))})
        start += len(own["params"])
    opt.load_state_dict({"state": {index[n]: v for n, v in state["state"].items()}, "param_groups": groups})
