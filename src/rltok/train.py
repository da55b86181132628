"""The training loop: AdamW, warm-up + cosine, clipping, accumulation, validation, checkpoints,
JSONL metrics and a live progress display."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .checkpoint import (CheckpointError, checkpoint_step, clean_stale, list_checkpoints, load_checkpoint,
                         save_checkpoint)
from . import distributed as ddp
from .config import VOCAB_SIZE, Config, ConfigError
from .data import Corpus, WindowSampler, load_corpus, rank_eval_windows
from .device import resolve_device, resolve_dtype
from .evaluate import evaluate_sums, summarize
from .flops import step_train_flops_per_byte
from .model.factory import build_model
from .model.noise import RowShard
from .objective import BoundaryObjective, LocalMean


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite steps; the last good checkpoint is left as it was."""


STATE_VERSION = 2  # of trainer.pt; bump when its keys change meaning (2: the objective's state under "objective", optimiser state by name)
# record keys that depend on wall-clock time (everything else is reproducible run to run)
TIMING_KEYS = ("bytes_per_s", "flops_per_s", "mfu")


def lr_at(step: int, cfg, progress: float | None = None) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr. A function of the step (or, under
    a FLOPs budget, of the share of it spent) alone, so a resumed run needs no scheduler state."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if progress is None:
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, progress)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, cfg, device: torch.device, policy_lr_mult: float = 1.0) -> torch.optim.Optimizer:
    """AdamW; matrices decay, vectors do not. With policy_lr_mult != 1 the boundary rule's own
    parameters (model.chunker) form their own groups whose lr is that multiple of the schedule's."""
    chunker = getattr(model, "chunker", None)
    policy_ids = {id(p) for p in chunker.parameters()} if chunker is not None and policy_lr_mult != 1.0 else set()
    groups = []
    for policy in (False, True):
        params = [p for p in model.parameters() if (id(p) in policy_ids) == policy]
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            if chosen or not policy:  # keep the two base groups even when empty (state layout)
                groups.append({"params": chosen, "weight_decay": cfg.weight_decay if decay else 0.0,
                               "lr_scale": policy_lr_mult if policy else 1.0})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=device.type == "cuda")


def rate_collapse(p_mean: float, target_rate: float) -> str | None:
    """'low' / 'high' when the policy's mean boundary probability sits at an extreme that the
    target rate does not ask for, else None."""
    if p_mean < 0.01 and target_rate >= 0.05:
        return "low"
    if p_mean > 0.95 and target_rate <= 0.9:
        return "high"
    return None


COLLAPSE_ADVICE = {
    "low": "the policy has stopped drawing boundaries, so the main network sees almost no chunks; "
           "raise objective.rate_weight, lower objective.pg_weight or train.lr",
    "high": "the policy puts a boundary on almost every byte (no compression); "
            "raise objective.rate_weight so the rate loss can hold model.target_rate",
}


def read_metrics(path: Path, up_to_step: int | None = None) -> list[dict]:
    """Records of a metrics.jsonl, optionally only those at or before `up_to_step`. A torn last
    line (the process died while writing it) is dropped."""
    records = []
    if not path.is_file():
        return records
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and (up_to_step is None or rec.get("step", 0) <= up_to_step):
            records.append(rec)
    return records


