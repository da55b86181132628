"""The training loop: build the model, optimiser and objective; step (AdamW, the learning-rate
schedule, clipping, accumulation); validate; checkpoint. Around it, each in a module of its own:
the run folder's rules (run_folder), signals, metrics, tracking and the saved state (state).
"""

from __future__ import annotations

import dataclasses
import errno
import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from rltok.training import distributed as ddp
from rltok.training import run_folder, tracking
from rltok.training.run_lock import RunLock
from rltok.training.schedule import anchored_progress, cooldown_left, lr_at  # noqa: F401 - lr_at: re-exported
from rltok.training.state import TrainState, check_resumable
from rltok.training.loading import load_checkpoint
from rltok.training.checkpoint import (SHARDED, CheckpointError, checkpoint_step, clean_stale, list_checkpoints,
                                      run_results, save_checkpoint, stage_checkpoint)
from rltok.config import Config, ConfigError
from rltok.data.sources import Corpus
from rltok.training.device import resolve_device, resolve_dtype
from rltok.eval.evaluate import evaluate_sums, summarize
from rltok.training.metrics import TIMING_KEYS, IntervalMeter, Reporter  # noqa: F401  (TIMING_KEYS: part of this module's API)
from rltok.model.noise import RowShard
from rltok.objective.loss import BoundaryObjective
from rltok.objective.score_function import ScoreFunction
from rltok.training.signals import StopRequest
from rltok.training.peak import PeakFlops, device_peak
from rltok.training.build import CostedModel, build


def _write_failure(e: BaseException, folder: Path) -> str:
    """A failed checkpoint write in one line: torch reports a full disk as a short write ("unexpected
    pos N vs M"), so a write that stopped short says so, with the space left where it went."""
    line = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    if getattr(e, "errno", None) == errno.ENOSPC or "unexpected pos" in line or "write failed" in line:
        try:
            free = f"{shutil.disk_usage(folder).free:,} bytes free there"
        except OSError:
            free = "free space unknown"
        return f"a file could not be written whole: is the disk full? ({free}; {line})"
    return line


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite steps; the last good checkpoint is left as it was."""


def make_optimizer(model: torch.nn.Module, cfg, device: torch.device, policy_lr_mult: float = 1.0) -> torch.optim.Optimizer:
    """AdamW; matrices decay, vectors do not. With policy_lr_mult != 1 the boundary rules' own
    parameters (every stage's rule: each Chunker's policy_parameters()) form their own groups whose
    lr is that multiple of the schedule's."""
    from rltok.model.chunkers.base import Chunker

    policy_ids = set()
    if policy_lr_mult != 1.0:
        rules = [m for m in model.modules() if isinstance(m, Chunker)]
        chunker = getattr(model, "chunker", None)
        if chunker is not None and not isinstance(chunker, Chunker):  # a plugin's plain module
            rules.append(chunker)
        for rule in rules:
            own = getattr(rule, "policy_parameters", rule.parameters)
            policy_ids |= {id(p) for p in own()}
    groups = []
    for policy in (False, True):
        params = [p for p in model.parameters() if (id(p) in policy_ids) == policy]
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            if chosen or not policy:  # keep the two base groups even when empty (state layout)
                groups.append({"params": chosen, "weight_decay": cfg.weight_decay if decay else 0.0,
                               "lr_scale": policy_lr_mult if policy else 1.0})
    # train.optimizer_kernel="auto": foreach on CPU (the per-tensor loop's numbers, as fast), fused on CUDA
    kernel = cfg.optimizer_kernel
    if kernel == "auto":
        kernel = "fused" if device.type == "cuda" else "foreach"
    kw = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[kernel]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **kw)


def _state_counter(name: str) -> property:
    """A Trainer attribute that reads and writes the counter of that name in its TrainState."""
    return property(lambda self: getattr(self.state, name), lambda self, value: setattr(self.state, name, value))


@dataclass
class TrainResult:
    """What `Trainer.fit` (and `train`) return."""

    step: int  # the step the run stopped at
    val: dict  # the last evaluation on val (bpb, rate, bytes per chunk, alignment ...); {} if none ran
    run_dir: Path  # the run folder: config.json, metrics.jsonl, checkpoints/
    history: list  # every logged record of the run, as metrics.jsonl holds them


