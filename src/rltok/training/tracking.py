"""Where log records go: `metrics.jsonl` always, TensorBoard and Weights & Biases as extras
(docs/CONFIG.md, "What a run writes"); every sink gets the same record."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rltok.config import Config, ConfigError
from rltok.config.files import open_own, parse_lines, read_text, write_own

INSTALL_HINT = "pip install 'rltok[track]'"
METRICS_LIMIT = 1 << 30  # a record per logged step: far more than the longest run logs


def read_metrics(path: Path, up_to_step: int | None = None) -> list[dict]:
    """Records of a metrics.jsonl, optionally only those at or before `up_to_step`. A torn last
    line (the process died while writing it) is dropped."""
    if not path.is_file():
        return []
    # a damaged line (torn, nested too deeply, a number too long) is skipped like a torn last one
    lines = parse_lines(read_text(path, "metrics file", limit=METRICS_LIMIT, decode_errors="replace"))
    return [rec for rec in lines if isinstance(rec, dict) and (up_to_step is None or _step(rec) <= up_to_step)]


def _step(rec: dict) -> float:
    step = rec.get("step", 0)
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) else float("inf")


def scalars(rec: dict) -> dict[str, float]:
    """The record's numbers, step left out (it is the x axis)."""
    return {k: v for k, v in rec.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class JsonlSink:
    """metrics.jsonl: one consistent trajectory. A resumed run drops the records written after
    its checkpoint (it is about to log those steps again); a fresh run starts empty."""

    def __init__(self, run_dir: Path, step: int):
        path, tmp = run_dir / "metrics.jsonl", run_dir / "metrics.jsonl.tmp"
        self.history = read_metrics(path, step) if step else []
        write_own(tmp, "".join(json.dumps(r) + "\n" for r in self.history), "metrics file")
        os.replace(tmp, path)
        self.file = open_own(path, "a", "metrics file")

    def log(self, rec: dict) -> None:
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(f"train.tensorboard=true needs the tensorboard package: {INSTALL_HINT}") from None
    return SummaryWriter


def _wandb():
    try:
        import wandb
    except ImportError:
        raise ConfigError(f"train.wandb needs the wandb package: {INSTALL_HINT}") from None
    return wandb


def require(cfg: Config) -> None:
    """Fail at start-up, on every rank, when an asked-for sink's package is missing (rank 0
    alone opens the sinks, and the other ranks would wait for it forever)."""
    if cfg.train.tensorboard:
        _summary_writer()
    if cfg.train.wandb:
        _wandb()


class TensorBoardSink:
    def __init__(self, run_dir: Path, step: int):
        # a resumed run hides what the interrupted one logged after its checkpoint, as
        # metrics.jsonl drops those records
        self.writer = _summary_writer()(log_dir=str(run_dir / "tensorboard"), purge_step=step + 1 if step else None)

    def log(self, rec: dict) -> None:
        for k, v in scalars(rec).items():
            self.writer.add_scalar(k, v, rec["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run per training process, named after the run folder; a resumed run is a new
    W&B run in the same group, with `resumed_from_step` in its config."""

    def __init__(self, run_dir: Path, cfg: Config, step: int):
        wandb = _wandb()
        config = {**cfg.to_dict(), "resumed_from_step": step}
        # mode: WANDB_MODE or wandb's own settings decide (offline keeps the run local)
        try:
            self.run = wandb.init(project=cfg.train.wandb, dir=str(run_dir), name=run_dir.resolve().name,
                                  group=run_dir.resolve().name, config=config)
        except Exception as e:  # no login, no network, a bad project: wandb raises many types
            try:  # forget the failed start's settings: a later run in this process reads WANDB_* afresh
                wandb.teardown()
            except Exception:
                pass
            raise ConfigError(f"train.wandb={cfg.train.wandb}: W&B could not start a run ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}); run `wandb login`, set WANDB_MODE=offline, or "
                              "give train.wandb= (off) to train without it") from None

    def log(self, rec: dict) -> None:
        self.run.log(scalars(rec), step=rec["step"])

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """All sinks of a run, opened on rank 0 when training starts; `history` holds the records
    of the run so far (a resumed run's, up to its checkpoint)."""

    def __init__(self, run_dir: Path, cfg: Config, step: int):
        self.sinks = []
        try:
            jsonl = JsonlSink(run_dir, step)
            self.sinks.append(jsonl)
            self.history = jsonl.history
            if cfg.train.tensorboard:
                self.sinks.append(TensorBoardSink(run_dir, step))
            if cfg.train.wandb:
                self.sinks.append(WandbSink(run_dir, cfg, step))
        except BaseException:
            self.close()
            raise

    def log(self, rec: dict) -> None:
        for sink in self.sinks:
            sink.log(rec)

    def close(self) -> None:
        for sink in reversed(self.sinks):
            sink.close()
        self.sinks = []