def _write_metrics(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


@dataclass
class TrainResult:
    step: int
    val: dict
    run_dir: Path
    history: list


class Trainer:
    max_bad_steps = 5  # consecutive non-finite steps before the run is declared diverged
    collapse_patience = 3  # consecutive logged records with a collapsed rate before warning

    def __init__(self, cfg: Config, corpus: Corpus | None = None, resume: bool = False, quiet: bool = False):
        self.cfg = cfg.validate()
        tc = cfg.train
        self.run_dir = Path(tc.out_dir)
        existing = list_checkpoints(self.run_dir)
        if existing and not resume:
            # a second run in the same folder would mix trajectories, and pruning would delete
            # the new run's checkpoints in favour of the old run's higher steps
            raise ConfigError(f"{self.run_dir} already holds a run (newest checkpoint: {existing[-1].name}); "
                              "pass --resume to continue it, or choose another --out / train.out_dir")
        if tc.threads > 0:
            torch.set_num_threads(tc.threads)
        self.device = resolve_device(tc.device)
        # under torchrun: join the process group; one process (no WORLD_SIZE) is unchanged
        self.dist = ddp.init_from_env(self.device.type)
        if self.dist.enabled and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", self.dist.local_rank)
        self.quiet = quiet or not self.dist.is_main  # rank 0 alone reports
        self.amp_dtype = resolve_dtype(tc.dtype, self.device)
        self.corpus = corpus or load_corpus(cfg.data.train, cfg.data.val, cfg.data.val_fraction,
                                            cfg.data.max_bytes, cfg.data.hf_text_field,
                                            prepare_above=cfg.data.prepare_above, cache_dir=cfg.data.cache_dir)
        # identifies the training bytes, so a resume can tell when the data changed under it
        self.data_id = self.corpus.fingerprint()
        torch.manual_seed(tc.seed)
        random.seed(tc.seed)
        np.random.seed(tc.seed)
        self.model = self._build_model().to(self.device)
        self.vocab_size = getattr(self.model, "vocab_size", VOCAB_SIZE)  # BPE-token reference: its own
        if self.dist.enabled:
            torch.manual_seed(tc.seed + 1 + self.dist.rank)  # dropout masks differ between ranks
        # the module forward/backward go through: the model, its DDP wrapper, or (FSDP) the
        # model itself, sharded in place
        self.wrapped = ddp.wrap_model(self.model, self.dist, self.device, fsdp=tc.fsdp,
                                      find_unused=tc.ddp_find_unused)
        self.forward = torch.compile(self.wrapped) if tc.compile else self.wrapped
        self.opt = make_optimizer(self.model, tc, self.device, cfg.objective.policy_lr_mult)
        # the baseline and the rate loss' mean boundary probability over the global batch
        # batch_size counts segmentations: with group_size K, K of them share each sequence
        self.group_size = cfg.objective.group_size if cfg.model.arch == "hourglass" else 1
        self.group_kw = {"group_size": self.group_size} if self.group_size > 1 else {}
        self.sampler = WindowSampler(self.corpus.train, tc.batch_size // self.group_size, tc.seq_len, seed=tc.seed,
                                     rank=self.dist.rank, world_size=self.dist.world_size)
        self.boundary_gen = torch.Generator(device=self.device).manual_seed(tc.seed + 1)
        # every rank draws the noise of the global batch and keeps its rows (model/noise.py)
        self.noise = RowShard(self.boundary_gen, self.dist.rank, self.dist.world_size) if self.dist.enabled \
            else self.boundary_gen
        world = self.dist.world_size
        # ranks evaluate equal shares (FSDP needs the same number of forwards on every rank);
        # fewer windows than ranks: every rank evaluates all of them and the sums are averaged
        self.val_x, self.val_y, self.val_shared = rank_eval_windows(
            self.corpus.val, tc.seq_len, tc.eval_batches * tc.batch_size * world, self.dist.rank, world)
        self.peak_flops = tc.peak_flops or None  # measured when fit() starts if not given
        # the boundary decisions' loss and its state: prices, controllers, flips, FLOPs meter
        self.objective = BoundaryObjective(cfg, self.device, vocab_size=self.vocab_size,
                                           reduce=ddp.GlobalBatchMean(self.dist) if self.dist.enabled else LocalMean())
        self.step = 0
        self.bytes_seen = 0
        self.bad_steps = 0  # consecutive non-finite steps
        self.skipped_steps = 0  # all non-finite steps so far
        self.warnings = 0  # rate collapses, failed periodic checkpoints
        self.collapse_streak = 0
        self.log_acc: dict[str, torch.Tensor] = {}  # metric sums since the last logged record
        self.log_n = 0
        self.last_saved_step: int | None = None
        self.stop_requested = False  # acted on; under DDP set on all ranks in the same step
        self.stop_signal = False  # a signal arrived at this process
        self.history: list[dict] = []
        if resume:
            if self.dist.is_main:
                clean_stale(self.run_dir)
            ddp.barrier(self.dist)
            if list_checkpoints(self.run_dir):
                self._restore()
            else:
                self._log(f"no checkpoint in {self.run_dir}: starting from scratch")

    def _build_model(self) -> torch.nn.Module:
        """The model; with data-fitted parts (BPE tokenizers) rank 0 fits them and the others
        receive its state, so every rank holds the same tokenizer."""
        cfg = self.cfg.model
        fitted = cfg.arch == "bpe_token" or (cfg.arch == "hourglass" and cfg.chunker == "bpe")
        if not (self.dist.enabled and fitted):
            return build_model(cfg, train_bytes=self.corpus.train)
        state = None
        if self.dist.is_main:
            model = build_model(cfg, train_bytes=self.corpus.train)
            state = {k: v.cpu() for k, v in model.state_dict().items()}
        state = ddp.broadcast_object(state, self.dist)
        if not self.dist.is_main:
            model = build_model(cfg, state_dict=state)
            model.load_state_dict(state)
        return model

    # ---- state -------------------------------------------------------------------------------
    def trainer_state(self) -> dict:
        """Everything besides the weights that the next step depends on."""
        state = {
            "version": STATE_VERSION,
            "step": self.step,
            "bytes_seen": self.bytes_seen,
            "objective": self.objective.state_dict(),
            "optimizer": ddp.full_optimizer_state(self.model, self.opt),  # collective under FSDP
            "sampler": self.sampler.state_dict(),  # the data position
            "boundary_gen": self.boundary_gen.get_state(),
            "torch_rng": torch.get_rng_state(),  # dropout
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "bad_steps": self.bad_steps,
            "skipped_steps": self.skipped_steps,
            "warnings": self.warnings,
            "collapse_streak": self.collapse_streak,
            "log_acc": dict(self.log_acc),  # so the first record after a resume averages the same steps
            "log_n": self.log_n,
            "data": self.data_id,
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        if self.dist.enabled:  # collectives: every rank calls trainer_state() together
            # the global means so far: each rank restarts from them and adds its own new sums,
            # and the all-reduce at the next record still averages the same steps
            state["log_acc"] = ddp.mean_of_sums(self.log_acc, self.dist, self.device)
            rngs = (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None)
            state["rank_rng"] = ddp.all_gather_object(rngs, self.dist)  # each rank's dropout stream
            state["world_size"] = self.dist.world_size
        return state

    def _restore(self) -> None:
        model, ckpt_cfg, state, ckpt = load_checkpoint(self.run_dir, device=self.device, with_trainer_state=True)
        if state is None:
            raise CheckpointError(f"checkpoint {ckpt} has no trainer.pt: it can be evaluated but not resumed")
        if state.get("version", 1) > STATE_VERSION:
            raise CheckpointError(f"checkpoint {ckpt} was written by a newer rltok; upgrade to resume it")
        changed = [f"{f.name} {getattr(ckpt_cfg.model, f.name)!r} -> {getattr(self.cfg.model, f.name)!r}"
                   for f in dataclasses.fields(ckpt_cfg.model)
                   if getattr(ckpt_cfg.model, f.name) != getattr(self.cfg.model, f.name)]
        if changed:
            raise ConfigError(f"cannot resume {ckpt}: the model config differs from the checkpoint's "
                              f"({'; '.join(changed)}); resume with the original model settings")
        ddp.load_full_model_state(self.model, model.state_dict())
        ddp.load_full_optimizer_state(self.model, self.opt, state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.boundary_gen.set_state(state["boundary_gen"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
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
        self.warnings = state.get("warnings", 0)
        self.collapse_streak = state.get("collapse_streak", 0)
        self.log_acc = dict(state.get("log_acc", {}))
        self.log_n = state.get("log_n", 0)
        self.last_saved_step = self.step
        if state.get("data", self.data_id) != self.data_id:
            self._log(f"warning: the training data changed since {ckpt.name} "
                      f"({state['data']['train_bytes']:,} -> {self.data_id['train_bytes']:,} bytes); "
                      "the run continues, but not as an exact continuation")
        # Checkpoints after the one resumed failed verification. Set them aside, so pruning
        # and later resumes never mix them with the trajectory that continues from here.
        ddp.barrier(self.dist)  # every rank has read its checkpoint before rank 0 renames any
        for path in list_checkpoints(self.run_dir) if self.dist.is_main else []:
            if checkpoint_step(path) > checkpoint_step(ckpt):
                aside = path.with_name(f"corrupt_{path.name}_{int(time.time())}")
                os.rename(path, aside)
                self._log(f"warning: set aside unusable checkpoint {path.name} as {aside.name}")
        self._log(f"resumed from {ckpt} at step {self.step}")

    def save(self, final: bool = True) -> Path | None:
        """Checkpoint the current step. A periodic checkpoint that cannot be written (a full disk)
        is reported and training goes on; a final one raises CheckpointError."""
        finite = all(torch.isfinite(ddp.local_tensor(p)).all() for p in self.model.parameters())
        if self.dist.enabled:  # shards (FSDP) are checked where they live; all ranks decide together
            finite = ddp.all_reduce_(torch.tensor([0.0 if finite else 1.0], device=self.device), self.dist).item() == 0
        if not finite:
            raise TrainingDiverged(f"parameters are not finite at step {self.step}; refusing to overwrite "
                                   f"good checkpoints in {self.run_dir / 'checkpoints'}. Try a lower train.lr.")
        weights = ddp.full_model_state(self.model, self.dist) if ddp.is_fsdp(self.model) else None
        trainer_state = self.trainer_state()
        error, path = None, None
        if self.dist.is_main:  # rank 0 writes; the others wait for its outcome
            try:
                path = save_checkpoint(self.run_dir, self.step, self.model, self.cfg, trainer_state,
                                       keep_last=self.cfg.train.keep_checkpoints, state_dict=weights)
            except OSError as e:
                error = e
        if self.dist.enabled:
            error, path = ddp.broadcast_object((None if error is None else OSError(str(error)), path), self.dist)
        if error is not None:
            e = error
            if final:
                raise CheckpointError(f"cannot write the checkpoint of step {self.step} under "
                                      f"{self.run_dir / 'checkpoints'}: {e}") from None
            self.warnings += 1
            self._log(f"warning: checkpoint at step {self.step} failed ({e}); training continues "
                      "and the next checkpoint retries")
            return None
        self.last_saved_step = self.step
        return path

    # ---- loop --------------------------------------------------------------------------------
    def _log(self, msg: str) -> None:
        if not self.quiet:
            tqdm.write(msg, file=sys.stderr)

    def autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self) -> dict[str, torch.Tensor] | None:
        """One optimiser step over grad_accum micro-batches. Returns summed metrics, or None
        when the step was skipped because the loss or gradient was not finite (the parameters
        and optimiser state are then left untouched)."""
        tc = self.cfg.train
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, tc, self.budget_progress()) * group.get("lr_scale", 1.0)
        self.opt.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}
        for i in range(tc.grad_accum):
            x, y = self.sampler.next()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            # data parallel: gradients are all-reduced on the last micro-batch only
            with ddp.GradSync(self.wrapped, sync=i == tc.grad_accum - 1):
                with self.autocast():
                    out = self.forward(x, generator=self.noise, **self.group_kw)
                    cf = self.objective.counterfactual(self.model, x, y, out, self.step)
                loss, metrics = self.objective.loss(out, y, self.step, cf)
                (loss / tc.grad_accum).backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v / tc.grad_accum
        grad_norm = ddp.full_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip))
        sums["grad_norm"] = grad_norm.detach()
        bad = not (torch.isfinite(grad_norm) and torch.isfinite(sums["loss"]))
        if self.dist.enabled:
            # one small collective per step: skip together, and stop together when any rank got a signal
            flags = torch.tensor([float(bad), float(self.stop_signal)], device=self.device)
            ddp.all_reduce_(flags, self.dist, op=torch.distributed.ReduceOp.MAX)
            bad, self.stop_requested = bool(flags[0] > 0), self.stop_requested or bool(flags[1] > 0)
        if bad:
            self.opt.zero_grad(set_to_none=True)
            return None
        self.opt.step()
        self._after_step(sums)
        return sums

    def budget_progress(self) -> float | None:
        """Share of train.flops_budget spent (None without a budget: the schedule follows steps)."""
        budget = self.cfg.train.flops_budget
        return self.flops_spent / budget if budget > 0 else None

    def budget_spent(self) -> bool:
        return self.cfg.train.flops_budget > 0 and self.flops_spent >= self.cfg.train.flops_budget

    def _after_step(self, sums: dict[str, torch.Tensor]) -> None:
        """The step's global rates to the objective (rate controllers, FLOPs meter)."""
        keys = BoundaryObjective.RATE_KEYS
        zero = torch.zeros((), device=self.device)
        rates = torch.stack([torch.as_tensor(sums.get(k, zero), device=self.device).float() for k in keys])
        if self.dist.enabled:  # every rank must hold the same prices and stop at the same step
            rates = ddp.all_reduce_(rates, self.dist) / self.dist.world_size
        # one host sync per step: cheap next to the step itself, and what makes the count exact
        values = {k: (v if k in sums else None) for k, v in zip(keys, rates.tolist())}
        tc = self.cfg.train
        step_bytes = self.sampler.batch_size * self.dist.world_size * tc.grad_accum * self.sampler.seq_len
        self.objective.after_step(self.step, values, step_bytes, self.sampler.seq_len)

    @property
    def flops_spent(self) -> float:
        """Training FLOPs spent so far, each step at the chunks it drew."""
        return self.objective.flops_spent

    def validate(self) -> dict:
        """Held-out metrics; data-parallel ranks evaluate their shares and sum the counts."""
        sums = evaluate_sums(self.model, self.val_x, self.val_y, batch_size=self.cfg.train.batch_size,
                             device=self.device, autocast_dtype=self.amp_dtype)
        if self.dist.enabled:
            sums = {k: ddp.all_reduce_(v.to(self.device), self.dist).cpu() for k, v in sums.items()}
            if self.val_shared:
                sums = {k: v / self.dist.world_size for k, v in sums.items()}
        return summarize(sums)

    def _start_metrics(self, path: Path) -> list[dict]:
        """One consistent trajectory in metrics.jsonl: a resumed run drops the records written
        after its checkpoint (it is about to log those steps again); a fresh run starts empty."""
        history = read_metrics(path, self.step) if self.step else []
        _write_metrics(path, history)
        return history

    def fit(self, stop_at: int | None = None) -> TrainResult:
        """Train to train.max_steps (or, with `stop_at`, to that step, then checkpoint so that a
        resumed run continues exactly)."""
        tc = self.cfg.train
        end = tc.max_steps if stop_at is None else min(stop_at, tc.max_steps)
        metrics_file = None
        if self.dist.is_main:  # rank 0 owns the run folder's files
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2))
            metrics_path = self.run_dir / "metrics.jsonl"
            self.history = self._start_metrics(metrics_path)
            metrics_file = open(metrics_path, "a")
        ddp.barrier(self.dist)
        world = self.dist.world_size
        # distinct bytes of the global batch
        step_bytes = self.sampler.batch_size * world * tc.grad_accum * self.sampler.seq_len
        if self.peak_flops is None:
            self.peak_flops = ddp.measured_peak_flops(self.device, self.amp_dtype,
                                                      budget_s=0.5 if self.device.type == "cuda" else 0.25)
        parallel = f" x {world} ranks ({'FSDP' if tc.fsdp else 'DDP'}, {self.dist.backend})" if self.dist.enabled else ""
        self._log(f"rltok: {self.model.num_params() / 1e6:.2f}M params on {self.device}{parallel}"
                  f"{' (bf16 autocast)' if self.amp_dtype else ''}{' (compiled)' if tc.compile else ''}; "
                  f"{self.corpus.describe()}; peak {self.peak_flops / 1e12:.3g} TFLOP/s per device "
                  f"({'train.peak_flops' if tc.peak_flops else 'measured matmul'})")
        if self.step >= tc.max_steps:
            self._log(f"the run in {self.run_dir} is already at step {self.step} = train.max_steps; "
                      "raise train.max_steps to train further")
        interactive = sys.stderr.isatty() and not self.quiet
        bar = tqdm(total=tc.max_steps, initial=self.step, disable=not interactive, unit="step", dynamic_ncols=True)
        t_last = time.perf_counter()
        bytes_last = self.bytes_seen
        val = {}
        previous_handlers = self._install_signal_handlers()
        try:
            while self.step < end and not self.stop_requested and not self.budget_spent():
                metrics = self.train_step()
                if metrics is None:
                    self._skipped_step()
                    continue
                self.bad_steps = 0
                self.step += 1
                self.bytes_seen += step_bytes
                for k, v in metrics.items():
                    self.log_acc[k] = self.log_acc.get(k, 0.0) + v
                self.log_n += 1
                bar.update(1)
                last = self.step == tc.max_steps or self.budget_spent()
                evaluate_now = self.step % tc.eval_every == 0 or last
                if self.step % tc.log_every == 0 or evaluate_now:
                    now = time.perf_counter()
                    if self.dist.enabled:  # global means: one all-reduce of the sums per record
                        rec = {k: v / self.log_n for k, v in ddp.mean_of_sums(self.log_acc, self.dist, self.device).items()}
                    else:
                        rec = {k: float(v) / self.log_n for k, v in self.log_acc.items()}
                    rec["train_flops"] = self.flops_spent
                    rec.update(step=self.step, bytes=self.bytes_seen, lr=self.opt.param_groups[0]["lr"],
                               bytes_per_s=(self.bytes_seen - bytes_last) / max(1e-9, now - t_last))
                    # MFU: analytical FLOPs/byte x bytes/s against the peak of all devices
                    fpb = step_train_flops_per_byte(self.cfg, self.sampler.seq_len, rec.get("chunks_per_byte"),
                                                     rec.get("supertokens_per_chunk"), self.vocab_size)
                    rec["flops_per_s"] = fpb * rec["bytes_per_s"]
                    rec["mfu"] = rec["flops_per_s"] / (self.peak_flops * world)
                    t_last, bytes_last, self.log_acc, self.log_n = now, self.bytes_seen, {}, 0
                    if evaluate_now:
                        val = self.validate()
                        rec.update({f"val_{k}": v for k, v in val.items() if k != "chunk_length_hist"})
                    self._check_rate(rec)
                    rec.update(skipped_steps=self.skipped_steps, warnings=self.warnings)
                    self.history.append(rec)
                    if metrics_file is not None:
                        metrics_file.write(json.dumps(rec) + "\n")
                        metrics_file.flush()
                    self._report(rec, bar, interactive)
                if self.step % tc.checkpoint_every == 0 or last:
                    self.save(final=last)
                if self.step % tc.log_every == 0 or evaluate_now:  # keep validation/checkpoint time out of bytes/s
                    t_last = time.perf_counter()
            if self.step != self.last_saved_step and (self.stop_requested or self.step == end):
                path = self.save()
                if self.stop_requested:
                    self._log(f"interrupted: saved {path}; continue with --resume")
        finally:
            bar.close()
            if metrics_file is not None:
                metrics_file.close()
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        return TrainResult(step=self.step, val=val, run_dir=self.run_dir, history=self.history)

    def _skipped_step(self) -> None:
        self.bad_steps += 1
        self.skipped_steps += 1
        self._log(f"step {self.step + 1}: non-finite loss or gradient, update skipped "
                  f"({self.bad_steps} in a row, {self.skipped_steps} in all)")
        if self.bad_steps >= self.max_bad_steps:
            ckpts = list_checkpoints(self.run_dir)
            where = f"the last good checkpoint is {ckpts[-1]}" if ckpts else "no checkpoint was written yet"
            raise TrainingDiverged(
                f"{self.bad_steps} consecutive non-finite steps after step {self.step}; stopping ({where}). "
                "Try a lower train.lr or train.grad_clip, or check the data.")

    def _check_rate(self, rec: dict) -> None:
        """Warn (once per episode) when the boundary policy stays collapsed at rate ~0 or ~1."""
        p = rec.get("p_mean")  # mean boundary probability over free positions; RL chunker only
        kind = None
        if p is not None and self.step > 2 * self.cfg.train.warmup_steps:
            kind = rate_collapse(p, self.cfg.model.target_rate)
        if kind is None:
            self.collapse_streak = 0
            return
        self.collapse_streak += 1
        if self.collapse_streak == self.collapse_patience:
            self.warnings += 1
            self._log(f"warning: boundary rate collapsed {kind} at step {self.step} (mean p {p:.3f}, "
                      f"target {self.cfg.model.target_rate}): {COLLAPSE_ADVICE[kind]}")

    def _install_signal_handlers(self) -> dict:
        """SIGINT/SIGTERM finish the current step, checkpoint and stop (a second SIGINT aborts)."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return {}

        def request_stop(signum, frame):
            if self.stop_signal and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.stop_signal = True
            if not self.dist.enabled:  # data parallel: all ranks stop together (train_step)
                self.stop_requested = True
            self._log(f"received {signal.Signals(signum).name}: finishing the step and checkpointing")

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, request_stop)
        return previous

    def _report(self, rec: dict, bar, interactive: bool) -> None:
        parts = [f"loss {rec['loss']:.3f}", f"bpb {rec['bpb']:.3f}"]
        if "val_bpb" in rec:
            parts.append(f"val_bpb {rec['val_bpb']:.3f}")
        if "rate" in rec:
            parts.append(f"rate {rec['rate']:.3f}")
        parts.append(f"{rec['bytes_per_s'] / 1e3:.1f}k B/s")
        if "mfu" in rec:
            parts.append(f"MFU {100 * rec['mfu']:.1f}%")
        text = " | ".join(parts)
        if interactive:
            bar.set_postfix_str(text)
            if "val_bpb" in rec:
                self._log(f"step {rec['step']}: {text}")
        else:
            self._log(f"step {rec['step']}/{self.cfg.train.max_steps}: {text}")


def train(cfg: Config, resume: bool = False, quiet: bool = False) -> TrainResult:
    return Trainer(cfg, resume=resume, quiet=quiet).fit()