class Trainer:
    """Trains the model `cfg` describes in the run folder `cfg.train.out_dir` (data, model and
    objective built from it; `fit` runs it). `resume=True` continues from the folder's newest
    valid checkpoint where it holds one and otherwise starts there from step 0, so that a
    resumable sweep can call it on every point; unlike `rltok train --resume`, the folder need not
    exist yet. A run folder is held by one trainer at a time (its lock)."""

    max_bad_steps = 5  # consecutive non-finite steps before the run is declared diverged

    def __init__(self, cfg: Config, corpus: Corpus | None = None, resume: bool = False, quiet: bool = False,
                 costed: CostedModel | None = None):
        """`costed`: the model and cost rltok.training.build.costed_model made of `cfg`, from which a
        harness planned the run (rltok.analysis.compare.plan_budget); `cfg` then comes planned, its
        warm-up already resolved against the steps planned (train.max_steps is a cap there). One process."""
        if not isinstance(cfg, Config):  # before anything is made in a run folder
            raise TypeError(f"Trainer and train take a Config (rltok.load_config(...)), got {type(cfg).__name__}")
        if corpus is not None and not isinstance(corpus, Corpus):
            raise TypeError(f"corpus must be a Corpus (rltok.data.corpus.load_corpus(...)), got {type(corpus).__name__}")
        self.cfg = cfg.validate()
        if costed is None:
            cfg.train.warmup_steps = cfg.train.warmup_for(cfg.train.max_steps)
        self.run_dir = Path(cfg.train.out_dir)
        # one live process per run folder (rank 0 holds the lock for every rank), until fit() ends
        self.lock = RunLock(self.run_dir)
        self.env_rank = ddp.env_ranks()[0]  # checked together: one process is rank 0 and always locks
        if self.env_rank == 0:
            self.lock.acquire()
        try:
            self._init(cfg, corpus, resume, quiet, costed)
        except BaseException:
            self.lock.abandon()
            raise

    def _init(self, cfg: Config, corpus: Corpus | None, resume: bool, quiet: bool,
              costed: CostedModel | None) -> None:
        tc = cfg.train
        run_folder.refuse_other_run(self.run_dir, resume)
        tracking.require(cfg)
        if tc.threads > 0:
            torch.set_num_threads(tc.threads)
        self.device = resolve_device(tc.device)
        # under torchrun: join the process group; one process (no WORLD_SIZE) is unchanged
        self.dist = ddp.init_from_env(self.device.type)
        if self.dist.enabled and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", self.dist.local_rank)
        self.quiet = quiet or not self.dist.is_main  # rank 0 alone reports
        self.report = Reporter(cfg, self.quiet)
        self.amp_dtype = resolve_dtype(tc.dtype, self.device)
        if costed is not None and self.dist.enabled:
            raise ValueError("a model made before the trainer is one process's: "
                             "under torchrun every rank builds its own")
        # the data pipeline, the model, its cost and the objective: everything the config describes
        built = build(cfg, corpus, self.device, self.dist, costed)
        self.corpus, self.model, self.cost, self.objective = built.corpus, built.model, built.cost, built.objective
        self.sampler, self.group_size = built.sampler, built.group_size
        self.val_x, self.val_y, self.val_shared = built.val
        self._refuse_a_baseline_of_its_own_reward()
        if costed is None and tc.flops_budget > 0 and tc.warmup_frac:
            # under a FLOPs budget the warm-up is a share of the steps the budget plans (at the
            # target rate), not of train.max_steps, which is only a cap there
            tc.warmup_steps = tc.warmup_for(self._budget_steps())
        # identifies the training bytes, so a resume can tell when the data changed under it
        self.data_id = self.corpus.fingerprint()
        if self.dist.enabled:
            torch.manual_seed(tc.seed + 1 + self.dist.rank)  # dropout masks differ between ranks
        # the module forward/backward go through: the model, its DDP wrapper, or (FSDP) the
        # model itself, sharded in place
        self.wrapped = ddp.wrap_model(self.model, self.dist, self.device, fsdp=tc.fsdp,
                                      # the tokenizer phase's steps leave the chunk level and decoder idle;
                                      # the policy's head gets no gradient in the warm start or once settled
                                      find_unused=tc.ddp_find_unused or cfg.objective.tokenizer_phase > 0
                                      or cfg.objective.policy_start_step > 0 or cfg.objective.policy_until < 1)
        self.forward = torch.compile(self.wrapped) if tc.compile else self.wrapped
        self.opt = make_optimizer(self.model, tc, self.device, cfg.objective.policy_lr_mult)

        # boundary noise
        self.group_kw = {"group_size": self.group_size} if self.group_size > 1 else {}
        self.boundary_gen = torch.Generator(device=self.device).manual_seed(tc.seed + 1)
        # every rank draws the noise of the global batch and keeps its rows (model/noise.py)
        self.noise = RowShard(self.boundary_gen, self.dist.rank, self.dist.world_size) if self.dist.enabled \
            else self.boundary_gen
        self.peak_flops = tc.peak_flops or None  # found when fit() starts if not given (rltok.training.peak)
        self.meter = IntervalMeter(self.dist, self.device, self.sampler.seq_len, self.cost)
        self.stop = StopRequest(self._log, across_ranks=self.dist.enabled)
        self.state = TrainState(self.model, self.opt, self.sampler, self.boundary_gen, self.objective, self.meter,
                                self.report, self.device, self.dist, self.data_id)
        self.last_saved_step: int | None = None
        self.branch_kept = bool(list_checkpoints(run_folder.branch_root(self.run_dir)))
        self.history: list[dict] = []
        if resume:
            self._resume(planned=costed is not None)

    # ---- checkpoints ---------------------------------------------------------------------------
    # the counters live in the train state, which is saved and restored whole
    step = _state_counter("step")
    bytes_seen = _state_counter("bytes_seen")
    bad_steps = _state_counter("bad_steps")
    skipped_steps = _state_counter("skipped_steps")

    @property
    def peak_flops(self) -> float | None:
        """The per-device peak FLOP/s MFU is measured against; setting it gives the run that peak."""
        return self.peak.flops if self.peak is not None else None

    @peak_flops.setter
    def peak_flops(self, flops: float | None) -> None:
        self.peak = PeakFlops(flops, "config", detail="train.peak_flops") if flops else None

    def _resume(self, planned: bool = False) -> None:
        if self.dist.is_main:
            clean_stale(self.run_dir)  # what killed checkpoint writers left, before the newest is chosen
        ddp.barrier(self.dist)
        if not list_checkpoints(self.run_dir):
            self._log(f"no checkpoint in {self.run_dir}: starting from scratch")
            return
        model, ckpt_cfg, state, ckpt = load_checkpoint(self.run_dir, device=self.device, with_trainer_state=True)
        check_resumable(state, ckpt, ckpt_cfg.model, self.cfg.model)
        if self.cfg.train.warmup_frac and not planned:  # the trainer resolved it against the length first
            self.cfg.train.warmup_steps = ckpt_cfg.train.warmup_steps  # planned: a new length moves the decay,
            # never the warm-up (a harness that planned the run resolved its warm-up itself, and checks it)
        ddp.load_full_model_state(self.model, model.state_dict())
        self.state.load_state_dict(state, ckpt)
        self._reschedule(ckpt_cfg.train.max_steps)
        self.last_saved_step = self.step
        ddp.barrier(self.dist)  # every rank has read its checkpoint before rank 0 renames any
        if self.dist.is_main:
            run_folder.set_aside_after(self.run_dir, ckpt, self._log)
        self._log(f"resumed from {ckpt} at step {self.step}")

    def save(self, final: bool = True, branch: bool = False) -> Path | None:
        """Checkpoint the current step. A periodic checkpoint that cannot be written (a full disk)
        is reported and training goes on; a final one raises CheckpointError. `branch`: the state
        before the cool-down, kept apart from the rotating checkpoints (run_folder.branch_root)."""
        finite = all(torch.isfinite(ddp.local_tensor(p)).all() for p in self.model.parameters())
        if self.dist.enabled:  # shards (FSDP) are checked where they live; all ranks decide together
            finite = ddp.all_reduce_(torch.tensor([0.0 if finite else 1.0], device=self.device), self.dist).item() == 0
        if not finite:
            raise TrainingDiverged(f"parameters are not finite at step {self.step}; refusing to overwrite "
                                   f"good checkpoints in {self.run_dir / 'checkpoints'}. Try a lower train.lr.")
        weights = ddp.full_model_state(self.model, self.dist) if ddp.is_fsdp(self.model) else None
        state = self.state.state_dict()  # everything besides the weights the next step depends on
        root, keep, results = self.run_dir, self.cfg.train.keep_checkpoints, None
        if branch:  # marked, so that a branch can tell it from a checkpoint taken inside the cool-down
            state["branch_point"] = True
            root, keep, results = run_folder.branch_root(self.run_dir), 1, run_results(self.run_dir, self.step)
        error, path, staged = None, None, None
        if ddp.is_fsdp(self.model):  # every rank writes its shards of the model and optimiser state
            staged, error = self._write_shards(root)
        if self.dist.is_main and error is None:  # rank 0 writes; the others wait for its outcome
            try:
                path = save_checkpoint(root, self.step, self.model, self.cfg, state, keep_last=keep,
                                       state_dict=weights, results=results, staged=staged)
            except Exception as e:  # noqa: BLE001 - a full disk surfaces as OSError, a safetensors or a torch error
                error = OSError(_write_failure(e, root))
        if self.dist.enabled:
            error, path = ddp.broadcast_object((None if error is None else OSError(str(error)), path), self.dist)
        if error is not None:
            if final:
                raise CheckpointError(f"cannot write the checkpoint of step {self.step} under "
                                      f"{self.run_dir / 'checkpoints'}: {error}; {self._resumes_from()}") from None
            self.report.warn(f"warning: checkpoint at step {self.step} failed ({error}); training continues, "
                             f"the last good checkpoint is kept and the next checkpoint retries")
            return None
        if not branch:
            self.last_saved_step = self.step
        return path

    def _branch_due(self) -> bool:
        """The next step begins the "wsd" cool-down of a FLOPs budget, and the state before it is not kept."""
        tc = self.cfg.train
        return (not self.branch_kept and tc.flops_budget > 0
                and cooldown_left(self.step, tc, self.schedule_progress()) is not None)

    def _keep_branch(self) -> None:
        """Keep the state before the cool-down: a run to a larger budget can go on from it with
        the same schedule, as if it had run from scratch (rltok.analysis.compare.run_one)."""
        with self.stop.saving_checkpoint():
            path = self.save(final=False, branch=True)
        if path is not None:
            self.branch_kept = True
            self._log(f"step {self.step}: the cool-down begins; the state before it is kept in {path} "
                      "(a larger budget can branch from it)")

    def _resumes_from(self) -> str:
        """Where `--resume` would continue this run, in words."""
        ckpts = list_checkpoints(self.run_dir)
        if not ckpts:
            return "no checkpoint of this run was written: a --resume starts from scratch"
        return f"the run can resume from step {checkpoint_step(ckpts[-1])} ({ckpts[-1].name}) with --resume"

    def _write_shards(self, root: Path) -> tuple[Path | None, OSError | None]:
        """FSDP: rank 0 stages the checkpoint folder, every rank writes its shards into its dcp/
        (torch.distributed.checkpoint). Returns (the staged folder, the error every rank saw)."""
        staged, error = None, None
        if self.dist.is_main:
            try:
                staged = stage_checkpoint(root, self.step)
            except OSError as e:
                error = OSError(str(e))
        staged, error = ddp.broadcast_object((staged, error), self.dist)
        if error is None:
            try:
                ddp.save_sharded_state(self.model, self.opt, staged / SHARDED)
            except Exception as e:  # a full disk on any rank fails the save on every rank
                error = OSError(f"{type(e).__name__}: {' '.join(str(e).split())[:500]}")
        if error is not None and staged is not None and self.dist.is_main:
            shutil.rmtree(staged, ignore_errors=True)
        return staged, error

    # ---- one step ------------------------------------------------------------------------------
    def _log(self, msg: str) -> None:
        self.report.log(msg)

    @property
    def stop_requested(self) -> bool:
        """True once a signal asked training to stop (under DDP: on every rank in the same step)."""
        return self.stop.requested

    def autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self) -> dict[str, torch.Tensor] | None:
        """One optimiser step over grad_accum micro-batches: the summed metrics, or None when the loss or
        gradient was not finite (the step is skipped: parameters and optimiser state left untouched)."""
        tc = self.cfg.train
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, tc, self.schedule_progress()) * group.get("lr_scale", 1.0)
        self.opt.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}
        # the tokenizer phase: encoder, early-exit head and boundary rule only (objective.tokenizer_phase)
        phase = self.objective.tokenizer_phase(self.step_bytes, self.sampler.seq_len)
        if self.objective.begin_step(self.model, self.step, self.step_bytes, self.sampler.seq_len,
                                     self._settling_windows):
            self._log(f"step {self.step}: the boundary policy settled (objective.policy_until="
                      f"{self.cfg.objective.policy_until:g} of the training compute): its decisions are greedy from now on")
        kw = dict(self.group_kw, encoder_only=True) if phase else self.group_kw
        for i in range(tc.grad_accum):
            x, y = self.sampler.next()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            # data parallel: gradients are all-reduced on the last micro-batch only
            with ddp.grad_sync(self.wrapped, sync=i == tc.grad_accum - 1):
                with self.autocast():
                    out = self.forward(x, generator=self.noise, **kw)
                    cf = self.objective.counterfactual(self.model, x, y, out, self.step)
                loss, metrics = self.objective.loss(out, y, self.step, cf)
                (loss / tc.grad_accum).backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v / tc.grad_accum
        grad_norm = ddp.full_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip))
        sums["grad_norm"] = grad_norm.detach()
        if phase:
            sums["tokenizer_phase"] = torch.ones((), device=self.device)
        if self.objective.settled:
            sums["policy_settled"] = torch.ones((), device=self.device)
        bad = not (torch.isfinite(grad_norm) and torch.isfinite(sums["loss"]))
        if self.dist.enabled:
            # one small collective per step: skip together, and stop together when any rank got a signal
            flags = torch.tensor([float(bad), float(self.stop.received)], device=self.device)
            ddp.all_reduce_(flags, self.dist, op=torch.distributed.ReduceOp.MAX)
            bad, self.stop.requested = bool(flags[0] > 0), self.stop.requested or bool(flags[1] > 0)
        if bad:
            self.opt.zero_grad(set_to_none=True)
            return None
        self.opt.step()
        self._after_step(sums)
        return sums

    def _settling_windows(self, count: int = 16) -> torch.Tensor:
        """The first `count` windows of the training bytes, the same on every rank: where a settling
        rule's cut is set (objective.settle_threshold=rate)."""
        length = self.sampler.seq_len
        count = max(1, min(count, len(self.corpus.train) // length))
        chunk = self.corpus.train[: count * length]
        return chunk.long().view(count, length).to(self.device)

    def budget_progress(self) -> float | None:
        """Share of train.flops_budget spent (None without a budget: the schedule follows steps)."""
        budget = self.cfg.train.flops_budget
        return self.flops_spent / budget if budget > 0 else None

    def schedule_progress(self) -> float | None:
        """Where the learning rate's cosine decay stands: by FLOPs under a budget, else by step
        (from the anchor a resume that changed max_steps set, or lr_at's own when None)."""
        budget = self.budget_progress()
        if budget is not None or self.step < self.cfg.train.warmup_steps:
            return budget
        return anchored_progress(self.step, self.cfg.train.max_steps, self.state.lr_anchor)

    def _reschedule(self, old_max_steps: int) -> None:
        """A resume changed train.max_steps: set where the decay goes on from, and say so."""
        tc = self.cfg.train
        if old_max_steps == tc.max_steps or self.step < tc.warmup_steps or self.budget_progress() is not None:
            return
        if tc.constant_phase:  # constant until the last cooldown_frac of the new length
            self._log(f"train.max_steps changed from {old_max_steps} to {tc.max_steps} at step {self.step}: the "
                      f"learning rate's cool-down (train.lr_schedule=wsd) now spans the last "
                      f"{tc.cooldown_frac:.0%} of {tc.max_steps} steps")
            return
        old = lr_at(self.step, dataclasses.replace(tc, max_steps=old_max_steps),
                    anchored_progress(self.step, old_max_steps, self.state.lr_anchor))
        if tc.schedule_on_resume == "restart":
            self.state.lr_anchor = (self.step, 0.0)
            what = f"restarts its cosine decay at {tc.lr:.3g}"
        else:
            progress = anchored_progress(self.step, old_max_steps, self.state.lr_anchor)
            if progress is None:
                progress = (self.step - tc.warmup_steps) / max(1, old_max_steps - tc.warmup_steps)
            self.state.lr_anchor = (self.step, min(1.0, progress))
            what = f"goes on from {old:.3g} (no jump)"
        self._log(f"train.max_steps changed from {old_max_steps} to {tc.max_steps} at step {self.step}: the "
                  f"learning rate {what} and decays to {tc.lr * tc.min_lr_ratio:.3g} by step {tc.max_steps} "
                  f"(train.schedule_on_resume={tc.schedule_on_resume}; the other choice: "
                  f"{'keep' if tc.schedule_on_resume == 'restart' else 'restart'})")

    def _refuse_a_baseline_of_its_own_reward(self) -> None:
        """The batch baseline over one row is that row's reward: a learned rule would get no gradient."""
        policy = self.objective.terms.policy  # None: no boundary rule learns by an estimator
        estimator = None if policy is None else policy.estimator
        batch = isinstance(estimator, ScoreFunction) and estimator.settings.returns.batch_baseline
        if batch and self.cfg.train.batch_size * self.dist.world_size < 2:
            raise ConfigError(f"objective.estimator.baseline={self.cfg.objective.estimator.baseline} with one row "
                              "per micro-batch: the batch mean is that row's own reward, so the boundary policy "
                              "would get no gradient; give train.batch_size >= 2 (or more ranks), or "
                              "objective.estimator.baseline=none or value")

    def _budget_steps(self) -> int:
        """The steps train.flops_budget buys at the model's target rate (at most train.max_steps)."""
        tc = self.cfg.train
        per_byte = self.cost.at(self.sampler.seq_len).step_train_per_byte(self.cfg.model.target_rate)
        # distinct bytes: with group_size K, batch_size counts segmentations of batch_size / K sequences
        bytes_per_step = tc.batch_size // self.group_size * tc.grad_accum * self.sampler.seq_len * self.dist.world_size
        return max(1, min(tc.max_steps, round(tc.flops_budget / (per_byte * bytes_per_step))))

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
        self.objective.after_step(self.step, values, self.step_bytes, self.sampler.seq_len)

    @property
    def step_bytes(self) -> int:
        """Distinct bytes of the global batch of one step."""
        return self.sampler.batch_size * self.dist.world_size * self.cfg.train.grad_accum * self.sampler.seq_len

    @property
    def flops_spent(self) -> float:
        """Training FLOPs spent so far, each step at the chunks it drew."""
        return self.objective.flops_spent

    def validate(self) -> dict:
        """Held-out metrics; data-parallel ranks evaluate their shares and sum the counts."""
        # context=None: each model's training forward and the bytes it scores (evaluate's default,
        # context=1, scores the same bytes for every family; for byte models the two agree)
        sums = evaluate_sums(self.model, self.val_x, self.val_y, batch_size=self.cfg.train.batch_size,
                             device=self.device, autocast_dtype=self.amp_dtype, context=None)
        if self.dist.enabled:
            sums = {k: ddp.all_reduce_(v.to(self.device), self.dist).cpu() for k, v in sums.items()}
            if self.val_shared:
                sums = {k: v / self.dist.world_size for k, v in sums.items()}
        return summarize(sums)

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

    # ---- the loop ------------------------------------------------------------------------------
    def fit(self, stop_at: int | None = None) -> TrainResult:
        """Train to train.max_steps (or, with `stop_at`, to that step, then checkpoint so that a
        resumed run continues exactly)."""
        tc = self.cfg.train
        end = tc.max_steps if stop_at is None else min(stop_at, tc.max_steps)
        trackers = None
        if self.env_rank == 0 and not self.lock.held:  # a second fit() of this trainer
            self.lock.acquire()
        try:
            if self.dist.is_main:  # rank 0 owns the run folder's files
                run_folder.start(self.run_dir, self.cfg)
                trackers = tracking.Trackers(self.run_dir, self.cfg, self.step)
                self.history = trackers.history
        except OSError as e:
            self.lock.release()
            raise CheckpointError(f"cannot write to the run folder {self.run_dir}: {e}") from None
        except BaseException:  # a sink that cannot start (W&B without a login): the folder is free again
            self.lock.release()
            raise
        ddp.barrier(self.dist)
        if self.peak is None:
            self.peak = device_peak(self.device, self.amp_dtype, self.model, tc.batch_size * self.sampler.seq_len)
        self._log_start()
        self.report.open_bar(self.step)
        self.meter.restart_clock(self.bytes_seen, self.flops_spent)
        val = {}
        try:
            with self.stop.installed():
                while self.step < end and not self.stop.requested and not self.budget_spent():
                    if self._branch_due():
                        self._keep_branch()
                    metrics = self.train_step()
                    if metrics is None:
                        self._skipped_step()
                        continue
                    self.bad_steps = 0
                    self.step += 1
                    self.bytes_seen += self.step_bytes
                    self.meter.add(metrics)
                    self.report.advance()
                    last = self.step == tc.max_steps or self.budget_spent()
                    evaluate_now = self.step % tc.eval_every == 0 or last
                    log_now = self.step % tc.log_every == 0 or evaluate_now
                    if log_now:
                        rec = self.meter.record(self.step, self.bytes_seen, self.opt.param_groups[0]["lr"],
                                                self.flops_spent, self.peak)
                        if evaluate_now:
                            val = self.validate()
                            rec.update({f"val_{k}": v for k, v in val.items() if k != "chunk_length_hist"})
                        self.report.check_rate(rec, self.step)
                        rec.update(skipped_steps=self.skipped_steps, warnings=self.report.warnings)
                        self.history.append(rec)
                        if trackers is not None:
                            trackers.log(rec)
                        self.report.show(rec)
                    if self.step % tc.checkpoint_every == 0 or last:
                        with self.stop.saving_checkpoint():
                            self.save(final=last)
                    if log_now:
                        self.meter.restart_clock()
                if self.step != self.last_saved_step and (self.stop.requested or self.step == end):
                    with self.stop.saving_checkpoint():
                        self.save()
                if self.stop.requested:  # also when the step it stopped at had just been checkpointed
                    ckpts = list_checkpoints(self.run_dir)
                    self._log(f"interrupted: saved {ckpts[-1]}; continue with --resume" if ckpts
                              else f"interrupted: {self._resumes_from()}")
        except OSError as e:  # metrics.jsonl or another run-folder file could not be written
            raise CheckpointError(f"I/O error while training into {self.run_dir}: {e}") from None
        finally:
            self.report.close_bar()
            if trackers is not None:
                trackers.close()
            self.lock.release()
        return TrainResult(step=self.step, val=val, run_dir=self.run_dir, history=self.history)

    def _log_start(self) -> None:
        tc = self.cfg.train
        parallel = (f" x {self.dist.world_size} ranks ({'FSDP' if tc.fsdp else 'DDP'}, {self.dist.backend})"
                    if self.dist.enabled else "")
        self._log(f"rltok: {self.model.num_params() / 1e6:.2f}M params on {self.device}{parallel}"
                  f"{' (bf16 autocast)' if self.amp_dtype else ''}{' (compiled)' if tc.compile else ''}; "
                  f"{self.corpus.describe()}; peak {self.peak.describe()}")
        if self.step >= tc.max_steps:
            self._log(f"the run in {self.run_dir} is already at step {self.step} = train.max_steps; "
                      "raise train.max_steps to train further")


def train(cfg: Config, resume: bool = False, quiet: bool = False) -> TrainResult:
    """Train `cfg` to train.max_steps (Trainer(cfg, resume=resume, quiet=quiet).fit()); `quiet`:
    no progress output."""
    return Trainer(cfg, resume=resume, quiet=quiet).fit()
