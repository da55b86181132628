"""What a log record holds and what the user is told: the per-step metrics averaged over the
steps since the last record, throughput and MFU; messages, warnings (rate collapse) and the
progress bar. Where records are written is rltok.training.tracking."""

from __future__ import annotations

import sys
import time

import torch
from tqdm import tqdm

from rltok.training import distributed as ddp
from rltok.training.peak import PeakFlops

# record keys that depend on wall-clock time (everything else is reproducible run to run)
TIMING_KEYS = ("bytes_per_s", "flops_per_s", "mfu", "peak_flops", "mfu_note")


class IntervalMeter:
    """Per-step metric sums since the last record (saved with the trainer state), with its clock and bytes."""

    def __init__(self, dist: ddp.DistInfo, device: torch.device, seq_len: int, cost):
        self.dist, self.device = dist, device
        self.cost = cost.at(seq_len)  # what the model costs (the trainer's ModelCost)
        self.sums: dict[str, torch.Tensor] = {}
        self.n = 0
        self.t_last = time.perf_counter()
        self.bytes_last = 0
        self.flops_last: float | None = None  # train_flops at the interval's start (None: not known yet)

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.n += 1

    def restart_clock(self, bytes_seen: int | None = None, train_flops: float | None = None) -> None:
        """Time from here on: so that validation and checkpoint time stay out of bytes/s."""
        self.t_last = time.perf_counter()
        if bytes_seen is not None:
            self.bytes_last = bytes_seen
        if train_flops is not None:
            self.flops_last = train_flops

    def record(self, step: int, bytes_seen: int, lr: float, train_flops: float, peak: PeakFlops) -> dict:
        """The interval's record (global means under data parallelism), then a new interval
        starts; `mfu` is None where the peak is not trusted, `mfu_note` says why, once."""
        now = time.perf_counter()
        if self.dist.enabled:
            rec = {k: v / self.n for k, v in ddp.mean_of_sums(self.sums, self.dist, self.device).items()}
        else:
            rec = {k: float(v) / self.n for k, v in self.sums.items()}
        rec.update(train_flops=train_flops, step=step, bytes=bytes_seen, lr=lr,
                   bytes_per_s=(bytes_seen - self.bytes_last) / max(1e-9, now - self.t_last))
        # MFU: the FLOPs the interval charged (counterfactual passes and tokenizer-phase steps as
        # charged) per second against the peak of all devices; before the first known charge, the
        # analytical FLOPs/byte of a full step x bytes/s
        if self.flops_last is not None:
            rec["flops_per_s"] = (train_flops - self.flops_last) / max(1e-9, now - self.t_last)
        else:
            fpb = self.cost.step_train_per_byte(rec.get("chunks_per_byte"), rec.get("supertokens_per_chunk"))
            rec["flops_per_s"] = fpb * rec["bytes_per_s"]
        rec["mfu"], note = peak.mfu(rec["flops_per_s"], self.dist.world_size)
        rec.update(peak_flops=peak.flops, peak_source=peak.source)
        if note:
            rec["mfu_note"] = note
        self.t_last, self.bytes_last, self.flops_last, self.sums, self.n = now, bytes_seen, train_flops, {}, 0
        return rec


COLLAPSE_ADVICE = {
    "low": "the policy has stopped drawing boundaries, so the main network sees almost no chunks; "
           "raise objective.rate.weight, lower objective.pg_weight or train.lr",
    "high": "the policy puts a boundary on almost every byte (no compression); "
            "raise objective.rate.weight so the rate loss can hold model.target_rate",
}


class Reporter:
    """Messages on stderr (none when quiet: under data parallelism rank 0 alone reports), the
    warning count that every record carries, and the progress bar."""

    collapse_patience = 3  # consecutive logged records with a collapsed rate before warning

    def __init__(self, cfg, quiet: bool):
        self.cfg = cfg
        self.quiet = quiet
        self.warnings = 0  # rate collapses, failed periodic checkpoints
        self.collapse_streak = 0
        self.notes: list[str] = []  # everything note() said, also when quiet
        self.interactive = False
        self.bar = None

    def log(self, msg: str) -> None:
        if not self.quiet:
            tqdm.write(msg, file=sys.stderr)

    def note(self, msg: str) -> None:
        """Something the user should know that is no warning (the count in every record stays)."""
        self.notes.append(msg)
        self.log(msg)

    def warn(self, msg: str) -> None:
        self.warnings += 1
        self.log(msg)

    def check_rate(self, rec: dict, step: int) -> None:
        """Warn (once per episode) when the boundary policy stays collapsed at rate ~0 or ~1."""
        p = rec.get("p_mean")  # mean boundary probability over free positions; RL chunker only
        target, kind = self.cfg.model.target_rate, None
        if p is not None and step > 2 * self.cfg.train.warmup_steps:  # an extreme the target does not ask for
            kind = "low" if p < 0.01 and target >= 0.05 else "high" if p > 0.95 and target <= 0.9 else None
        if kind is None:
            self.collapse_streak = 0
            return
        self.collapse_streak += 1
        if self.collapse_streak == self.collapse_patience:
            self.warn(f"warning: boundary rate collapsed {kind} at step {step} (mean p {p:.3f}, "
                      f"target {target}): {COLLAPSE_ADVICE[kind]}")

    def open_bar(self, step: int) -> None:
        """A live bar on a terminal; elsewhere each record is one line."""
        self.interactive = sys.stderr.isatty() and not self.quiet
        self.bar = tqdm(total=self.cfg.train.max_steps, initial=step, disable=not self.interactive, unit="step",
                        dynamic_ncols=True)

    def advance(self) -> None:
        self.bar.update(1)

    def show(self, rec: dict) -> None:
        parts = [f"loss {rec['loss']:.3f}", f"bpb {rec['bpb']:.3f}"]
        if "val_bpb" in rec:
            parts.append(f"val_bpb {rec['val_bpb']:.3f}")
        if "rate" in rec:
            parts.append(f"rate {rec['rate']:.3f}")
        parts.append(f"{rec['bytes_per_s'] / 1e3:.1f}k B/s")
        if rec.get("mfu") is not None:  # None: the peak is not trusted (said once, by mfu_note)
            parts.append(f"MFU {100 * rec['mfu']:.1f}%")
        if "mfu_note" in rec:
            self.note(rec["mfu_note"])
        text = " | ".join(parts)
        if self.interactive:
            self.bar.set_postfix_str(text)
            if "val_bpb" in rec:
                self.log(f"step {rec['step']}: {text}")
        else:
            self.log(f"step {rec['step']}/{self.cfg.train.max_steps}: {text}")

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
