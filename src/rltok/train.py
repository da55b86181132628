"""The training loop: AdamW, warm-up + cosine, clipping, accumulation, validation, checkpoints,
JSONL metrics and a live progress display."""

from __future__ import annotations

import json
import math
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

from .checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from .config import Config, ConfigError
from .data import Corpus, WindowSampler, eval_windows, load_corpus
from .evaluate import evaluate
from .model import HourglassLM
from .objective import compute_loss


class TrainingDiverged(RuntimeError):
    pass


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} requested but CUDA is not available")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if name == "bf16" or (name == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def lr_at(step: int, cfg) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=device.type == "cuda")


@dataclass
class TrainResult:
    step: int
    val: dict
    run_dir: Path
    history: list


class Trainer:
    def __init__(self, cfg: Config, corpus: Corpus | None = None, resume: bool = False, quiet: bool = False):
        self.cfg = cfg.validate()
        tc = cfg.train
        if tc.threads > 0:
            torch.set_num_threads(tc.threads)
        self.device = resolve_device(tc.device)
        self.amp_dtype = resolve_dtype(tc.dtype, self.device)
        self.run_dir = Path(tc.out_dir)
        self.quiet = quiet
        self.corpus = corpus or load_corpus(cfg.data.train, cfg.data.val, cfg.data.val_fraction,
                                            cfg.data.max_bytes, cfg.data.hf_text_field)
        torch.manual_seed(tc.seed)
        random.seed(tc.seed)
        np.random.seed(tc.seed)
        self.model = HourglassLM(cfg.model).to(self.device)
        self.forward = torch.compile(self.model) if tc.compile else self.model
        self.opt = make_optimizer(self.model, tc, self.device)
        self.sampler = WindowSampler(self.corpus.train, tc.batch_size, tc.seq_len, seed=tc.seed)
        self.boundary_gen = torch.Generator(device=self.device).manual_seed(tc.seed + 1)
        self.val_x, self.val_y = eval_windows(self.corpus.val, tc.seq_len, tc.eval_batches * tc.batch_size)
        self.step = 0
        self.bytes_seen = 0
        self.bad_steps = 0
        self.stop_requested = False
        self.history: list[dict] = []
        if resume and list_checkpoints(self.run_dir):
            self._restore()

    # ---- state -------------------------------------------------------------------------------
    def trainer_state(self) -> dict:
        state = {
            "step": self.step,
            "bytes_seen": self.bytes_seen,
            "optimizer": self.opt.state_dict(),
            "sampler": self.sampler.state_dict(),
            "boundary_gen": self.boundary_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore(self) -> None:
        model, _, state, ckpt = load_checkpoint(self.run_dir, device=self.device, with_trainer_state=True)
        self.model.load_state_dict(model.state_dict())
        if state is None:
            raise RuntimeError(f"checkpoint {ckpt} has no trainer state; cannot resume")
        self.opt.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.boundary_gen.set_state(state["boundary_gen"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.step = state["step"]
        self.bytes_seen = state["bytes_seen"]
        self._log(f"resumed from {ckpt} at step {self.step}")

    def save(self) -> Path:
        return save_checkpoint(self.run_dir, self.step, self.model, self.cfg, self.trainer_state())

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
        when the step was skipped because the loss or gradient was not finite."""
        tc = self.cfg.train
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, tc)
        self.opt.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}
        for _ in range(tc.grad_accum):
            x, y = self.sampler.next()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.autocast():
                out = self.forward(x, generator=self.boundary_gen)
            loss, metrics = compute_loss(out, y, self.cfg.objective, self.cfg.model.target_rate)
            (loss / tc.grad_accum).backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v / tc.grad_accum
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
        sums["grad_norm"] = grad_norm.detach()
        if not (torch.isfinite(grad_norm) and torch.isfinite(sums["loss"])):
            self.opt.zero_grad(set_to_none=True)
            return None
        self.opt.step()
        return sums

    def validate(self) -> dict:
        return evaluate(self.model, self.val_x, self.val_y, batch_size=self.cfg.train.batch_size,
                        device=self.device, autocast_dtype=self.amp_dtype)

    def fit(self) -> TrainResult:
        tc = self.cfg.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2))
        metrics_file = open(self.run_dir / "metrics.jsonl", "a")
        step_bytes = tc.batch_size * tc.grad_accum * self.sampler.seq_len
        self._log(f"rltok: {self.model.num_params() / 1e6:.2f}M params on {self.device}"
                  f"{' (bf16 autocast)' if self.amp_dtype else ''}; {self.corpus.describe()}")
        interactive = sys.stderr.isatty() and not self.quiet
        bar = tqdm(total=tc.max_steps, initial=self.step, disable=not interactive, unit="step", dynamic_ncols=True)
        acc: dict[str, torch.Tensor] = {}
        n_acc = 0
        t_last = time.perf_counter()
        bytes_last = self.bytes_seen
        val = {}
        previous_handlers = self._install_signal_handlers()
        try:
            while self.step < tc.max_steps and not self.stop_requested:
                metrics = self.train_step()
                if metrics is None:
                    self.bad_steps += 1
                    self._log(f"step {self.step}: non-finite loss or gradient, update skipped "
                              f"({self.bad_steps} in a row)")
                    if self.bad_steps >= 5:
                        raise TrainingDiverged(
                            f"{self.bad_steps} consecutive non-finite steps at step {self.step}; stopping. "
                            f"The last good checkpoint is in {self.run_dir / 'checkpoints'}. "
                            "Try a lower train.lr or train.grad_clip.")
                    continue
                self.bad_steps = 0
                self.step += 1
                self.bytes_seen += step_bytes
                for k, v in metrics.items():
                    acc[k] = acc.get(k, 0.0) + v
                n_acc += 1
                bar.update(1)
                last = self.step == tc.max_steps
                if self.step % tc.log_every == 0 or last:
                    now = time.perf_counter()
                    rec = {k: float(v) / n_acc for k, v in acc.items()}
                    rec.update(step=self.step, bytes=self.bytes_seen, lr=lr_at(self.step - 1, tc),
                               bytes_per_s=(self.bytes_seen - bytes_last) / max(1e-9, now - t_last))
                    t_last, bytes_last, acc, n_acc = now, self.bytes_seen, {}, 0
                    if self.step % tc.eval_every == 0 or last:
                        val = self.validate()
                        rec.update({f"val_{k}": v for k, v in val.items() if k != "chunk_length_hist"})
                    self.history.append(rec)
                    metrics_file.write(json.dumps(rec) + "\n")
                    metrics_file.flush()
                    self._report(rec, bar, interactive)
                if self.step % tc.checkpoint_every == 0 or last:
                    self.save()
            if self.stop_requested and self.step < tc.max_steps:
                path = self.save()
                self._log(f"interrupted: saved {path}; resume with --resume")
        finally:
            bar.close()
            metrics_file.close()
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        return TrainResult(step=self.step, val=val, run_dir=self.run_dir, history=self.history)

    def _install_signal_handlers(self) -> dict:
        """SIGINT/SIGTERM finish the current step, checkpoint and stop (a second SIGINT aborts)."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return {}

        def request_stop(signum, frame):
            if self.stop_requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
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
        text = " | ".join(parts)
        if interactive:
            bar.set_postfix_str(text)
            if "val_bpb" in rec:
                self._log(f"step {rec['step']}: {text}")
        else:
            self._log(f"step {rec['step']}/{self.cfg.train.max_steps}: {text}")
        rate = rec.get("rate")
        if rate is not None and rec["step"] > 2 * self.cfg.train.warmup_steps and (rate < 0.01 or rate > 0.95):
            self._log(f"warning: boundary rate has collapsed to {rate:.3f}; raise objective.rate_weight "
                      "or check model.target_rate")


def train(cfg: Config, resume: bool = False, quiet: bool = False) -> TrainResult:
    return Trainer(cfg, resume=resume, quiet=quiet).fit()
