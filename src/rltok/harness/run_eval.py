"""`evaluate_run`: a trained run (or an exported model) measured on held-out windows, the one
path from a folder on disk to `rltok.eval.evaluate` that `rltok eval` and the compute-matched
comparison share. It loads through rltok.training.loading, so it sits above training."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from rltok.config import Config, ConfigError
from rltok.data.corpus import resolve_split, run_split_bytes
from rltok.data.python_tokens import looks_like_python
from rltok.data.windows import EvalWindows
from rltok.eval.evaluate import batch_sums, summarize
from rltok.model.chunkers.base import DECISION_MODES
from rltok.training.device import resolve_device
from rltok.training.loading import load_checkpoint, refuse_non_finite


@dataclass
class RunEvaluation:
    """What `evaluate_run` measured, and on what."""
    result: dict  # `evaluate`'s result with the decisions of `mode`
    greedy: dict | None  # the thresholded rule's, where asked for and the rule samples
    model: torch.nn.Module  # in eval mode
    config: Config  # the run's own
    checkpoint: Path  # the folder the weights came from
    data: str
    split: str  # the split evaluated (val where fallback_to_val stood in for a missing one)
    split_requested: str
    mode: str
    context: int
    forced_split: bool
    windows: EvalWindows  # the windows scored, read from the split's bytes when asked for

    @property
    def x(self) -> torch.Tensor:
        """The windows scored (N, T), all at once: inputs."""
        return self.windows.take()[0]

    @property
    def y(self) -> torch.Tensor:
        """And their next-byte targets (N, T)."""
        return self.windows.take()[1]

    def summary(self) -> dict:
        """The result with what it was measured on: what `rltok eval` prints (unrounded)."""
        out = {**self.result, "checkpoint": str(self.checkpoint), "data": self.data, "split": self.split,
               "seq_len": self.windows.seq_len, "mode": self.mode, "context": self.context,
               "forced_split": self.forced_split}
        if self.split != self.split_requested:
            out["split_requested"] = self.split_requested
        return out


def evaluate_run(path: str | Path, data: str | None = None, split: str = "test", *, fallback_to_val: bool = False,
                 max_bytes: int = 0, seq_len: int | None = None, max_windows: int = 0, context: int = 1,
                 batch_size: int = 8, mode: str = "sample", seed: int = 0, device: str | torch.device = "cpu",
                 code_metrics: bool | None = None, forced_split: bool = True, greedy: bool = False,
                 progress: bool = False) -> RunEvaluation:
    """Evaluate the model in `path` (a run folder's newest valid checkpoint, a checkpoint or an
    exported model folder) on `split` of `data` (default: the corpus the run trained on, held
    out exactly as training held it out: its data.val, data.max_bytes cap and split rule), the
    first `max_bytes` of that split (0: all of it), in windows of `seq_len` bytes (default: its
    training length); the split's last bytes that fill no whole window (fewer than one stride)
    are not scored. `fallback_to_val`: val where the data has no such split. `code_metrics`: the Python-token
    alignment (default: where the data is Python source). `greedy`: also evaluate the thresholded
    decisions where the rule samples. `progress`: a bar of windows on stderr. The rest are
    `evaluate`'s (rltok.eval.evaluate)."""
    for name, value, low in (("batch_size", batch_size, 1), ("max_windows", max_windows, 0),
                             ("max_bytes", max_bytes, 0), ("seq_len", seq_len or 1, 1),
                             ("context", 1 if context is None else context, 1)):
        if not isinstance(value, int) or value < low:  # before anything loads
            raise ConfigError(f"{name} must be a whole number >= {low}, got {value!r}")
    if mode not in DECISION_MODES:  # before the model loads
        raise ConfigError(f"mode must be 'sample' or 'greedy', got {mode!r}")
    if data is not None:  # a wrong split fails before the model loads
        resolve_split(data, split, fallback_to_val)
    device = resolve_device(device)
    model, cfg, _, ckpt = load_checkpoint(path, device=device)
    refuse_non_finite(model, ckpt)
    model.eval()
    if seq_len and seq_len > cfg.model.max_seq_len:  # refused before the data is read
        raise ConfigError(f"a window of {seq_len} bytes exceeds the model's max_seq_len={cfg.model.max_seq_len}: "
                          f"give a seq_len of at most that")
    spec = data or cfg.data.train
    used = resolve_split(spec, split, fallback_to_val)
    text = run_split_bytes(cfg.data, used, max_bytes, source=spec)
    # a batch of windows at a time: memory for the split's bytes and one batch, whatever its length
    windows = EvalWindows(text, seq_len or cfg.train.seq_len, max_windows, context=context)
    code = code_metrics if code_metrics is not None else looks_like_python(spec)
    options = dict(seed=seed, device=device, code_metrics=code, context=context, forced_split=forced_split)
    def batches(what: str):
        return tqdm(windows.batches(batch_size), desc=what, total=-(-len(windows) // batch_size), unit="batch",
                    disable=not progress, leave=False, file=sys.stderr)

    result = summarize(batch_sums(model, batches(f"eval {used}"), mode=mode, **options))
    rule = getattr(model, "chunker", None)
    thresholded = None
    if greedy and rule is not None and rule.stochastic:
        thresholded = summarize(batch_sums(model, batches(f"eval {used}, greedy"), mode="greedy", **options))
    return RunEvaluation(result, thresholded, model, cfg, ckpt, spec, used, split, mode, context, forced_split,
                         windows)
